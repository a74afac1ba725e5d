//! Taking a batch's `outputs` out of the tar stream of a folder of its container (the
//! engine's archive API, read while the container lives) into the store, each file
//! hashed as it is written. Only regular files and folders are taken; anything else a
//! pattern selects (a symlink, a hard link, a FIFO, a device, a socket) refuses the
//! whole output, and so does a stream past the size bound: the batch then fails and
//! the store keeps nothing of it.

use std::io::{Read, Write};
use std::path::{Component, Path};

use super::{FileDigest, Listing, MAX_FILES};
use crate::nofollow::Folder;

/// Where a relative `outputs` pattern is: the batch's source.
pub const SOURCE_DIR: &str = "/work";

/// Folders an output may not be read from.
const NOT_FROM: [&str; 4] = ["/proc", "/sys", "/dev", super::MOUNT_ROOT];

/// One `outputs` pattern: a folder of the container, and a name or glob in it.
#[derive(Debug, Clone)]
pub struct OutputSpec {
    /// As the manifest wrote it.
    pub pattern: String,
    /// The folder whose archive is read, absolute in the container.
    pub dir: String,
    name: globset::GlobMatcher,
}

impl OutputSpec {
    /// `pattern`: a path relative to the source (`/work`) or absolute in the container,
    /// without `..`; its last name may be a glob (`*`, `?`, `[…]`), the folders before
    /// it may not. Why it is refused, when it is.
    pub fn parse(pattern: &str) -> Result<OutputSpec, String> {
        let bad = |why: &str| Err(format!("`{}`: {why}", pattern.escape_debug()));
        if pattern.trim().is_empty() {
            return bad("is empty");
        }
        if pattern.len() > 4096 {
            return bad("is longer than 4096 bytes");
        }
        if pattern.chars().any(char::is_control) {
            return bad("holds a control character");
        }
        let full = if pattern.starts_with('/') {
            pattern.to_string()
        } else {
            format!("{SOURCE_DIR}/{pattern}")
        };
        let parts: Vec<&str> = full
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        if parts.contains(&"..") {
            return bad("holds `..`: name the path itself");
        }
        let Some((last, folders)) = parts.split_last() else {
            return bad("names `/`: name files or folders in a folder");
        };
        if folders.is_empty() {
            return bad("names something at `/`: name files in a folder below it");
        }
        let glob_char = |c: char| matches!(c, '*' | '?' | '[' | ']' | '{' | '}');
        if folders.iter().any(|f| f.contains(glob_char)) {
            return bad("has a glob in a folder's name: only the last name may be a glob");
        }
        let dir = format!("/{}", folders.join("/"));
        if NOT_FROM
            .iter()
            .any(|n| dir == *n || dir.starts_with(&format!("{n}/")))
        {
            return bad("lies under /proc, /sys, /dev or /artifacts");
        }
        let name = globset::GlobBuilder::new(last)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| format!("`{}`: {e}", pattern.escape_debug()))?
            .compile_matcher();
        Ok(OutputSpec {
            pattern: pattern.to_string(),
            dir,
            name,
        })
    }
}

/// What the outputs took so far, against the bound.
#[derive(Debug)]
pub struct Taken {
    /// The most bytes the batch may output (the host's `artifacts.max_size`).
    pub max: u64,
    pub bytes: u64,
    pub entries: usize,
}

/// The archive, bounded: no more than the bound and the headers of [`MAX_FILES`]
/// entries are read, whatever the entries claim (sparse files claim any size).
struct Bounded<'a, R> {
    inner: R,
    left: u64,
    stop: &'a dyn Fn() -> Option<String>,
}

impl<R: Read> Read for Bounded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(why) = (self.stop)() {
            return Err(std::io::Error::other(why));
        }
        if self.left == 0 {
            return Err(std::io::Error::other("the archive is longer than allowed"));
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Removes what an earlier run left as `batch`'s artifact in `reports` (held open):
/// a producer that fails or is refused leaves none to be found.
pub fn forget(reports: &Folder, batch: &str) -> std::io::Result<()> {
    match reports.open_dir(super::STORE) {
        Ok(store) => {
            store.remove(batch)?;
            store.remove(&staging(batch))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn staging(batch: &str) -> String {
    format!(".{batch}.partial")
}

/// Makes `listing.batch`'s artifact in `reports`: `fill` takes the outputs into the
/// `files/` folder it is given (with [`take`]); only when all were taken is the listing
/// written and the folder renamed into place. Gives the listing's digest, or why
/// the output was refused (one line), nothing of it left.
pub fn produce(
    reports: &Folder,
    mut listing: Listing,
    fill: impl FnOnce(&Folder, &mut Listing) -> Result<(), String>,
) -> Result<String, String> {
    let batch = listing.batch.clone();
    let io = |e: std::io::Error| format!("artifact store: {e}");
    let store = reports.make_dir(super::STORE, 0o755).map_err(io)?;
    let partial = staging(&batch);
    store.remove(&batch).map_err(io)?;
    store.remove(&partial).map_err(io)?;
    let result = (|| {
        let folder = store.make_dir(&partial, 0o755).map_err(io)?;
        let files = folder.make_dir(super::FILES, 0o755).map_err(io)?;
        fill(&files, &mut listing)?;
        let text = serde_json::to_vec_pretty(&listing).map_err(|e| e.to_string())?;
        folder
            .create_new(super::LISTING, 0o644)
            .and_then(|mut f| f.write_all(&text))
            .map_err(io)?;
        store.rename(&partial, &batch).map_err(io)?;
        Ok(super::digest_of(&text))
    })();
    if result.is_err() {
        let _ = store.remove(&partial);
    }
    result
}

/// Takes what `spec` selects from `archive` (the tar stream of `spec.dir`) into
/// `files`, adding each file and folder to `listing`. Why the output is refused, in
/// one line, when it is.
pub fn take(
    archive: impl Read,
    spec: &OutputSpec,
    files: &Folder,
    listing: &mut Listing,
    taken: &mut Taken,
    stop: &dyn Fn() -> Option<String>,
) -> Result<(), String> {
    let refuse = |why: String| format!("output `{}`: {why}", spec.pattern.escape_debug());
    let bounded = Bounded {
        inner: archive,
        left: taken.max.saturating_sub(taken.bytes) + 6144 * (MAX_FILES as u64 + 2),
        stop,
    };
    let mut archive = tar::Archive::new(bounded);
    let entries = archive
        .entries()
        .map_err(|e| refuse(format!("{} could not be read: {e}", spec.dir)))?;
    let mut matched = 0usize;
    for entry in entries {
        let mut entry =
            entry.map_err(|e| refuse(format!("{} could not be read: {e}", spec.dir)))?;
        let raw = entry
            .path()
            .map_err(|e| refuse(format!("an entry with an unreadable name: {e}")))?
            .into_owned();
        let kind = entry.header().entry_type();
        let Some(rel) = below_top(&raw).map_err(&refuse)? else {
            // The folder itself: it must be one (a link in its place is refused).
            if !kind.is_dir() {
                return Err(refuse(format!(
                    "{} is {}, not a folder",
                    spec.dir,
                    what(kind)
                )));
            }
            continue;
        };
        let first = rel.components().next().and_then(|c| c.as_os_str().to_str());
        if !first.is_some_and(|n| spec.name.is_match(n)) {
            continue;
        }
        matched += 1;
        taken.entries += 1;
        if taken.entries > MAX_FILES {
            return Err(refuse(format!(
                "more than {MAX_FILES} files and folders: refused"
            )));
        }
        let shown = crate::util::escape(&rel.to_string_lossy()).to_string();
        let rel_text = rel.to_string_lossy().into_owned();
        if kind.is_dir() {
            files
                .make_path(&rel, 0o755)
                .map_err(|e| refuse(format!("`{shown}`: {e}")))?;
            listing.folders.push(rel_text);
            continue;
        }
        if !kind.is_file() {
            return Err(refuse(format!(
                "`{shown}` is {}, not a regular file: refused",
                what(kind)
            )));
        }
        let size = entry.size();
        if size > taken.max - taken.bytes {
            return Err(refuse(format!(
                "`{shown}` ({size} bytes) takes the batch's outputs past {} bytes (the host policy's artifacts.max_size): refused",
                taken.max
            )));
        }
        let parent = files
            .make_path(rel.parent().unwrap_or(Path::new("")), 0o755)
            .map_err(|e| refuse(format!("`{shown}`: {e}")))?;
        let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
        let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let mut file = parent
            .create_new(name, if executable { 0o755 } else { 0o644 })
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => refuse(format!(
                    "`{shown}` is selected twice (two patterns take it)"
                )),
                _ => refuse(format!("`{shown}`: {e}")),
            })?;
        let sha256 = copy_hashed(&mut (&mut entry).take(size), &mut file)
            .map_err(|e| refuse(format!("`{shown}` broke off: {e}")))?;
        taken.bytes += size;
        listing.files.push(FileDigest {
            path: rel_text,
            size,
            sha256,
        });
    }
    if matched == 0 {
        return Err(refuse(format!("matched nothing in {}", spec.dir)));
    }
    Ok(())
}

/// Copies `from` into `to`, giving the sha256 of what it copied.
pub(super) fn copy_hashed(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<String> {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        to.write_all(&buf[..n])?;
    }
    Ok(format!("sha256:{}", crate::util::hex(&hash.finalize())))
}

/// What an entry that is not a regular file is.
fn what(kind: tar::EntryType) -> &'static str {
    if kind.is_symlink() {
        "a symlink"
    } else if kind.is_hard_link() {
        "a hard link"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_character_special() || kind.is_block_special() {
        "a device"
    } else if kind.is_file() {
        "a file"
    } else {
        "not a regular file"
    }
}

/// The path of an entry below the archive's top folder; `None` for the top folder.
fn below_top(raw: &Path) -> Result<Option<std::path::PathBuf>, String> {
    let shown = crate::util::escape(&raw.to_string_lossy()).to_string();
    let mut parts = Vec::new();
    for (i, c) in raw.components().enumerate() {
        match c {
            Component::Normal(n) if i > 0 => parts.push(
                n.to_str()
                    .ok_or_else(|| format!("`{shown}`: not a UTF-8 name"))?,
            ),
            Component::Normal(_) | Component::CurDir => {}
            _ => return Err(format!("`{shown}`: leaves the folder")),
        }
    }
    if parts.len() > 32 {
        return Err(format!("`{shown}`: deeper than 32 folders"));
    }
    Ok((!parts.is_empty()).then(|| parts.iter().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        dir.set_cksum();
        b.append_data(&mut dir, "dist/", std::io::empty()).unwrap();
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, body: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(body.len() as u64);
        h.set_cksum();
        b.append_data(&mut h, path, body).unwrap();
    }

    fn special(b: &mut tar::Builder<Vec<u8>>, path: &str, kind: tar::EntryType) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o777);
        if kind.is_symlink() || kind.is_hard_link() {
            h.set_link_name("/etc/passwd").unwrap();
        }
        h.set_cksum();
        b.append_data(&mut h, path, std::io::empty()).unwrap();
    }

    fn listing() -> Listing {
        Listing {
            schema: 1,
            project: "p".into(),
            batch: "b".into(),
            key: super::super::Key::new("local".into(), false),
            outputs: vec![],
            folders: vec![],
            files: vec![],
        }
    }

    fn run(tar: &[u8], pattern: &str, max: u64) -> (Result<(), String>, Listing) {
        let dest = tempfile::tempdir().unwrap();
        let mut l = listing();
        let mut taken = Taken {
            max,
            bytes: 0,
            entries: 0,
        };
        let r = take(
            tar,
            &OutputSpec::parse(pattern).unwrap(),
            &Folder::open(dest.path()).unwrap(),
            &mut l,
            &mut taken,
            &|| None,
        );
        (r, l)
    }

    #[test]
    fn a_glob_takes_the_files_it_matches_with_their_digests() {
        let tar = archive(|b| {
            file(b, "dist/a.whl", b"wheel");
            file(b, "dist/notes.txt", b"no");
        });
        let (r, l) = run(&tar, "dist/*.whl", 1 << 20);
        r.unwrap();
        assert_eq!(l.files.len(), 1);
        assert_eq!(l.files[0].path, "a.whl");
        assert_eq!(l.files[0].sha256, super::super::digest_of(b"wheel"));
    }

    #[test]
    fn anything_but_a_regular_file_is_refused() {
        for (kind, said) in [
            (tar::EntryType::Symlink, "a symlink"),
            (tar::EntryType::Link, "a hard link"),
            (tar::EntryType::Fifo, "a FIFO"),
            (tar::EntryType::Char, "a device"),
        ] {
            let tar = archive(|b| special(b, "dist/x.whl", kind));
            let (r, _) = run(&tar, "dist/*.whl", 1 << 20);
            let why = r.unwrap_err();
            assert!(why.contains(&format!("`x.whl` is {said}")), "{why}");
        }
    }

    #[test]
    fn the_bound_and_an_empty_match_refuse() {
        let tar = archive(|b| file(b, "dist/a.whl", &[b'x'; 100]));
        let why = run(&tar, "dist/*.whl", 50).0.unwrap_err();
        assert!(why.contains("past 50 bytes"), "{why}");
        let why = run(&tar, "dist/*.tar.gz", 1 << 20).0.unwrap_err();
        assert!(why.contains("matched nothing in /work/dist"), "{why}");
        let tar = {
            let mut b = tar::Builder::new(Vec::new());
            special(&mut b, "dist", tar::EntryType::Symlink);
            b.into_inner().unwrap()
        };
        let why = run(&tar, "dist/*.whl", 1 << 20).0.unwrap_err();
        assert!(
            why.contains("/work/dist is a symlink, not a folder"),
            "{why}"
        );
    }

    #[test]
    fn patterns_are_checked() {
        for (p, said) in [
            ("", "is empty"),
            ("../x", "holds `..`"),
            ("*/x.whl", "only the last name"),
            ("/proc/self/x", "/proc"),
            ("/x", "at `/`"),
        ] {
            let why = OutputSpec::parse(p).unwrap_err();
            assert!(why.contains(said), "{p}: {why}");
        }
        let s = OutputSpec::parse("sgl-kernel/dist/*.whl").unwrap();
        assert_eq!(s.dir, "/work/sgl-kernel/dist");
        assert_eq!(OutputSpec::parse("/tmp/w/x").unwrap().dir, "/tmp/w");
    }
}
