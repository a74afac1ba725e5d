//! Entries a layer restates: a file, link or folder exactly as the layers below it
//! already hold it. Applying such an entry changes nothing, yet it changes the layer's
//! digest and so the image's ID, and whether a builder writes one is not up to the
//! recipe: Docker 20.10's BuildKit, with builds that share steps running at once,
//! sometimes diffs a layer against the wrong parent and writes the files of the stage
//! it copied from again (seen in this project's tests, `--check` naming them "only in
//! the second build"). So a restated entry is dropped, and the same files give the same
//! ID however the builder split them.
//!
//! The layers are a pull request's build, so this errs towards keeping. What is
//! compared: type, mode, numeric owner, device numbers, PAX records (extended
//! attributes among them), the link target byte for byte, size and content. Only a
//! *plain* layer loses entries: one with no hard link, no entry of a type other than
//! file, folder, symbolic link, device or FIFO, every path clean (no empty, `.` or `..`
//! part, which the engine would clean into another path), no whiteout of an empty,
//! `.` or `..` name and no `trusted.overlay` attribute (which makes a folder opaque).
//! A layer that is not plain, and a base image's layer (copied, never read), leave the
//! view of what is below unknown: nothing above them is dropped for what lies under
//! them. Within a plain layer nothing is dropped that another entry needs: not a
//! folder with anything kept below it (the engine would make that folder anew, owned
//! by root, mode 755, hiding the one below; such a folder made by the engine is
//! forgotten too), not a path the layer names twice, and nothing a whiteout of the
//! layer uncovers. A file that replaces a folder forgets what the folder held.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use super::entry::{EntrySummary, Indexed, kind_char};

/// One entry as the merged view of the layers sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    summary: EntrySummary,
    device: Option<(u32, u32)>,
    /// The SHA-256 of its PAX records (extended attributes among them), sorted so that
    /// the order a builder writes them in does not count; a digest, as the view is kept
    /// for every file of the build.
    pax: Option<[u8; 32]>,
    /// A link's target as written (the summary shows it lossily).
    target: Option<Vec<u8>>,
}

/// The files the build's layers below the current one leave, by path (without a
/// leading `./` or `/`, nor a trailing `/`).
#[derive(Default)]
pub(super) struct Below {
    seen: BTreeMap<Vec<u8>, Seen>,
    /// Whether the layer being written is plain, so what it keeps is noted.
    plain: bool,
    /// Entries dropped so far, over all layers.
    pub(super) dropped: usize,
}

/// A layer's path as a key: `./usr/bin/` and `usr/bin` are one path.
fn key(path: &[u8]) -> Vec<u8> {
    let mut p = path;
    loop {
        if let Some(rest) = p.strip_prefix(b"./") {
            p = rest;
        } else if let Some(rest) = p.strip_prefix(b"/") {
            p = rest;
        } else {
            break;
        }
    }
    while let Some(rest) = p.strip_suffix(b"/") {
        p = rest;
    }
    if p == b"." { Vec::new() } else { p.to_vec() }
}

/// The folder and name of a key.
fn split(key: &[u8]) -> (&[u8], &[u8]) {
    match key.iter().rposition(|&b| b == b'/') {
        Some(i) => (&key[..i], &key[i + 1..]),
        None => (&[], key),
    }
}

/// What lies below `dir` (a key): `dir/` as a prefix, or everything for the root.
fn below_prefix(dir: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        Vec::new()
    } else {
        [dir, b"/"].concat()
    }
}

fn is_whiteout(key: &[u8]) -> bool {
    split(key).1.starts_with(b".wh.")
}

/// A path the engine takes as written: no empty, `.` or `..` part once a leading `./`
/// or `/` and a trailing `/` are set aside.
fn is_clean(path: &[u8]) -> bool {
    let k = key(path);
    k.is_empty()
        || k.split(|&b| b == b'/')
            .all(|part| !matches!(part, b"" | b"." | b".."))
}

/// Whether a layer may lose what it restates (see the module's text).
fn is_plain(layer: &[Indexed]) -> bool {
    use tar::EntryType as T;
    layer.iter().all(|e| {
        let k = key(&e.path);
        matches!(
            e.header.entry_type(),
            T::Regular | T::Continuous | T::Directory | T::Symlink | T::Char | T::Block | T::Fifo
        ) && is_clean(&e.path)
            && !split(&k)
                .1
                .strip_prefix(b".wh.")
                .is_some_and(|hidden| matches!(hidden, b"" | b"." | b".."))
            && !e.pax.iter().any(|(k, _)| k.contains("trusted.overlay"))
    })
}

impl Below {
    /// Forgets everything: a layer below was copied, not read.
    pub(super) fn forget_all(&mut self) {
        self.seen.clear();
    }

    /// Forgets what the layer's whiteouts remove: a whited-out path and all below it;
    /// below a folder made opaque, all it held.
    fn whiteouts(&mut self, layer: &[Indexed]) {
        for e in layer {
            let k = key(&e.path);
            let (dir, name) = split(&k);
            let Some(hidden) = name.strip_prefix(b".wh.") else {
                continue;
            };
            if hidden == b".wh..opq" {
                self.forget_below(dir);
            } else {
                let gone = if dir.is_empty() {
                    hidden.to_vec()
                } else {
                    [dir, b"/", hidden].concat()
                };
                self.seen.remove(&gone);
                self.forget_below(&gone);
            }
        }
    }

    fn forget_below(&mut self, dir: &[u8]) {
        let prefix = below_prefix(dir);
        let doomed: Vec<Vec<u8>> = self
            .seen
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(k, _)| !k.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.seen.remove(&k);
        }
    }

    /// Notes an entry a plain layer keeps (`summary` as written); a file, link or
    /// device in a folder's place hides what the folder held.
    pub(super) fn keep(&mut self, e: &Indexed, summary: &EntrySummary) -> std::io::Result<()> {
        let k = key(&e.path);
        if !self.plain || is_whiteout(&k) {
            return Ok(());
        }
        if e.header.entry_type() != tar::EntryType::Directory {
            self.forget_below(&k);
        }
        self.seen.insert(k, seen(e, summary.clone())?);
        Ok(())
    }

    /// Ends a layer that kept `kept`: a folder they are in but do not name is made by
    /// the engine (root, 755), hiding the one below, so it is forgotten.
    pub(super) fn end(&mut self, kept: &[&Indexed]) {
        if !self.plain {
            return;
        }
        let named: HashSet<Vec<u8>> = kept.iter().map(|e| key(&e.path)).collect();
        for e in kept {
            let k = key(&e.path);
            let mut dir = split(&k).0;
            while !dir.is_empty() && !named.contains(dir) {
                self.seen.remove(dir);
                dir = split(dir).0;
            }
        }
    }

    /// Starts a layer: forgets what its whiteouts remove and returns the entries
    /// (indices) that restate what is below, to be dropped; none where the layer is not
    /// plain, whose entries then leave the view unknown. Reads the content of a file
    /// only where all else already matches.
    pub(super) fn restated(
        &mut self,
        layer: &[Indexed],
        saved: &mut File,
    ) -> std::io::Result<HashSet<usize>> {
        let mut dropped = HashSet::new();
        self.plain = is_plain(layer);
        if !self.plain {
            self.forget_all();
            return Ok(dropped);
        }
        self.whiteouts(layer);
        if self.seen.is_empty() {
            return Ok(dropped);
        }
        let mut times: HashMap<Vec<u8>, usize> = HashMap::new();
        for e in layer {
            *times.entry(key(&e.path)).or_default() += 1;
        }
        let mut folders = Vec::new();
        for (i, e) in layer.iter().enumerate() {
            let k = key(&e.path);
            let kind = e.header.entry_type();
            if is_whiteout(&k) || times[&k] > 1 {
                continue;
            }
            let Some(lower) = self.seen.get(&k) else {
                continue;
            };
            if kind == tar::EntryType::Directory {
                folders.push((k, i, lower));
                continue;
            }
            // All but the content first: that is read only if needed.
            let mut here = unread(e, &lower.summary.digest)?;
            if here != *lower {
                continue;
            }
            if kind.is_file() || kind == tar::EntryType::Continuous {
                here.summary.digest = content_digest(saved, e)?;
            }
            if here == *lower {
                dropped.insert(i);
            }
        }
        // Folders last, deepest first: one goes only if nothing below it stays.
        let candidates: HashSet<usize> = folders.iter().map(|(_, i, _)| *i).collect();
        let mut kept: BTreeSet<Vec<u8>> = layer
            .iter()
            .enumerate()
            .filter(|(i, _)| !dropped.contains(i) && !candidates.contains(i))
            .map(|(_, e)| key(&e.path))
            .collect();
        folders.sort_by(|a, b| b.0.cmp(&a.0));
        for (k, i, lower) in folders {
            let here = unread(&layer[i], &lower.summary.digest)?;
            let prefix = below_prefix(&k);
            let holds = kept
                .range(prefix.clone()..)
                .take_while(|p| p.starts_with(&prefix))
                .any(|p| *p != k);
            if here == *lower && !holds {
                dropped.insert(i);
            } else {
                kept.insert(k);
            }
        }
        Ok(dropped)
    }
}

/// An entry as the merged view sees it, its content taken to be `digest`, unread.
fn unread(e: &Indexed, digest: &str) -> std::io::Result<Seen> {
    seen(
        e,
        EntrySummary {
            kind: kind_char(e.header.entry_type()),
            mode: e.header.mode()?,
            owner: (e.header.uid()?, e.header.gid()?),
            size: e.size,
            digest: digest.to_string(),
        },
    )
}

/// An entry as the merged view sees it, `summary` being what it is.
fn seen(e: &Indexed, summary: EntrySummary) -> std::io::Result<Seen> {
    let device = match (e.header.device_major(), e.header.device_minor()) {
        (Ok(Some(major)), Ok(Some(minor))) => Some((major, minor)),
        _ => None,
    };
    let pax = (!e.pax.is_empty()).then(|| {
        use sha2::Digest;
        let mut records: Vec<&(String, Vec<u8>)> = e.pax.iter().collect();
        records.sort();
        let mut h = sha2::Sha256::new();
        for (k, v) in records {
            // Lengths first, so that no two lists hash alike.
            h.update((k.len() as u64).to_le_bytes());
            h.update(k.as_bytes());
            h.update((v.len() as u64).to_le_bytes());
            h.update(v);
        }
        h.finalize().into()
    });
    Ok(Seen {
        summary,
        device,
        pax,
        target: e.link.clone(),
    })
}

/// The SHA-256 of a file's content, read from the saved archive.
fn content_digest(saved: &mut File, e: &Indexed) -> std::io::Result<String> {
    saved.seek(SeekFrom::Start(e.data_at))?;
    crate::util::sha256_hex(Read::by_ref(saved).take(e.size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_forget_how_a_builder_spells_a_path() {
        assert_eq!(key(b"./deps/"), b"deps");
        assert_eq!(key(b"/deps/size"), b"deps/size");
        assert_eq!(key(b"./"), b"");
        assert_eq!(key(b"."), b"");
        assert_eq!(split(b"a/b/.wh.c"), (&b"a/b"[..], &b".wh.c"[..]));
        assert_eq!(split(b"c"), (&b""[..], &b"c"[..]));
    }
}
