//! What of the source a batch gets in `/work`: what git would ship. In a git checkout
//! that is the tracked files (submodules' too) and the untracked files git does not
//! ignore, and the `.git` folder with its configs cleaned of credentials (see
//! [`crate::git_mask`]); never ignored build output (`target/`, a virtualenv), never a
//! socket, FIFO or device, never cibox's own output folders. Outside git, every plain
//! file, folder and link but those.
//!
//! The files are listed once per run and streamed into each batch's container through
//! the engine's archive API, owned by the batch's user: nothing depends on where the
//! source is on the engine's host (a cibox in a container, a remote engine).

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender};

/// The folders cibox writes into a source by default: never shipped, never dirty.
pub const OUTPUT_FOLDERS: [&str; 2] = ["cibox-reports", "cibox-reproduce"];

/// The source's files to ship, listed once per run.
#[derive(Debug)]
pub struct SourceSet {
    root: PathBuf,
    /// Paths relative to `root`, folders before what they hold.
    entries: Vec<PathBuf>,
    /// Files whose content comes from elsewhere: `.git` configs cleaned of credentials.
    replaced: HashMap<PathBuf, PathBuf>,
    /// Folders that are git checkouts of their own and no submodule: git ships none of
    /// their files, so neither does cibox (they arrive as empty folders).
    pub nested: Vec<PathBuf>,
}

impl SourceSet {
    /// Lists what of `root` ships, leaving out `outputs` (relative folders: cibox's, and
    /// the reports folder when it lies in the source). `masks` are the git mask binds
    /// (`HOST:/src/REL:ro`): their files replace those at `REL`.
    pub fn list(root: &Path, outputs: &[PathBuf], masks: &[String]) -> std::io::Result<SourceSet> {
        let mut files: BTreeSet<PathBuf> = match git_files(root)? {
            Some(listed) => {
                let mut all: BTreeSet<PathBuf> = listed.into_iter().collect();
                match std::fs::symlink_metadata(root.join(".git")) {
                    Ok(md) if md.is_dir() => walk(root, Path::new(".git"), &[], &mut all)?,
                    // A worktree's or submodule's `.git` file.
                    Ok(_) => {
                        all.insert(PathBuf::from(".git"));
                    }
                    Err(_) => {}
                }
                all
            }
            None => {
                let mut all = BTreeSet::new();
                walk(root, Path::new(""), outputs, &mut all)?;
                all
            }
        };
        // cibox's own folders at any depth (a manifest in a subfolder has its reports
        // there), and the given ones.
        files.retain(|f| {
            !outputs.iter().any(|o| f.starts_with(o))
                && !f
                    .components()
                    .any(|c| OUTPUT_FOLDERS.iter().any(|o| c.as_os_str() == *o))
        });
        // Every folder on the way to a file, before it.
        let mut entries: BTreeSet<PathBuf> = BTreeSet::new();
        for f in &files {
            for a in f.ancestors().skip(1) {
                if !a.as_os_str().is_empty() {
                    entries.insert(a.to_path_buf());
                }
            }
            entries.insert(f.clone());
        }
        let replaced = masks
            .iter()
            .filter_map(|bind| {
                let (host, rest) = bind.split_once(":/src/")?;
                let rel = rest.strip_suffix(":ro").unwrap_or(rest);
                Some((PathBuf::from(rel), PathBuf::from(host)))
            })
            .collect();
        // A folder git lists as such, or a gitlink git cannot recurse into, that holds a
        // `.git` and nothing that ships: a checkout of its own.
        let nested = entries
            .iter()
            .filter(|e| !e.starts_with(".git"))
            .filter(|e| {
                std::fs::symlink_metadata(root.join(e)).is_ok_and(|m| m.is_dir())
                    && std::fs::symlink_metadata(root.join(e).join(".git")).is_ok()
                    // A submodule's files ship (git lists them); a nested checkout's do not.
                    && !entries.iter().any(|f| f != *e && f.starts_with(e))
            })
            .cloned()
            .collect();
        Ok(SourceSet {
            root: root.to_path_buf(),
            entries: entries.into_iter().collect(),
            replaced,
            nested,
        })
    }

    /// How many files, folders and links ship.
    pub fn count(&self) -> usize {
        self.entries.len()
    }

    /// The files as a tar stream owned by `uid:gid`, written on a thread of its own as
    /// it is read; a file that cannot be read ends the stream with that error.
    pub fn archive(&self, uid: u32, gid: u32) -> Box<dyn Read + Send> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Vec<u8>>>(8);
        let root = self.root.clone();
        let entries = self.entries.clone();
        let replaced = self.replaced.clone();
        std::thread::spawn(move || {
            let mut builder = tar::Builder::new(ChannelWriter { tx: tx.clone() });
            builder.mode(tar::HeaderMode::Deterministic);
            builder.follow_symlinks(false);
            let written = entries
                .iter()
                .try_for_each(|rel| append(&mut builder, &root, rel, &replaced, uid, gid))
                .and_then(|()| builder.finish());
            if let Err(e) = written {
                let _ = tx.send(Err(e));
            }
        });
        Box::new(ChannelReader {
            rx,
            chunk: Vec::new(),
            at: 0,
        })
    }
}

/// What git would ship of `root`: tracked files (submodules' too) and untracked ones it
/// does not ignore; `None` when `root` is not in a git checkout, or lies in a folder
/// that checkout ignores (a package unpacked under `target/`: git would ship none of it,
/// and it is no part of that checkout).
fn git_files(root: &Path) -> std::io::Result<Option<Vec<PathBuf>>> {
    if crate::git::text(root, &["rev-parse", "--is-inside-work-tree"])
        .ok()
        .as_deref()
        != Some("true")
    {
        return Ok(None);
    }
    let ignored = std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["check-ignore", "-q", "."])
        .status()
        .is_ok_and(|s| s.success());
    if ignored {
        return Ok(None);
    }
    let mut out = Vec::new();
    for args in [
        &["ls-files", "-z", "--cached", "--recurse-submodules"][..],
        &["ls-files", "-z", "--others", "--exclude-standard"],
    ] {
        let listed = std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()?;
        if !listed.status.success() {
            return Err(std::io::Error::other(format!(
                "git {} in {}: {}",
                args.join(" "),
                root.display(),
                String::from_utf8_lossy(&listed.stderr).trim()
            )));
        }
        use std::os::unix::ffi::OsStrExt;
        out.extend(
            listed
                .stdout
                .split(|b| *b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p))),
        );
    }
    Ok(Some(out))
}

/// Every entry below `root/rel` (links not followed), as paths relative to `root`.
fn walk(
    root: &Path,
    rel: &Path,
    skip: &[PathBuf],
    out: &mut BTreeSet<PathBuf>,
) -> std::io::Result<()> {
    let mut stack = vec![rel.to_path_buf()];
    while let Some(dir) = stack.pop() {
        // cibox's own output folders are never shipped, nor walked: other batches of
        // the run (on other Slurm nodes, say) write there meanwhile.
        if skip.contains(&dir) {
            continue;
        }
        let entries = match std::fs::read_dir(root.join(&dir)) {
            Ok(entries) => entries,
            // Gone since it was listed: nothing of it ships.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir != rel => continue,
            Err(e) => return Err(e),
        };
        for e in entries {
            let e = e?;
            let path = dir.join(e.file_name());
            let kind = match e.file_type() {
                Ok(kind) => kind,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            };
            if kind.is_dir() {
                stack.push(path.clone());
            }
            out.insert(path);
        }
    }
    Ok(())
}

/// One entry: a folder, a link, or a plain file (its content from `replaced` when
/// cleaned). Anything else (a socket, FIFO or device), and a file gone since the list
/// was made, is left out.
fn append(
    builder: &mut tar::Builder<ChannelWriter>,
    root: &Path,
    rel: &Path,
    replaced: &HashMap<PathBuf, PathBuf>,
    uid: u32,
    gid: u32,
) -> std::io::Result<()> {
    let path = root.join(rel);
    let Ok(md) = std::fs::symlink_metadata(&path) else {
        return Ok(());
    };
    let mut header = tar::Header::new_gnu();
    header.set_uid(u64::from(uid));
    header.set_gid(u64::from(gid));
    header.set_mtime(md.mtime().max(0) as u64);
    // No setuid, setgid or sticky bit: the batch's files are plain.
    header.set_mode(md.mode() & 0o777);
    let kind = md.file_type();
    if kind.is_dir() {
        header.set_entry_type(tar::EntryType::Directory);
        header.set_size(0);
        return builder.append_data(&mut header, rel, std::io::empty());
    }
    if kind.is_symlink() {
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        let target = std::fs::read_link(&path)?;
        return builder.append_link(&mut header, rel, target);
    }
    if !kind.is_file() {
        return Ok(());
    }
    let from = replaced.get(rel).map_or(path.clone(), Clone::clone);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(&from)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", rel.display()),
            ));
        }
    };
    let len = file.metadata()?.len();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(len);
    // Exactly the length the header says, whatever the file does meanwhile.
    builder.append_data(&mut header, rel, ExactLen::new(file, len))
}

/// Reads exactly `len` bytes: a file that grows is cut, one that shrinks is padded
/// with zeros, so the archive stays well formed.
struct ExactLen<R> {
    inner: R,
    left: u64,
}

impl<R: Read> ExactLen<R> {
    fn new(inner: R, len: u64) -> ExactLen<R> {
        ExactLen { inner, left: len }
    }
}

impl<R: Read> Read for ExactLen<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.left as usize);
        let n = match self.inner.read(&mut buf[..want])? {
            0 => {
                buf[..want].fill(0);
                want
            }
            n => n,
        };
        self.left -= n as u64;
        Ok(n)
    }
}

/// The tar builder's side of the stream: chunks sent to the reader.
struct ChannelWriter {
    tx: SyncSender<std::io::Result<Vec<u8>>>,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx
            .send(Ok(buf.to_vec()))
            .map_err(|_| std::io::Error::other("the reader of the source archive went away"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The engine's side: chunks as they come, an error where the writer met one.
struct ChannelReader {
    rx: Receiver<std::io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at >= self.chunk.len() {
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    self.chunk = chunk;
                    self.at = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
    }

    fn names(set: &SourceSet) -> Vec<String> {
        let mut a = tar::Archive::new(set.archive(1000, 1000));
        a.entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                assert_eq!(
                    (e.header().uid().unwrap(), e.header().gid().unwrap()),
                    (1000, 1000)
                );
                e.path().unwrap().display().to_string()
            })
            .filter(|n| n != ".git" && !n.starts_with(".git/"))
            .collect()
    }

    #[test]
    fn a_checkout_ships_what_git_would_ship() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        git(d, &["init", "-q"]);
        std::fs::write(d.join(".gitignore"), "target/\n*.pyc\n").unwrap();
        std::fs::create_dir_all(d.join("src")).unwrap();
        std::fs::write(d.join("src/lib.py"), "x = 1\n").unwrap();
        git(d, &["add", "-A"]);
        git(d, &["commit", "-qm", "c"]);
        // Untracked but not ignored: shipped. Ignored build output, cibox's reports and a
        // FIFO: not.
        std::fs::write(d.join("src/new.py"), "y = 2\n").unwrap();
        std::fs::create_dir_all(d.join("target/debug")).unwrap();
        std::fs::write(d.join("target/debug/big"), vec![0u8; 4096]).unwrap();
        std::fs::write(d.join("src/lib.pyc"), "").unwrap();
        std::fs::create_dir_all(d.join("cibox-reports/b")).unwrap();
        std::fs::write(d.join("cibox-reports/b/log.txt"), "").unwrap();
        nix::unistd::mkfifo(
            &d.join("fifo"),
            nix::sys::stat::Mode::from_bits(0o600).unwrap(),
        )
        .unwrap();
        let set = SourceSet::list(
            d,
            &OUTPUT_FOLDERS.iter().map(PathBuf::from).collect::<Vec<_>>(),
            &[],
        )
        .unwrap();
        assert_eq!(
            names(&set),
            [".gitignore", "src", "src/lib.py", "src/new.py"]
        );
    }

    #[test]
    fn a_nested_checkout_that_is_no_submodule_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        git(d, &["init", "-q"]);
        std::fs::write(d.join("a.py"), "x = 1\n").unwrap();
        let inner = d.join("vendor/lib");
        std::fs::create_dir_all(&inner).unwrap();
        git(&inner, &["init", "-q"]);
        std::fs::write(inner.join("lib.py"), "y = 2\n").unwrap();
        let set = SourceSet::list(d, &[], &[]).unwrap();
        assert_eq!(
            set.nested,
            [PathBuf::from("vendor/lib")],
            "{:?}",
            names(&set)
        );
        assert!(!names(&set).iter().any(|n| n.ends_with("lib.py")));
        // Its own checkout ships whole when it is the source.
        let set = SourceSet::list(&inner, &[], &[]).unwrap();
        assert!(set.nested.is_empty());
    }

    #[test]
    fn a_plain_folder_ships_its_files_and_cleaned_git_configs_replace_the_originals() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/b/c.txt"), "c").unwrap();
        std::os::unix::fs::symlink("b/c.txt", d.join("a/link")).unwrap();
        let set = SourceSet::list(d, &[], &[]).unwrap();
        assert_eq!(names(&set), ["a", "a/b", "a/b/c.txt", "a/link"]);
        // A mask bind's file is shipped in place of the one it masks.
        std::fs::create_dir_all(d.join(".git")).unwrap();
        std::fs::write(d.join(".git/config"), "[http]\n\textraheader = TOKEN\n").unwrap();
        let clean = tmp.path().join("clean-config");
        std::fs::write(&clean, "[core]\n").unwrap();
        let set = SourceSet::list(
            d,
            &[],
            &[format!("{}:/src/.git/config:ro", clean.display())],
        )
        .unwrap();
        let mut a = tar::Archive::new(set.archive(1, 1));
        let config = a
            .entries()
            .unwrap()
            .map(Result::unwrap)
            .find(|e| e.path().unwrap() == Path::new(".git/config"))
            .map(|mut e| {
                let mut s = String::new();
                e.read_to_string(&mut s).unwrap();
                s
            })
            .unwrap();
        assert_eq!(config, "[core]\n");
    }
}
