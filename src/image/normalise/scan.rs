//! Searching what a build wrote for what the host gave it ([`Hidden`]: secrets' values,
//! proxies' credentials): every file's content, every entry's name, link target and
//! PAX records (extended attributes), and every string of the image's config and
//! history, keys too. Where one is found is named, never the value: the place is
//! shown masked ([`Masker`]).

use std::io::Read;

use super::entry::Indexed;
use crate::mask::{Hidden, Masker, SHORTEST};

/// Searches for each value (without the white space around it; values shorter than
/// [`SHORTEST`] are not searched for) and notes where it is found.
pub(super) struct SecretScan<'a> {
    /// What each value is, and its finder.
    needles: Vec<(&'a str, memchr::memmem::Finder<'a>)>,
    /// The longest needle, less one: what a chunk keeps of the one before.
    overlap: usize,
    /// Shows the places found.
    mask: &'a Masker,
    /// The layer being written (1-based), for what is found.
    pub(super) layer: usize,
    /// Where a value was found, one line each (`secret `ID`: layer 2, PATH`).
    pub(super) found: Vec<String>,
}

impl<'a> SecretScan<'a> {
    pub(super) fn new(hidden: &'a [Hidden], mask: &'a Masker) -> SecretScan<'a> {
        let needles: Vec<(&str, memchr::memmem::Finder<'_>)> = hidden
            .iter()
            .map(|h| (h.what.as_str(), h.value.trim_ascii()))
            .filter(|(_, v)| v.len() >= SHORTEST)
            .map(|(what, v)| (what, memchr::memmem::Finder::new(v)))
            .collect();
        let overlap = needles
            .iter()
            .map(|(_, f)| f.needle().len() - 1)
            .max()
            .unwrap_or(0);
        SecretScan {
            needles,
            overlap,
            mask,
            layer: 0,
            found: Vec::new(),
        }
    }

    /// What `data` holds, each once.
    pub(super) fn ids_in(&self, data: &[u8]) -> Vec<&'a str> {
        let mut out: Vec<&str> = Vec::new();
        for (what, f) in &self.needles {
            if !out.contains(what) && f.find(data).is_some() {
                out.push(what);
            }
        }
        out
    }

    /// Notes what entry `e` of the current layer holds: in its name, its link target,
    /// its PAX records, and (`in_content`, found while it was read) its content.
    pub(super) fn entry(&mut self, e: &Indexed, in_content: &[&'a str]) {
        if self.needles.is_empty() {
            return;
        }
        let shown = self.mask.shown(&e.path);
        let mut places: Vec<(&str, String)> = Vec::new();
        for what in self.ids_in(&e.path) {
            places.push((what, " (its name)".into()));
        }
        if let Some(link) = &e.link {
            for what in self.ids_in(link) {
                places.push((what, " (its link target)".into()));
            }
        }
        for (key, value) in &e.pax {
            let mut whats = self.ids_in(key.as_bytes());
            for what in self.ids_in(value) {
                if !whats.contains(&what) {
                    whats.push(what);
                }
            }
            let record = match key.strip_prefix("SCHILY.xattr.") {
                Some(name) => format!(
                    " (its extended attribute {})",
                    self.mask.shown(name.as_bytes())
                ),
                None => format!(" (its PAX record {})", self.mask.shown(key.as_bytes())),
            };
            for what in whats {
                places.push((what, record.clone()));
            }
        }
        for what in in_content {
            places.push((what, String::new()));
        }
        for (what, place) in places {
            self.found
                .push(format!("{what}: layer {}, {shown}{place}", self.layer));
        }
    }

    /// Notes what the image's config holds: every string and key, named by where it
    /// lies (`config.Env[1]`, `history[3].created_by`).
    pub(super) fn config(&mut self, config: &serde_json::Value) {
        if self.needles.is_empty() {
            return;
        }
        let mut found = Vec::new();
        self.walk(config, &mut String::new(), &mut found);
        for (what, at) in found {
            let part = if at.starts_with("history") {
                "history"
            } else {
                "config"
            };
            self.found
                .push(format!("{what}: the image's {part}, at `{at}`"));
        }
    }

    fn walk(&self, value: &serde_json::Value, at: &mut String, found: &mut Vec<(&'a str, String)>) {
        use serde_json::Value as V;
        let len = at.len();
        match value {
            V::String(s) => {
                for what in self.ids_in(s.as_bytes()) {
                    found.push((what, at.clone()));
                }
            }
            V::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    at.push_str(&format!("[{i}]"));
                    self.walk(item, at, found);
                    at.truncate(len);
                }
            }
            V::Object(map) => {
                for (key, item) in map {
                    if !at.is_empty() {
                        at.push('.');
                    }
                    at.push_str(&self.mask.shown(key.as_bytes()));
                    for what in self.ids_in(key.as_bytes()) {
                        found.push((what, at.clone()));
                    }
                    self.walk(item, at, found);
                    at.truncate(len);
                }
            }
            _ => {}
        }
    }
}

/// Reads a file of a layer through a [`SecretScan`], noting what it holds (also across
/// the chunks it is read in).
pub(super) struct ScanningReader<'s, 'a, R> {
    pub(super) inner: R,
    pub(super) scan: &'s SecretScan<'a>,
    /// The end of what was read so far, as long as a needle less one byte.
    pub(super) tail: Vec<u8>,
    pub(super) hits: Vec<&'a str>,
}

impl<R: Read> Read for ScanningReader<'_, '_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if !self.scan.needles.is_empty() && n > 0 {
            self.tail.extend_from_slice(&buf[..n]);
            for id in self.scan.ids_in(&self.tail) {
                if !self.hits.contains(&id) {
                    self.hits.push(id);
                }
            }
            let keep = self.scan.overlap.min(self.tail.len());
            self.tail.drain(..self.tail.len() - keep);
        }
        Ok(n)
    }
}
