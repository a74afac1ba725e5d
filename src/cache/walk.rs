//! Walks of a cache's trees: what they hold on disk, and when each top-level entry was
//! last used. Nothing is followed (entries are `lstat`ed), each file counts once however
//! many names it has, and folders are walked with a stack of their own, so a deep tree
//! cannot exhaust cibox's.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Bytes on disk and files of a tree.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub files: u64,
}

/// One entry at the top of a cache (a model's folder, a dataset, an extension's build):
/// what evicting it frees, and when it was last read or written.
#[derive(Debug, Clone)]
pub struct TopEntry {
    pub name: std::ffi::OsString,
    pub bytes: u64,
    pub last_used: SystemTime,
}

/// What `dir` holds.
pub fn usage(dir: &Path) -> std::io::Result<Usage> {
    let mut seen = HashSet::new();
    let mut u = Usage::default();
    tree(dir, &mut seen, &mut |md| {
        u.bytes += md.blocks() * 512;
        u.files += 1;
    })?;
    Ok(u)
}

/// The entries at the top of `dir`, each with its bytes (a file shared with an entry
/// measured earlier counts there) and its last use: the newest access or change time of
/// anything in it but folders (a generation's folders are made anew by each promotion,
/// and cibox's own walks read them: their times say when cibox last merged, not when a
/// batch last used them). Access times move on a read through the overlay (with
/// `relatime`, at most once a day), so this is least recently used to about a day.
pub fn top_entries(dir: &Path) -> std::io::Result<Vec<TopEntry>> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let mut bytes = 0;
        let mut last = SystemTime::UNIX_EPOCH;
        tree(&e.path(), &mut seen, &mut |md| {
            bytes += md.blocks() * 512;
            if !md.is_dir() {
                for t in [md.accessed(), md.modified()].into_iter().flatten() {
                    last = last.max(t);
                }
            }
        })?;
        out.push(TopEntry {
            name: e.file_name(),
            bytes,
            last_used: last,
        });
    }
    Ok(out)
}

/// Calls `each` once per inode of the tree at `root` (the root included), never
/// following a link.
fn tree(
    root: &Path,
    seen: &mut HashSet<(u64, u64)>,
    each: &mut dyn FnMut(&std::fs::Metadata),
) -> std::io::Result<()> {
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let md = std::fs::symlink_metadata(&path)?;
        if seen.insert((md.dev(), md.ino())) {
            each(&md);
        }
        if md.is_dir() {
            for e in std::fs::read_dir(&path)? {
                stack.push(e?.path());
            }
        }
    }
    Ok(())
}
