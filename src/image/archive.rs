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

impl ArchiveError {
    /// An archive someone handed cibox is input: bad input is a usage error; one
    /// that cannot be read or written here is the host's.
    pub fn failure(&self) -> crate::exit::Failure {
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

#[derive(serde::Deserialize)]
struct ManifestEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

/// The hex digest a file's name claims: `<hex>.json` (legacy) or `blobs/sha256/<hex>`.
fn claimed_digest(path: &str) -> Option<&str> {
    let name = path
        .strip_prefix("blobs/sha256/")
        .or_else(|| path.strip_suffix(".json"))?;
    (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())).then_some(name)
}

/// Reads a docker-archive from `reader` (`from` names it in messages) and returns its
/// one image.
pub fn read_image(reader: impl Read, from: &str) -> Result<ArchiveImage, ArchiveError> {
    let not_archive = |why: String| ArchiveError::NotArchive(from.to_string(), why);
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| not_archive(format!("not a tar stream: {e}")))?;
    // Every regular file's SHA-256, by its path in the archive.
    let mut digests: BTreeMap<String, String> = BTreeMap::new();
    let mut manifest: Option<Vec<u8>> = None;
    let mut index: Option<Vec<u8>> = None;
    let mut seen_any = false;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            if seen_any {
                ArchiveError::Incomplete(from.to_string(), e.to_string())
            } else {
                not_archive(format!("not a tar stream: {e}"))
            }
        })?;
        seen_any = true;
        let path = String::from_utf8_lossy(&entry.path_bytes())
            .trim_start_matches("./")
            .to_string();
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let size = entry.header().size().unwrap_or(0);
        let keep = matches!(path.as_str(), "manifest.json" | "index.json");
        if keep && size > MAX_INDEX_BYTES {
            return Err(not_archive(format!("{path} is larger than 1 MiB")));
        }
        let mut hasher = Sha256::new();
        let mut kept = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut read = 0u64;
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| ArchiveError::Incomplete(from.to_string(), format!("{path}: {e}")))?;
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
            return Err(ArchiveError::Incomplete(
                from.to_string(),
                format!("{path} ends after {read} of its {size} bytes"),
            ));
        }
        digests.insert(path.clone(), hex(&hasher.finalize()));
        match path.as_str() {
            "manifest.json" => manifest = Some(kept),
            "index.json" => index = Some(kept),
            _ => {}
        }
    }
    let Some(manifest) = manifest else {
        return Err(if seen_any {
            not_archive("it has no manifest.json".into())
        } else {
            not_archive("it is empty".into())
        });
    };
    let entries: Vec<ManifestEntry> = serde_json::from_slice(&manifest)
        .map_err(|e| not_archive(format!("manifest.json: {e}")))?;
    let one = match entries.len() {
        1 => entries.into_iter().next().expect("one"),
        0 => return Err(not_archive("manifest.json lists no image".into())),
        n => return Err(ArchiveError::ManyImages(from.to_string(), n)),
    };
    let Some(config_digest) = digests.get(&one.config) else {
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
    for layer in &one.layers {
        let Some(d) = digests.get(layer) else {
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
    let manifest_digest = index.and_then(|bytes| {
        let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        let manifests = v.get("manifests")?.as_array()?;
        match manifests.as_slice() {
            [one] => one.get("digest")?.as_str().map(str::to_string),
            _ => None,
        }
    });
    let id = ImageId::parse(&format!("sha256:{config_digest}"))
        .map_err(|e| not_archive(format!("config digest: {e}")))?;
    Ok(ArchiveImage {
        id,
        manifest_digest,
        repo_tags: one.repo_tags.unwrap_or_default(),
        layers: one.layers,
    })
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
    }
}
