//! The engine's save of a raw build, written for normalising to read: streamed from
//! the engine through a tar reader into one archive on disk, with the content of the
//! base images' layers read past, never written. The base images' layers are kept as
//! they are (they are inputs, pinned by the bases' IDs) and the engine already holds
//! them: the normalised archive names them without carrying them, so a rebuild writes
//! and loads only what the build added (issue 44).
//!
//! Which layers are passed over: those whose digest (read as they stream by) is one of
//! the bases' diff IDs. The engine's save lists layers by their old v1 IDs, not in the
//! image's order, so a layer is known only once it has been read; it is written as it
//! comes, and cut off again when it turns out to be a base's.

use std::collections::{BTreeSet, HashSet};
use std::io::{Read, Seek, SeekFrom, Write};

use sha2::{Digest, Sha256};

use super::normalise::HashingReader;
use std::path::Path;

use crate::engine::{Engine, EngineError};

/// What [`save`] wrote: the bytes the engine sent, and the archive's layer files whose
/// content was passed over (their entries are there, empty).
pub struct Saved {
    pub bytes: u64,
    pub passed_over: BTreeSet<String>,
}

/// Saves `raw` into the archive `to`, passing over the content of the layer files that
/// are `bases`' diff IDs.
pub fn save(
    engine: &Engine,
    raw: &str,
    bases: &HashSet<String>,
    to: &Path,
) -> Result<Saved, EngineError> {
    let io = |what: &str, e: std::io::Error| EngineError::Io {
        action: format!("{what} {}", to.display()),
        reason: e.to_string(),
    };
    let file = std::fs::File::create(to).map_err(|e| io("writing", e))?;
    let (reader, mut writer) = std::io::pipe().map_err(|e| io("a pipe for", e))?;
    let bases = bases.clone();
    let filter = std::thread::spawn(move || {
        let mut reader = reader;
        let result = rewrite(&mut reader, file, &bases);
        // Read to the end whatever happened: the engine's side never writes into a pipe
        // nobody reads (cibox takes SIGPIPE's default).
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
        result
    });
    let sent = engine.save_into(raw, &mut writer);
    drop(writer);
    let filtered = filter
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the archive's reader failed")));
    let bytes = sent?;
    let passed_over = filtered.map_err(|e| io("reading the engine's save into", e))?;
    Ok(Saved { bytes, passed_over })
}

/// Copies the tar stream `from` into `to`, each layer file whose digest is in `bases`
/// left empty; returns their paths.
fn rewrite(
    from: impl Read,
    to: std::fs::File,
    bases: &HashSet<String>,
) -> std::io::Result<BTreeSet<String>> {
    let mut archive = tar::Archive::new(from);
    let mut out = tar::Builder::new(to);
    let mut passed_over = BTreeSet::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path_bytes().into_owned();
        let mut header = entry.header().clone();
        let is_layer = header.entry_type().is_file() && path.ends_with(b"/layer.tar");
        if !is_layer {
            out.append_data(&mut header, bytes_path(&path)?, &mut entry)?;
            continue;
        }
        let start = out.get_mut().stream_position()?;
        let mut hashing = HashingReader {
            inner: &mut entry,
            hasher: Sha256::new(),
        };
        out.append_data(&mut header.clone(), bytes_path(&path)?, &mut hashing)?;
        let digest = format!("sha256:{}", crate::util::hex(&hashing.hasher.finalize()));
        if bases.contains(&digest) {
            let file = out.get_mut();
            file.set_len(start)?;
            file.seek(SeekFrom::Start(start))?;
            header.set_size(0);
            out.append_data(&mut header, bytes_path(&path)?, std::io::empty())?;
            passed_over.insert(
                String::from_utf8_lossy(&path)
                    .trim_start_matches("./")
                    .to_string(),
            );
        }
    }
    out.into_inner()?.flush()?;
    // The rest of the stream (the end blocks), read so the engine's side is not cut off.
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink())?;
    Ok(passed_over)
}

fn bytes_path(path: &[u8]) -> std::io::Result<&Path> {
    use std::os::unix::ffi::OsStrExt;
    Ok(Path::new(std::ffi::OsStr::from_bytes(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passed_over_layers_are_empty_entries_and_the_rest_is_copied() {
        let mut src = tar::Builder::new(Vec::new());
        for (path, data) in [
            ("l0/layer.tar", b"own first".as_slice()),
            ("l1/layer.tar", b"base one"),
            ("l1/json", b"{}"),
            ("l2/layer.tar", b"own layer"),
            ("manifest.json", b"[]"),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            src.append_data(&mut h, path, data).unwrap();
        }
        let bytes = src.into_inner().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("saved.tar");
        let base = format!("sha256:{}", crate::util::hex(&Sha256::digest(b"base one")));
        let bases: HashSet<String> = [base].into();
        let passed = rewrite(
            bytes.as_slice(),
            std::fs::File::create(&to).unwrap(),
            &bases,
        )
        .unwrap();
        assert_eq!(passed.into_iter().collect::<Vec<_>>(), ["l1/layer.tar"]);
        let mut a = tar::Archive::new(std::fs::File::open(&to).unwrap());
        let got: Vec<(String, String)> = a
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut s = String::new();
                e.read_to_string(&mut s).unwrap();
                (e.path().unwrap().display().to_string(), s)
            })
            .collect();
        assert_eq!(
            got,
            [
                ("l0/layer.tar".to_string(), "own first".to_string()),
                ("l1/layer.tar".into(), String::new()),
                ("l1/json".into(), "{}".into()),
                ("l2/layer.tar".into(), "own layer".into()),
                ("manifest.json".into(), "[]".into())
            ]
        );
    }
}
