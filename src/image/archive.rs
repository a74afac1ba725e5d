//! docker-archives read without an engine: what `docker save` writes, what Nix's
//! `dockerTools` stream, what `docker load` takes.
//!
//! An image's ID on the engine's classic image store is the SHA-256 of its config
//! JSON, byte for byte; an archive names that file in its `manifest.json`. So the ID
//! follows from the archive alone, and cibox reads it from a stream in one pass, in
//! bounded memory: every file is hashed as it passes, and only `manifest.json` and
//! `index.json` are kept (at most 1 MiB each). On a containerd image store the engine
//! names an image by the digest of its OCI manifest instead; an archive carries that
//! only when it holds an OCI `index.json` (as Docker 25 and later save).

use std::collections::BTreeMap;
use std::io::Read;

use sha2::{Digest, Sha256};

use super::ImageId;
use crate::util::hex;

/// The most `manifest.json` or `index.json` may hold.
const MAX_INDEX_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{0}: not a docker-archive ({1})")]
    NotArchive(String, String),
    #[error("{0}: holds {1} images; give an archive of one (docker save ID)")]
    ManyImages(String, usize),
    #[error("{0}: truncated or incomplete ({1}); make the archive again")]
    Incomplete(String, String),
    #[error("{0}: {1}")]
    Altered(String, String),
    #[error("{0}: {1}")]
    Io(String, String),
}

impl crate::error::ErrorKind for ArchiveError {
    /// An archive someone handed cibox is input: bad input is a usage error; one
    /// that cannot be read or written here is the host's.
    fn failure(&self) -> crate::exit::Failure {
        match self {
            ArchiveError::Io(..) => crate::exit::Failure::Infra,
            _ => crate::exit::Failure::Usage,
        }
    }
}

/// One image of an archive, as its files say.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArchiveImage {
    /// The config's digest: the image ID on a classic image store.
    pub id: ImageId,
    /// The digest of the OCI manifest (the ID on a containerd image store), when the
    /// archive has an `index.json` naming one.
    pub manifest_digest: Option<String>,
    pub repo_tags: Vec<String>,
    /// The layer files, in order.
    pub layers: Vec<String>,
}

impl ArchiveImage {
    /// What `image id --json` prints; `pinned` the ID the manifest pins, if any.
    pub fn to_json(&self, pinned: Option<&str>) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "manifest_digest": self.manifest_digest,
            "repo_tags": self.repo_tags,
            "layers": self.layers.len(),
            "pinned": pinned,
        })
    }

    /// What the ID names on which image store, in one line.
    pub fn which_store(&self) -> String {
        match &self.manifest_digest {
            Some(d) => format!(
                "on a containerd image store the engine names this image {d} (its manifest digest)"
            ),
            None => "the ID on a classic image store; a containerd image store names images by their manifest digest, which this archive does not carry".into(),
        }
    }
}

/// One image of `manifest.json`, with exactly the keys docker writes: an unknown key,
/// or a known one in other case (which Go's JSON would take for it), is refused.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
    #[serde(rename = "LayerSources", default)]
    #[allow(dead_code)]
    layer_sources: Option<serde_json::Value>,
}

/// The hex digest a file's name claims: `<hex>.json` (legacy) or `blobs/sha256/<hex>`.
fn claimed_digest(path: &str) -> Option<&str> {
    let name = path
        .strip_prefix("blobs/sha256/")
        .or_else(|| path.strip_suffix(".json"))?;
    (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())).then_some(name)
}

/// The most a GNU long name or a PAX header may hold.
const MAX_EXTENSION_BYTES: u64 = 64 * 1024;

/// A path as cibox accepts it in an archive: UTF-8, relative, every component a plain
/// name (no empty, `.` or `..` component), so that it names one file however a tar
/// reader cleans paths; a directory's one trailing `/` is dropped.
fn clean_path(raw: &[u8], dir: bool) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?;
    let text = if dir {
        text.strip_suffix('/').unwrap_or(text)
    } else {
        text
    };
    let ok = !text.is_empty()
        && text
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'));
    ok.then(|| text.to_string())
}

/// PAX records (`LEN KEY=VALUE\n`), refusing a key given twice.
fn pax_records(data: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut out = BTreeMap::new();
    for ext in tar::PaxExtensions::new(data) {
        let ext = ext.map_err(|e| format!("a PAX header is malformed ({e})"))?;
        let key = ext
            .key()
            .map_err(|_| "a PAX key is not UTF-8".to_string())?
            .to_string();
        if out
            .insert(key.clone(), ext.value_bytes().to_vec())
            .is_some()
        {
            return Err(format!("a PAX header gives `{key}` twice"));
        }
    }
    Ok(out)
}

/// Reads a docker-archive from `reader` (`from` names it in messages) and returns its
/// one image.
///
/// Strict on purpose: the ID printed must be the one `docker load` would load, and tar
/// readers disagree on the unusual (links replacing files, paths that clean to
/// another, sizes on links, duplicate PAX keys, sparse files, STAR and v7 headers). So
/// the archive may hold only what `docker save` and Nix's image streams write: plain
/// files and folders, relative symlinks (shared layers), each path once, written
/// plainly; PAX headers without `path`, `linkpath`, `size` or sparse keys, given once.
/// Anything else is refused, and memory stays bounded whatever the stream holds.
pub fn read_image(reader: impl Read, from: &str) -> Result<ArchiveImage, ArchiveError> {
    scan(reader, from)?.image(from)
}

/// What one pass over an archive found.
#[derive(Default)]
struct Contents {
    /// Every regular file's SHA-256, by its path in the archive.
    digests: BTreeMap<String, String>,
    /// Every symlink's target, by its path.
    links: BTreeMap<String, String>,
    /// `manifest.json` and `index.json`, kept whole (at most [`MAX_INDEX_BYTES`]).
    manifest: Option<Vec<u8>>,
    index: Option<Vec<u8>>,
    /// Whether the stream held any entry at all.
    seen_any: bool,
}

/// One pass over an archive under way: what it found so far, and the extension headers
/// that describe the entry to come.
struct Scan<'a> {
    /// The archive's name in messages.
    from: &'a str,
    contents: Contents,
    /// Every path so far: each may appear once.
    seen: std::collections::BTreeSet<String>,
    /// A PAX header waiting for its entry.
    pax: Option<BTreeMap<String, Vec<u8>>>,
    /// A GNU long name waiting for its entry.
    long_name: Option<Vec<u8>>,
}

/// Reads every entry of the archive, hashing each file as it passes.
fn scan(reader: impl Read, from: &str) -> Result<Contents, ArchiveError> {
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| not_archive(from, format!("not a tar stream: {e}")))?
        .raw(true);
    let mut scan = Scan {
        from,
        contents: Contents::default(),
        seen: Default::default(),
        pax: None,
        long_name: None,
    };
    for entry in entries {
        let entry = entry.map_err(|e| {
            if scan.contents.seen_any {
                ArchiveError::Incomplete(from.to_string(), e.to_string())
            } else {
                not_archive(from, format!("not a tar stream: {e}"))
            }
        })?;
        scan.contents.seen_any = true;
        scan.entry(entry)?;
    }
    if scan.pax.is_some() || scan.long_name.is_some() {
        return Err(ArchiveError::Incomplete(
            from.to_string(),
            "it ends after a header for an entry that never comes".into(),
        ));
    }
    Ok(scan.contents)
}

/// `from` is not a docker-archive, for the reason given.
fn not_archive(from: &str, why: String) -> ArchiveError {
    ArchiveError::NotArchive(from.to_string(), why)
}

impl Scan<'_> {
    fn not_archive(&self, why: String) -> ArchiveError {
        not_archive(self.from, why)
    }

    /// Takes one entry: an extension header for the next, a folder, a link or a file.
    fn entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<(), ArchiveError> {
        let header = entry.header().clone();
        self.check_format(&header)?;
        let kind = header.entry_type();
        let size = header
            .size()
            .map_err(|e| self.not_archive(format!("an entry's size: {e}")))?;
        if kind.is_pax_local_extensions() {
            return self.pax_header(&mut entry, size);
        }
        if kind.is_gnu_longname() {
            return self.long_name(&mut entry, size);
        }
        self.pax = None;
        let path = self.path_of(&header)?;
        if kind.is_dir() || kind.is_symlink() {
            return self.folder_or_link(&header, path, size);
        }
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            return Err(self.not_archive(format!(
                "`{path}` is neither a file, a folder nor a symlink (type {:?})",
                kind
            )));
        }
        self.file(&mut entry, path, size)
    }

    /// Only ustar and GNU headers, as `docker save` and Nix write them.
    fn check_format(&self, header: &tar::Header) -> Result<(), ArchiveError> {
        let raw = header.as_bytes();
        if header.as_ustar().is_none() && header.as_gnu().is_none() {
            return Err(self.not_archive(
                "an entry has an old (v7) tar header; docker save writes ustar".into(),
            ));
        }
        if &raw[508..512] == b"tar\0" {
            return Err(self.not_archive("an entry has a STAR header".into()));
        }
        Ok(())
    }

    /// The data of a long name or a PAX header (`what`), at most 64 KiB.
    fn read_small(
        &self,
        entry: &mut impl Read,
        size: u64,
        what: &str,
    ) -> Result<Vec<u8>, ArchiveError> {
        if size > MAX_EXTENSION_BYTES {
            return Err(self.not_archive(format!("{what} is larger than 64 KiB")));
        }
        let mut data = Vec::with_capacity(size as usize);
        entry
            .read_to_end(&mut data)
            .map_err(|e| ArchiveError::Incomplete(self.from.to_string(), format!("{what}: {e}")))?;
        Ok(data)
    }

    /// A PAX header for the next entry, without the keys tar readers apply differently.
    fn pax_header(&mut self, entry: &mut impl Read, size: u64) -> Result<(), ArchiveError> {
        if self.pax.is_some() {
            return Err(self.not_archive("two PAX headers describe one entry".into()));
        }
        let records = pax_records(&self.read_small(entry, size, "a PAX header")?)
            .map_err(|why| self.not_archive(why))?;
        if let Some(key) = records.keys().find(|k| {
            matches!(k.as_str(), "path" | "linkpath" | "size") || k.starts_with("GNU.sparse")
        }) {
            return Err(self.not_archive(format!(
                "a PAX header sets `{key}`, which tar readers apply differently"
            )));
        }
        self.pax = Some(records);
        Ok(())
    }

    /// A GNU long name for the next entry.
    fn long_name(&mut self, entry: &mut impl Read, size: u64) -> Result<(), ArchiveError> {
        if self.long_name.is_some() {
            return Err(self.not_archive("two long names describe one entry".into()));
        }
        let mut name = self.read_small(entry, size, "a long name")?;
        while name.last() == Some(&0) {
            name.pop();
        }
        self.long_name = Some(name);
        Ok(())
    }

    /// The entry's path (its long name, if one came before it): plain, relative, and
    /// not seen before.
    fn path_of(&mut self, header: &tar::Header) -> Result<String, ArchiveError> {
        let raw_path = match self.long_name.take() {
            Some(name) => name,
            None => header.path_bytes().into_owned(),
        };
        let Some(path) = clean_path(&raw_path, header.entry_type().is_dir()) else {
            return Err(self.not_archive(format!(
                "entry `{}` is not a plain relative path",
                String::from_utf8_lossy(&raw_path).escape_debug()
            )));
        };
        if !self.seen.insert(path.clone()) {
            return Err(self.not_archive(format!("`{path}` appears twice")));
        }
        Ok(path)
    }

    /// A folder or a symlink: no data; a link's target is kept.
    fn folder_or_link(
        &mut self,
        header: &tar::Header,
        path: String,
        size: u64,
    ) -> Result<(), ArchiveError> {
        if size != 0 {
            return Err(self.not_archive(format!(
                "`{path}` is a folder or link with a size ({size} bytes)"
            )));
        }
        if header.entry_type().is_symlink() {
            let target = header
                .link_name_bytes()
                .and_then(|t| std::str::from_utf8(&t).ok().map(str::to_string))
                .ok_or_else(|| self.not_archive(format!("link `{path}` has no UTF-8 target")))?;
            self.contents.links.insert(path, target);
        }
        Ok(())
    }

    /// A regular file: hashed as it passes, kept whole if it is `manifest.json` or
    /// `index.json`.
    fn file(&mut self, entry: &mut impl Read, path: String, size: u64) -> Result<(), ArchiveError> {
        let keep = matches!(path.as_str(), "manifest.json" | "index.json");
        if keep && size > MAX_INDEX_BYTES {
            return Err(self.not_archive(format!("{path} is larger than 1 MiB")));
        }
        let incomplete = |why: String| ArchiveError::Incomplete(self.from.to_string(), why);
        let mut hasher = Sha256::new();
        let mut kept = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut read = 0u64;
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| incomplete(format!("{path}: {e}")))?;
            if n == 0 {
                break;
            }
            read += n as u64;
            hasher.update(&buf[..n]);
            if keep {
                kept.extend_from_slice(&buf[..n]);
            }
        }
        if read != size {
            return Err(incomplete(format!(
                "{path} ends after {read} of its {size} bytes"
            )));
        }
        let contents = &mut self.contents;
        contents
            .digests
            .insert(path.clone(), hex(&hasher.finalize()));
        match path.as_str() {
            "manifest.json" => contents.manifest = Some(kept),
            "index.json" => contents.index = Some(kept),
            _ => {}
        }
        Ok(())
    }
}

impl Contents {
    /// The one image the archive's `manifest.json` lists, its config and layers checked
    /// against the files the archive holds.
    fn image(self, from: &str) -> Result<ArchiveImage, ArchiveError> {
        let one = self.manifest_entry(from)?;
        let Some(config_digest) = self.digests.get(&one.config) else {
            return Err(ArchiveError::Incomplete(
                from.to_string(),
                format!("its config {} is missing", one.config),
            ));
        };
        if let Some(claimed) = claimed_digest(&one.config)
            && claimed != config_digest
        {
            return Err(ArchiveError::Altered(
                from.to_string(),
                format!(
                    "its config {} has digest sha256:{config_digest}, not the one its name claims; the archive was altered",
                    one.config
                ),
            ));
        }
        self.check_layers(&one.layers, from)?;
        let id = ImageId::parse(&format!("sha256:{config_digest}"))
            .map_err(|e| not_archive(from, format!("config digest: {e}")))?;
        Ok(ArchiveImage {
            id,
            manifest_digest: self.manifest_digest(),
            repo_tags: one.repo_tags.unwrap_or_default(),
            layers: one.layers,
        })
    }

    /// The one entry of `manifest.json`.
    fn manifest_entry(&self, from: &str) -> Result<ManifestEntry, ArchiveError> {
        let Some(manifest) = &self.manifest else {
            return Err(if self.seen_any {
                not_archive(from, "it has no manifest.json".into())
            } else {
                not_archive(from, "it is empty".into())
            });
        };
        let entries: Vec<ManifestEntry> = serde_json::from_slice(manifest)
            .map_err(|e| not_archive(from, format!("manifest.json: {e}")))?;
        match entries.len() {
            1 => Ok(entries.into_iter().next().expect("one")),
            0 => Err(not_archive(from, "manifest.json lists no image".into())),
            n => Err(ArchiveError::ManyImages(from.to_string(), n)),
        }
    }

    /// Every layer is a file of the archive (or a link to one), with the digest its
    /// name claims.
    fn check_layers(&self, layers: &[String], from: &str) -> Result<(), ArchiveError> {
        for layer in layers {
            let Some(d) = self.resolve(layer).and_then(|p| self.digests.get(&p)) else {
                return Err(ArchiveError::Incomplete(
                    from.to_string(),
                    format!("layer {layer} is missing"),
                ));
            };
            if let Some(claimed) = layer.strip_prefix("blobs/sha256/")
                && claimed != d
            {
                return Err(ArchiveError::Altered(
                    from.to_string(),
                    format!("layer {layer} has digest sha256:{d}; the archive was altered"),
                ));
            }
        }
        Ok(())
    }

    /// A layer file may be a relative symlink to another (docker save shares layers so);
    /// one step, to a regular file of the archive.
    fn resolve(&self, path: &str) -> Option<String> {
        if self.digests.contains_key(path) {
            return Some(path.to_string());
        }
        let target = self.links.get(path)?;
        let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        let mut parts: Vec<&str> = dir.split('/').filter(|c| !c.is_empty()).collect();
        for c in target.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    parts.pop()?;
                }
                c => parts.push(c),
            }
        }
        let joined = parts.join("/");
        (!target.starts_with('/') && self.digests.contains_key(&joined)).then_some(joined)
    }

    /// The OCI manifest's digest that `index.json` names, when it names one.
    fn manifest_digest(&self) -> Option<String> {
        self.index
            .as_ref()
            .and_then(|bytes| {
                let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
                let manifests = v.get("manifests")?.as_array()?;
                match manifests.as_slice() {
                    [one] => one.get("digest")?.as_str().map(str::to_string),
                    _ => None,
                }
            })
            // Only a digest the archive's own blob has: the index is not taken on its word.
            .filter(|d| {
                d.strip_prefix("sha256:").is_some_and(|hex| {
                    self.digests
                        .get(&format!("blobs/sha256/{hex}"))
                        .map(String::as_str)
                        == Some(hex)
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-image archive: a config, one layer, the manifest (and more `extra` files).
    fn archive(config: &[u8], config_name: Option<&str>, images: usize) -> Vec<u8> {
        let digest = hex(&Sha256::digest(config));
        let config_path = config_name
            .map(str::to_string)
            .unwrap_or_else(|| format!("{digest}.json"));
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |path: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, path, data).unwrap();
        };
        add("abc/layer.tar", b"not really a layer");
        add(&config_path, config);
        let one = serde_json::json!({"Config": config_path, "RepoTags": ["t:1"], "Layers": ["abc/layer.tar"]});
        let manifest = serde_json::Value::Array(vec![one; images]);
        add("manifest.json", manifest.to_string().as_bytes());
        b.into_inner().unwrap()
    }

    #[test]
    fn the_id_is_the_config_digest() {
        let config = br#"{"architecture":"amd64"}"#;
        let bytes = archive(config, None, 1);
        let img = read_image(&bytes[..], "a.tar").unwrap();
        assert_eq!(
            img.id.as_str(),
            format!("sha256:{}", hex(&Sha256::digest(config)))
        );
        assert_eq!(img.repo_tags, ["t:1"]);
        assert_eq!(img.layers, ["abc/layer.tar"]);
    }

    #[test]
    fn bad_archives_say_what_is_wrong() {
        let config = br#"{"architecture":"amd64"}"#;
        let err = |bytes: &[u8]| read_image(bytes, "a.tar").unwrap_err().to_string();
        assert!(err(b"hello, not a tar at all").contains("not a docker-archive"));
        assert!(err(b"").contains("not a docker-archive (it is empty)"));
        assert!(err(&archive(config, None, 2)).contains("holds 2 images"));
        let whole = archive(config, None, 1);
        let cut = err(&whole[..whole.len() - 2048 - 300]);
        assert!(cut.contains("truncated or incomplete"), "{cut}");
        let named = format!("{}.json", "0".repeat(64));
        assert!(err(&archive(config, Some(&named), 1)).contains("the archive was altered"));
        // What tar readers read differently is refused: a path that cleans to another,
        // a name given twice, a link with a size.
        let with = |path: &str, kind: tar::EntryType, size: u64| {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(kind);
            h.set_size(size);
            h.set_mode(0o644);
            // Written raw: the builder itself refuses `..`.
            h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, &vec![b'x'; size as usize][..]).unwrap();
            let mut bytes = b.into_inner().unwrap();
            bytes.truncate(bytes.len() - 1024);
            bytes.extend(archive(config, None, 1));
            bytes
        };
        assert!(
            err(&with("x/../c.json", tar::EntryType::Regular, 1))
                .contains("not a plain relative path")
        );
        assert!(
            err(&with("manifest.json", tar::EntryType::Regular, 1))
                .contains("`manifest.json` appears twice")
        );
        assert!(
            err(&with("l", tar::EntryType::Symlink, 512))
                .contains("is a folder or link with a size")
        );
        assert!(
            err(&with("h", tar::EntryType::Link, 0))
                .contains("neither a file, a folder nor a symlink")
        );
    }

    #[test]
    fn manifest_keys_are_exact() {
        let config = br#"{"architecture":"amd64"}"#;
        let digest = hex(&Sha256::digest(config));
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |path: &str, data: &[u8]| {
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, path, data).unwrap();
        };
        add(&format!("{digest}.json"), config);
        let manifest =
            format!(r#"[{{"Config":"{digest}.json","config":"other.json","Layers":[]}}]"#);
        add("manifest.json", manifest.as_bytes());
        let bytes = b.into_inner().unwrap();
        let e = read_image(&bytes[..], "a.tar").unwrap_err().to_string();
        assert!(e.contains("unknown field `config`"), "{e}");
    }
}
