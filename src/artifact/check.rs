//! Checking a producer's artifact before a consumer gets it: its listing read (and,
//! when a digest was handed over from the producer's job, checked against it), made by
//! a run of the consumer's [`Key`], and every entry of its `files/` a folder or a
//! regular file of one name (no link, FIFO, device or hard link), walked without
//! following a link, each file's size and sha256 what the listing says, nothing more
//! and nothing less.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{ArtifactError, FILES, Key, LISTING, Listing, MAX_FILES, MAX_LISTING_BYTES, STORE};
use crate::nofollow::Folder;

/// A producer's artifact, checked.
#[derive(Debug, Clone)]
pub struct Verified {
    pub producer: String,
    /// Its `files/` folder, where the run found it.
    pub files: PathBuf,
    /// The digest of its `listing.json`.
    pub digest: String,
    pub count: usize,
    pub bytes: u64,
}

/// Checks the artifact of `producer` in the store of the reports folder `reports` for
/// `consumer` (`batch B` or `this job`, named in errors), a run of `key`; `expected`: the listing's digest
/// handed over from the producer's job.
pub fn verify(
    reports: &Path,
    producer: &str,
    consumer: &str,
    key: &Key,
    expected: Option<&str>,
) -> Result<Verified, ArtifactError> {
    let store = reports.join(STORE);
    let missing = || ArtifactError::Missing {
        consumer: consumer.to_string(),
        producer: producer.to_string(),
        store: store.display().to_string(),
    };
    let changed = |why: String| ArtifactError::Changed {
        producer: producer.to_string(),
        why,
    };
    let open = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => missing(),
        _ => changed(crate::nofollow::said_of_links(e).to_string()),
    };
    let folder = Folder::open(reports)
        .and_then(|r| r.open_dir(STORE))
        .and_then(|s| s.open_dir(producer))
        .map_err(open)?;
    let mut bytes = Vec::new();
    folder
        .open_file(LISTING)
        .map_err(open)?
        .take(MAX_LISTING_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| changed(format!("{LISTING}: {e}")))?;
    if bytes.len() as u64 > MAX_LISTING_BYTES {
        return Err(changed(format!(
            "{LISTING} is larger than {MAX_LISTING_BYTES} bytes"
        )));
    }
    let digest = super::digest_of(&bytes);
    if let Some(want) = expected
        && want != digest
    {
        return Err(ArtifactError::Digest {
            producer: producer.to_string(),
            found: digest,
            expected: want.to_string(),
        });
    }
    let listing: Listing = serde_json::from_slice(&bytes)
        .map_err(|e| changed(format!("{LISTING} cannot be read: {e}")))?;
    if listing.batch != producer {
        return Err(changed(format!(
            "{LISTING} is batch {}'s",
            crate::util::escape(&listing.batch)
        )));
    }
    if listing.key != *key {
        return Err(ArtifactError::Foreign {
            producer: producer.to_string(),
            theirs: listing.key,
            ours: key.clone(),
        });
    }
    let files = folder.open_dir(FILES).map_err(open)?;
    let mut want: BTreeMap<&str, &super::FileDigest> =
        listing.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let folders: BTreeSet<&str> = listing.folders.iter().map(String::as_str).collect();
    let mut seen = 0usize;
    walk(&files, Path::new(""), &mut |rel, kind, f| {
        seen += 1;
        if seen > MAX_FILES {
            return Err(format!("holds more than {MAX_FILES} entries"));
        }
        let shown = crate::util::escape(rel).to_string();
        match kind {
            Kind::Folder if folders.contains(rel) => Ok(()),
            Kind::Folder => Err(format!("folder `{shown}` is not in its listing")),
            Kind::File => {
                let Some(d) = want.remove(rel) else {
                    return Err(format!("`{shown}` is not in its listing"));
                };
                check_file(f, rel, d)
            }
            Kind::Other(what) => Err(format!("`{shown}` is {what}, not a regular file")),
        }
    })
    .map_err(changed)?;
    if let Some(gone) = want.keys().next() {
        return Err(changed(format!(
            "`{}` of its listing is missing",
            crate::util::escape(gone)
        )));
    }
    Ok(Verified {
        producer: producer.to_string(),
        files: store.join(producer).join(FILES),
        digest,
        count: listing.files.len(),
        bytes: listing.files.iter().map(|f| f.size).sum(),
    })
}

/// The digest of the artifact's listing as it stands, unchecked beyond being read.
pub fn listing_digest(reports: &Path, producer: &str) -> std::io::Result<String> {
    let folder = Folder::open(reports)?.open_dir(STORE)?.open_dir(producer)?;
    let mut bytes = Vec::new();
    folder
        .open_file(LISTING)?
        .take(MAX_LISTING_BYTES + 1)
        .read_to_end(&mut bytes)?;
    Ok(super::digest_of(&bytes))
}

enum Kind {
    Folder,
    File,
    Other(&'static str),
}

type Visit<'a> = dyn FnMut(&str, Kind, &Folder) -> Result<(), String> + 'a;

/// Every entry below `dir` (at `rel`), parents first, none followed.
fn walk(dir: &Folder, rel: &Path, visit: &mut Visit<'_>) -> Result<(), String> {
    if rel.components().count() > 32 {
        return Err("is deeper than 32 folders".into());
    }
    for name in dir.names().map_err(|e| e.to_string())? {
        let path = rel.join(&name);
        let text = path.to_string_lossy().into_owned();
        use rustix::fs::FileType as T;
        let kind = match dir.kind(&name).map_err(|e| e.to_string())? {
            Some(T::Directory) => Kind::Folder,
            Some(T::RegularFile) => Kind::File,
            Some(T::Symlink) => Kind::Other("a symlink"),
            Some(T::Fifo) => Kind::Other("a FIFO"),
            Some(T::CharacterDevice | T::BlockDevice) => Kind::Other("a device"),
            Some(T::Socket) => Kind::Other("a socket"),
            _ => Kind::Other("not a regular file"),
        };
        let is_folder = matches!(kind, Kind::Folder);
        visit(&text, kind, dir)?;
        if is_folder {
            let inner = dir.open_dir(&name).map_err(|e| e.to_string())?;
            walk(&inner, &path, visit)?;
        }
    }
    Ok(())
}

/// The file `rel` (in `dir`, by its last name) is one name of one regular file, of
/// the listing's size and digest.
fn check_file(dir: &Folder, rel: &str, d: &super::FileDigest) -> Result<(), String> {
    let shown = crate::util::escape(rel).to_string();
    let name = Path::new(rel)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let mut file = dir.open_file(name).map_err(|e| format!("`{shown}`: {e}"))?;
    let md = file.metadata().map_err(|e| format!("`{shown}`: {e}"))?;
    if md.nlink() > 1 {
        return Err(format!(
            "`{shown}` has {} names (a hard link): refused",
            md.nlink()
        ));
    }
    if md.len() != d.size {
        return Err(format!(
            "`{shown}` is {} bytes, its listing says {}",
            md.len(),
            d.size
        ));
    }
    let found = super::take::copy_hashed(&mut file, &mut std::io::sink())
        .map_err(|e| format!("`{shown}`: {e}"))?;
    if found != d.sha256 {
        return Err(format!(
            "`{shown}` has digest {found}, its listing says {}",
            d.sha256
        ));
    }
    Ok(())
}
