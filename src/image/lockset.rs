//! The lockset (docs/interface.md §5): which files define an image, and one digest over them.
//!
//! The text is byte for byte what GNU `sha256sum` prints for the sorted files, so anyone
//! can check it with standard tools; the digest is the sha256 of that text. An image
//! carries both in its config labels, so its ID covers them.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::util::hex;

/// Label holding `sha256:` + the digest of the lockset text.
pub const LABEL_DIGEST: &str = "org.cibox.lockset";
/// Label holding the lockset text itself, to tell which lock file changed.
pub const LABEL_FILES: &str = "org.cibox.lockset.files";

#[derive(Debug, thiserror::Error)]
pub enum LocksetError {
    #[error("image.locks is empty: list the files that define the image (lock files, its recipe)")]
    Empty,
    #[error(
        "lock pattern `{pattern}` matches no file under {root}{}",
        .near.as_ref().map(|n| format!("; did you mean `{n}`?")).unwrap_or_default()
    )]
    NoMatch {
        pattern: String,
        root: String,
        /// The file below the root whose name is closest, when one is close.
        near: Option<String>,
    },
    #[error("lock pattern `{pattern}` is not a valid glob: {reason}")]
    BadPattern { pattern: String, reason: String },
    #[error("lock file `{path}` cannot be read: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("lock file path `{0}` is not UTF-8; rename it")]
    NotUtf8(String),
}

impl crate::error::ErrorKind for LocksetError {
    /// Lock files are named by the manifest: its to fix.
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
}

/// One lock file and the sha256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockFile {
    pub path: String,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lockset {
    pub files: Vec<LockFile>,
    pub text: String,
    pub digest: String,
}

/// What differs between the lockset an image was built from and the source's.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LocksetDiff {
    pub changed: Vec<String>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

/// The file below `root` whose path is closest to `pattern` (a typo), looking at no
/// more than a few thousand files and not into hidden or build folders.
fn nearest_file(root: &Path, pattern: &str) -> Option<String> {
    const MAX_FILES: usize = 20_000;
    let mut files: Vec<String> = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                if !name.starts_with('.') && !matches!(name.as_str(), "target" | "node_modules") {
                    stack.push(e.path());
                }
            } else if kind.is_file()
                && let Ok(rel) = e.path().strip_prefix(root)
            {
                files.push(rel.to_string_lossy().into_owned());
            }
            if files.len() >= MAX_FILES {
                break;
            }
        }
    }
    files.sort();
    crate::util::did_you_mean(pattern, &files).map(str::to_string)
}

fn has_glob_meta(p: &str) -> bool {
    p.contains(['*', '?', '['])
}

/// A trailing `**` means every file below, at any depth (as in `.gitignore`): the glob
/// crate reads it as folders only, which never name a lock file.
fn files_below(pattern: &str) -> std::borrow::Cow<'_, str> {
    if pattern == "**" || pattern.ends_with("/**") {
        format!("{pattern}/*").into()
    } else {
        pattern.into()
    }
}

impl Lockset {
    /// Expands `patterns` under `root`, hashes every file and builds the text and digest.
    pub fn compute(root: &Path, patterns: &[String]) -> Result<Lockset, LocksetError> {
        if patterns.is_empty() {
            return Err(LocksetError::Empty);
        }
        let mut paths = std::collections::BTreeSet::new();
        for pattern in patterns {
            // Set when the pattern names at least one regular file (even one another
            // pattern already named); a pattern naming none is a typo or a missing file.
            let mut matched_any = false;
            if has_glob_meta(pattern) {
                let root_str = root
                    .to_str()
                    .ok_or_else(|| LocksetError::NotUtf8(root.display().to_string()))?;
                // The root is literal text; only the pattern may hold glob syntax.
                let full = format!(
                    "{}/{}",
                    glob::Pattern::escape(root_str),
                    files_below(pattern)
                );
                let opts = glob::MatchOptions {
                    case_sensitive: true,
                    require_literal_separator: true,
                    require_literal_leading_dot: false,
                };
                let entries =
                    glob::glob_with(&full, opts).map_err(|e| LocksetError::BadPattern {
                        pattern: pattern.clone(),
                        reason: e.msg.to_string(),
                    })?;
                for entry in entries {
                    let entry = entry.map_err(|e| LocksetError::Unreadable {
                        path: e.path().display().to_string(),
                        reason: e.error().to_string(),
                    })?;
                    if entry.is_file() {
                        matched_any = true;
                        paths.insert(relative(root, &entry)?);
                    }
                }
            } else {
                let full = root.join(pattern);
                match std::fs::metadata(&full) {
                    Ok(md) if md.is_file() => {
                        matched_any = true;
                        paths.insert(relative(root, &full)?);
                    }
                    Ok(_) => {
                        return Err(LocksetError::Unreadable {
                            path: pattern.clone(),
                            reason: "is not a regular file".into(),
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(LocksetError::Unreadable {
                            path: pattern.clone(),
                            reason: e.to_string(),
                        });
                    }
                }
            }
            if !matched_any {
                return Err(LocksetError::NoMatch {
                    pattern: pattern.clone(),
                    root: root.display().to_string(),
                    near: nearest_file(root, pattern),
                });
            }
        }
        let paths: Vec<String> = paths.into_iter().collect();
        let hashes = hash_files(root, &paths)?;
        let files: Vec<LockFile> = paths
            .into_iter()
            .zip(hashes)
            .map(|(path, sha256)| LockFile { path, sha256 })
            .collect();
        Ok(Self::from_files(files))
    }

    /// Builds text and digest from already hashed files (sorted by path bytes).
    pub fn from_files(mut files: Vec<LockFile>) -> Lockset {
        files.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        let text: String = files.iter().map(sha256sum_line).collect();
        let digest = digest_of(&text);
        Lockset {
            files,
            text,
            digest,
        }
    }

    /// Reads a lockset back from its text (the `org.cibox.lockset.files` label).
    pub fn parse_text(text: &str) -> Result<Lockset, String> {
        let mut files = Vec::new();
        for (n, line) in text.split_terminator('\n').enumerate() {
            let (escaped, line) = match line.strip_prefix('\\') {
                Some(rest) => (true, rest),
                None => (false, line),
            };
            let (hash, path) = line
                .split_once("  ")
                .filter(|(h, _)| {
                    h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
                })
                .ok_or_else(|| format!("line {} is not `<sha256>  <path>`", n + 1))?;
            let path = if escaped {
                unescape(path)
            } else {
                path.to_string()
            };
            files.push(LockFile {
                path,
                sha256: hash.to_string(),
            });
        }
        let lockset = Self::from_files(files);
        if lockset.text != text {
            return Err("the text is not in canonical form (sorted, one line per file)".into());
        }
        Ok(lockset)
    }

    /// What changed going from `self` (the image's) to `source`.
    pub fn diff(&self, source: &Lockset) -> LocksetDiff {
        let mine: BTreeMap<&str, &str> = self
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.sha256.as_str()))
            .collect();
        let theirs: BTreeMap<&str, &str> = source
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.sha256.as_str()))
            .collect();
        let mut d = LocksetDiff::default();
        for (p, h) in &theirs {
            match mine.get(p) {
                None => d.added.push(p.to_string()),
                Some(old) if old != h => d.changed.push(p.to_string()),
                _ => {}
            }
        }
        d.removed = mine
            .keys()
            .filter(|p| !theirs.contains_key(*p))
            .map(|p| p.to_string())
            .collect();
        d
    }
}

/// `sha256:` + the sha256 of the text's bytes.
pub fn digest_of(text: &str) -> String {
    format!("sha256:{}", hex(&Sha256::digest(text.as_bytes())))
}

/// One line as GNU `sha256sum` prints it: names with a backslash, newline or carriage
/// return are escaped and the line starts with a backslash.
fn sha256sum_line(f: &LockFile) -> String {
    if f.path.contains(['\\', '\n', '\r']) {
        let escaped = f
            .path
            .replace('\\', "\\\\")
            .replace('\n', "\\n")
            .replace('\r', "\\r");
        format!("\\{}  {escaped}\n", f.sha256)
    } else {
        format!("{}  {}\n", f.sha256, f.path)
    }
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('r') => out.push('\r'),
                Some('\\') => out.push('\\'),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn relative(root: &Path, full: &Path) -> Result<String, LocksetError> {
    let rel = full.strip_prefix(root).unwrap_or(full);
    let s = rel
        .to_str()
        .ok_or_else(|| LocksetError::NotUtf8(rel.display().to_string()))?;
    Ok(s.trim_start_matches("./").to_string())
}

/// Hashes the files on all cores: lock sets can hold large files (vendored wheels,
/// toolchain archives), and verification sits on the path of every batch.
fn hash_files(root: &Path, paths: &[String]) -> Result<Vec<String>, LocksetError> {
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(paths.len())
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<Option<Result<String, LocksetError>>> =
        (0..paths.len()).map(|_| None).collect();
    let slots: Vec<std::sync::Mutex<&mut Option<Result<String, LocksetError>>>> =
        results.iter_mut().map(std::sync::Mutex::new).collect();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(path) = paths.get(i) else { break };
                    let r = hash_file(&root.join(path)).map_err(|e| LocksetError::Unreadable {
                        path: path.clone(),
                        reason: e.to_string(),
                    });
                    **slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                }
            });
        }
    });
    drop(slots);
    results
        .into_iter()
        .map(|r| r.expect("every path was hashed"))
        .collect()
}

fn hash_file(path: &Path) -> std::io::Result<String> {
    crate::util::sha256_hex(File::open(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_names_round_trip() {
        let files = vec![
            LockFile {
                path: "a\\b".into(),
                sha256: "0".repeat(64),
            },
            LockFile {
                path: "new\nline".into(),
                sha256: "1".repeat(64),
            },
            LockFile {
                path: "plain name".into(),
                sha256: "2".repeat(64),
            },
        ];
        let l = Lockset::from_files(files);
        assert!(
            l.text
                .starts_with(&format!("\\{}  a\\\\b\n", "0".repeat(64)))
        );
        assert_eq!(Lockset::parse_text(&l.text).unwrap(), l);
    }

    #[test]
    fn diff_names_each_kind() {
        let f = |p: &str, h: char| LockFile {
            path: p.into(),
            sha256: h.to_string().repeat(64),
        };
        let image = Lockset::from_files(vec![f("a", '1'), f("b", '2'), f("c", '3')]);
        let source = Lockset::from_files(vec![f("a", '1'), f("b", '9'), f("d", '4')]);
        let d = image.diff(&source);
        assert_eq!(d.changed, ["b"]);
        assert_eq!(d.added, ["d"]);
        assert_eq!(d.removed, ["c"]);
    }

    #[test]
    fn rejects_non_canonical_text() {
        let text = format!("{}  b\n{}  a\n", "1".repeat(64), "2".repeat(64));
        assert!(Lockset::parse_text(&text).is_err());
        assert!(Lockset::parse_text("garbage\n").is_err());
    }
}
