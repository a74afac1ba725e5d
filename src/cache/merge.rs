//! Promotion: a trusted run's layer laid over the newest generation into a new one, as
//! the overlay showed it to the batch. The new generation links the files it keeps
//! (nothing is copied; a file is shared by every generation that holds it), so it is
//! made in the time it takes to walk the tree, and then named current by one rename:
//! a batch that starts sees the old generation or the new one, never a mix.
//!
//! The layer is read as the kernel wrote it with `userxattr`: a character device 0:0
//! is a whiteout (a name removed), a folder with `user.overlay.opaque` replaces the
//! folder below it rather than merging with it. Another trusted run that promoted
//! meanwhile is kept: its files stay where this run did not write (last writer wins,
//! file by file).

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::store::{Cache, Writing};
use super::{CacheError, walk};

/// What a promotion did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Promoted {
    /// The new current generation.
    pub generation: String,
    /// Bytes the run wrote (its layer).
    pub wrote_bytes: u64,
    /// Bytes of the new generation, after eviction.
    pub bytes: u64,
    /// Top-level entries dropped, least recently used first, to stay within the cap.
    pub evicted: Vec<String>,
    /// What could not be linked or removed, each named.
    pub problems: Vec<String>,
}

impl Cache {
    /// Lays `w` over the current generation into a new current one of at most `cap`
    /// bytes, then removes what nobody uses any more. The layer goes whatever happens:
    /// one that cannot be laid over (a path longer than the host's calls take, say) is
    /// named in the error and thrown away, not left for a later clean-up.
    pub fn promote(&self, w: Writing, cap: u64) -> Result<Promoted, CacheError> {
        let laid = self.lay_over(&w, cap);
        let thrown = self.discard(w);
        let mut promoted = laid?;
        promoted.problems.extend(thrown);
        if let Ok(p) = self.prune(false) {
            promoted.problems.extend(p.problems);
        }
        Ok(promoted)
    }

    /// The new generation, named current, with `cache.lock` held exclusive throughout.
    fn lay_over(&self, w: &Writing, cap: u64) -> Result<Promoted, CacheError> {
        let upper = w.dir.join("upper");
        let wrote = walk::usage(&upper)
            .map_err(|e| self.io("measuring", &upper, e))?
            .bytes;
        let lock = self.cache_lock()?;
        lock.lock().map_err(|e| self.io("locking", self.dir(), e))?;
        let base = self.current()?;
        let gens = self.dir().join("gens");
        let name = Cache::next_name(Some(&base))
            .map_err(|e| self.io("naming a generation in", &gens, e))?;
        let making = gens.join(format!(".{name}"));
        let mut problems = Vec::new();
        let made = merge(Some(&gens.join(&base)), &upper, &making, &mut problems)
            .map_err(|e| self.io("merging into", &making, e))
            .and_then(|()| evict(&making, cap).map_err(|e| self.io("evicting in", &making, e)));
        let (bytes, evicted) = match made {
            Ok(made) => made,
            Err(e) => {
                let _ = crate::nofollow::remove_tree(&making);
                return Err(e);
            }
        };
        let done = gens.join(&name);
        std::fs::rename(&making, &done).map_err(|e| self.io("renaming", &done, e))?;
        self.set_current(&name)?;
        Ok(Promoted {
            generation: name,
            wrote_bytes: wrote,
            bytes,
            evicted,
            problems,
        })
    }
}

/// Whether `md` at `path` is an overlay whiteout.
fn is_whiteout(md: &std::fs::Metadata) -> bool {
    md.file_type().is_char_device() && md.rdev() == 0
}

/// Whether the folder at `path` is opaque: it replaces the one below it.
fn is_opaque(path: &Path) -> bool {
    // Of `path` itself, never through a link (lgetxattr).
    ["user.overlay.opaque", "trusted.overlay.opaque"]
        .iter()
        .any(|attr| matches!(xattr::get(path, attr), Ok(Some(v)) if v == b"y"))
}

/// One folder to make: from the layer (`upper`), the generation below (`base`), or
/// both.
struct Pending {
    base: Option<PathBuf>,
    upper: Option<PathBuf>,
    out: PathBuf,
}

/// Makes `out` the overlay of `upper` on `base`: folders made anew, everything else
/// linked.
fn merge(
    base: Option<&Path>,
    upper: &Path,
    out: &Path,
    problems: &mut Vec<String>,
) -> std::io::Result<()> {
    let mut linker = Linker::default();
    let merged = merge_with(base, upper, out, &mut linker);
    problems.append(&mut linker.problems);
    merged
}

fn merge_with(
    base: Option<&Path>,
    upper: &Path,
    out: &Path,
    linker: &mut Linker,
) -> std::io::Result<()> {
    // Modes are set once a folder is full: one without write permission would refuse
    // its own entries.
    let mut modes = Vec::new();
    let mut stack = vec![Pending {
        base: base.map(Path::to_path_buf),
        upper: Some(upper.to_path_buf()),
        out: out.to_path_buf(),
    }];
    while let Some(p) = stack.pop() {
        // The folder's own attributes come from the layer when it has it, as in the
        // overlay.
        let from = p.upper.as_deref().or(p.base.as_deref()).expect("one side");
        modes.push((p.out.clone(), make_dir_like(from, &p.out)?));
        let mut names = std::collections::BTreeSet::new();
        for side in [&p.upper, &p.base].into_iter().flatten() {
            for e in std::fs::read_dir(side)? {
                names.insert(e?.file_name());
            }
        }
        for name in names {
            let u = p.upper.as_ref().map(|d| d.join(&name));
            let u_md = u.as_ref().and_then(|u| std::fs::symlink_metadata(u).ok());
            let b = p.base.as_ref().map(|d| d.join(&name));
            let b_md = b.as_ref().and_then(|b| std::fs::symlink_metadata(b).ok());
            let out = p.out.join(&name);
            match (u_md, b_md) {
                (Some(m), _) if is_whiteout(&m) => {}
                (Some(m), b_md) if m.is_dir() => {
                    let u = u.expect("layer entry");
                    let below = b_md
                        .filter(|b| b.is_dir())
                        .and(b)
                        .filter(|_| !is_opaque(&u));
                    stack.push(Pending {
                        base: below,
                        upper: Some(u),
                        out,
                    });
                }
                (Some(_), _) => linker.link(&u.expect("layer entry"), &out)?,
                (None, Some(m)) if m.is_dir() => stack.push(Pending {
                    base: b,
                    upper: None,
                    out,
                }),
                (None, Some(_)) => linker.link(&b.expect("base entry"), &out)?,
                (None, None) => {}
            }
        }
    }
    for (dir, mode) in modes.into_iter().rev() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Makes folder `out` with `from`'s owner (where cibox may give it); returns the mode
/// to give it once it is full.
fn make_dir_like(from: &Path, out: &Path) -> std::io::Result<u32> {
    let md = std::fs::symlink_metadata(from)?;
    std::fs::DirBuilder::new().mode(0o700).create(out)?;
    let _ = std::os::unix::fs::lchown(out, Some(md.uid()), Some(md.gid()));
    Ok(md.mode() & 0o7777)
}

/// What links the files of a new generation, and what it had to copy.
#[derive(Default)]
struct Linker {
    problems: Vec<String>,
    /// The copy made of each file that could not be linked, by the file's `(dev, ino)`:
    /// its other names link to that copy, so a file with as many names as the file
    /// system allows (65,000 on ext4) is copied once, not once per name.
    copies: std::collections::HashMap<(u64, u64), PathBuf>,
}

impl Linker {
    /// Links `from` at `to`. A file cibox may not link (another user's, under
    /// `protected_hardlinks`, or one with the most links it may have) is copied, a
    /// symbolic link made again; anything else is named.
    fn link(&mut self, from: &Path, to: &Path) -> std::io::Result<()> {
        let e = match std::fs::hard_link(from, to) {
            Ok(()) => return Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(nix::libc::EPERM | nix::libc::EMLINK)) => e,
            Err(e) => return Err(e),
        };
        let md = std::fs::symlink_metadata(from)?;
        if md.file_type().is_symlink() {
            return std::os::unix::fs::symlink(std::fs::read_link(from)?, to);
        }
        if !md.is_file() {
            self.problems
                .push(format!("{}: not kept ({e})", from.display()));
            return Ok(());
        }
        let key = (md.dev(), md.ino());
        if let Some(copy) = self.copies.get(&key)
            && std::fs::hard_link(copy, to).is_ok()
        {
            return Ok(());
        }
        copy_as(from, &md, to)?;
        self.copies.insert(key, to.to_path_buf());
        Ok(())
    }
}

/// Copies the plain file `from` (of metadata `md`) to the new name `to` as it was: its
/// data, with its holes left holes (see [`copy_data`]), its owner, then its mode (a
/// copy cibox made as root keeps no setuid bit it was not given by its owner) and its
/// times (when it was last used).
fn copy_as(from: &Path, md: &std::fs::Metadata, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut src = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(from)?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    copy_data(&mut src, &mut dst)?;
    let _ = std::os::unix::fs::fchown(&dst, Some(md.uid()), Some(md.gid()));
    dst.set_permissions(std::fs::Permissions::from_mode(md.mode() & 0o7777))?;
    let times = std::fs::FileTimes::new();
    let times = match (md.accessed(), md.modified()) {
        (Ok(a), Ok(m)) => times.set_accessed(a).set_modified(m),
        _ => times,
    };
    dst.set_times(times)
}

/// Copies `src`'s data into the empty `dst`, region by region as the file system
/// holds it (`SEEK_DATA`, `SEEK_HOLE`), and gives `dst` `src`'s length: a hole stays a
/// hole. A batch decides what a layer holds: a file of a petabyte that takes no room
/// (`truncate -s 1P`) with the most links a file may have, copied byte for byte, wrote
/// a petabyte of zeros into the store's disk before any cap was looked at. A copy
/// takes the room its original takes.
fn copy_data(src: &mut std::fs::File, dst: &mut std::fs::File) -> std::io::Result<()> {
    use nix::unistd::{Whence, lseek};
    use std::io::{Read, Seek, SeekFrom};
    let len = src.metadata()?.len();
    let end = i64::try_from(len).map_err(std::io::Error::other)?;
    let mut at: i64 = 0;
    while at < end {
        let data = match lseek(&*src, at, Whence::SeekData) {
            Ok(d) => d,
            // Nothing but a hole from `at` on.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = lseek(&*src, data, Whence::SeekHole)?.min(end);
        let (from, count) = (data.unsigned_abs(), (hole - data).unsigned_abs());
        src.seek(SeekFrom::Start(from))?;
        dst.seek(SeekFrom::Start(from))?;
        let copied = std::io::copy(&mut (&*src).take(count), dst)?;
        if copied < count {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while it was copied",
            ));
        }
        at = hole;
    }
    dst.set_len(len)
}

/// Drops the least recently used top-level entries of `dir` until it holds at most
/// `cap` bytes; returns its bytes then and the names dropped.
fn evict(dir: &Path, cap: u64) -> std::io::Result<(u64, Vec<String>)> {
    let mut entries = walk::top_entries(dir)?;
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    entries.sort_by_key(|e| e.last_used);
    let mut evicted = Vec::new();
    for e in entries {
        if total <= cap {
            break;
        }
        crate::nofollow::clear(&dir.join(&e.name))?;
        total = total.saturating_sub(e.bytes);
        evicted.push(e.name.to_string_lossy().into_owned());
    }
    Ok((total, evicted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn whiteout(path: &Path) -> bool {
        nix::sys::stat::mknod(
            path,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            0,
        )
        .is_ok()
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                if p.is_dir() {
                    stack.push(p);
                    out.push(format!("{rel}/"));
                } else {
                    out.push(format!("{rel}={}", std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_layer_lays_over_its_base_as_the_overlay_showed_it() {
        let t = tempfile::tempdir().unwrap();
        let (base, upper, out) = (t.path().join("b"), t.path().join("u"), t.path().join("o"));
        write(&base.join("models/a/w.bin"), "old weights");
        write(&base.join("models/a/cfg"), "cfg");
        write(&base.join("data/keep"), "kept");
        write(&base.join("gone"), "removed by the layer");
        write(&base.join("replaced/stale"), "hidden by an opaque folder");
        write(&upper.join("models/a/w.bin"), "new weights");
        write(&upper.join("models/b/w.bin"), "another model");
        write(&upper.join("replaced/fresh"), "fresh");
        xattr::set(upper.join("replaced"), "user.overlay.opaque", b"y")
            .expect("user xattrs on the test's folder");
        assert!(
            whiteout(&upper.join("gone")),
            "mknod 0:0 (root, or Linux 5.8+)"
        );
        let mut problems = Vec::new();
        merge(Some(&base), &upper, &out, &mut problems).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            listing(&out),
            [
                "data/",
                "data/keep=kept",
                "models/",
                "models/a/",
                "models/a/cfg=cfg",
                "models/a/w.bin=new weights",
                "models/b/",
                "models/b/w.bin=another model",
                "replaced/",
                "replaced/fresh=fresh",
            ]
        );
        // Linked, not copied: the base's file and the new generation's are one.
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&out.join("data/keep")), ino(&base.join("data/keep")));
        // The base is untouched.
        assert_eq!(listing(&base).len(), 9);
    }

    /// Sets `path`'s access and change times to `age` seconds ago.
    fn age(path: &Path, age: u64) {
        let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
        std::fs::File::open(path)
            .unwrap()
            .set_times(
                std::fs::FileTimes::new()
                    .set_accessed(when)
                    .set_modified(when),
            )
            .unwrap();
    }

    #[test]
    fn a_merged_generations_folders_are_as_old_as_what_they_hold() {
        // A promotion makes every folder anew: their times are the merge's. Named so
        // that the merge makes the newer entry's folder first.
        let t = tempfile::tempdir().unwrap();
        let (base, upper, out) = (t.path().join("b"), t.path().join("u"), t.path().join("o"));
        for (name, secs) in [("a-old", 3000), ("z-new", 100)] {
            write(&base.join(name).join("sub/f"), &"x".repeat(8192));
            age(&base.join(name).join("sub/f"), secs);
        }
        std::fs::create_dir(&upper).unwrap();
        merge(Some(&base), &upper, &out, &mut Vec::new()).unwrap();
        let one = walk::top_entries(&out).unwrap()[0].bytes;
        let (_, evicted) = evict(&out, one + 4096).unwrap();
        assert_eq!(evicted, ["a-old"]);
    }

    /// Issue 38, attack: a pull request's run decides what its layer holds, and a file
    /// cibox cannot link (one with the most links its file system allows) is copied.
    /// A sparse file was copied byte for byte: 2 GiB that took no room became 2 GiB of
    /// zeros in the store (a petabyte would have filled the disk). A copy keeps its
    /// holes, and its data where the data is.
    #[test]
    fn a_sparse_file_is_copied_as_sparse_as_it_was() {
        use std::io::{Seek, SeekFrom, Write};
        let t = tempfile::tempdir().unwrap();
        let (from, to) = (t.path().join("sparse"), t.path().join("copy"));
        let mut f = std::fs::File::create(&from).unwrap();
        f.write_all(b"head").unwrap();
        f.seek(SeekFrom::Start(1 << 30)).unwrap();
        f.write_all(b"middle").unwrap();
        f.set_len(2 << 30).unwrap();
        drop(f);
        let md = std::fs::symlink_metadata(&from).unwrap();
        copy_as(&from, &md, &to).unwrap();
        let copy = std::fs::metadata(&to).unwrap();
        assert_eq!(copy.len(), 2 << 30);
        assert!(
            copy.blocks() * 512 <= (md.blocks() * 512).max(1 << 20),
            "a copy of a file taking {} bytes takes {}",
            md.blocks() * 512,
            copy.blocks() * 512
        );
        let mut file = std::fs::File::open(&to).unwrap();
        let mut read_at = |at: u64, n: usize| {
            let mut buf = vec![0; n];
            file.seek(SeekFrom::Start(at)).unwrap();
            std::io::Read::read_exact(&mut file, &mut buf).unwrap();
            buf
        };
        assert_eq!(read_at(0, 4), b"head");
        assert_eq!(read_at(1 << 30, 6), b"middle");
        assert_eq!(read_at((1 << 30) - 3, 3), [0, 0, 0]);
        assert_eq!(read_at((2 << 30) - 1, 1), [0]);
        // A plain file, and an empty one, as they were.
        for text in [&b"plain"[..], b""] {
            std::fs::write(&from, text).unwrap();
            std::fs::remove_file(&to).unwrap();
            let md = std::fs::symlink_metadata(&from).unwrap();
            copy_as(&from, &md, &to).unwrap();
            assert_eq!(std::fs::read(&to).unwrap(), text);
        }
    }

    #[test]
    fn eviction_drops_the_least_recently_used_entries_first() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        for (name, age) in [("old", 300), ("mid", 200), ("new", 100)] {
            write(&d.join(name).join("f"), &"x".repeat(8192));
            let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            for p in [d.join(name).join("f"), d.join(name)] {
                std::fs::File::open(p)
                    .unwrap()
                    .set_times(
                        std::fs::FileTimes::new()
                            .set_accessed(when)
                            .set_modified(when),
                    )
                    .unwrap();
            }
        }
        let all = walk::usage(d).unwrap().bytes;
        let one = walk::top_entries(d).unwrap()[0].bytes;
        let (left, evicted) = evict(d, all - one).unwrap();
        assert_eq!(evicted, ["old"]);
        assert!(left <= all - one);
        let (_, evicted) = evict(d, 0).unwrap();
        assert_eq!(evicted, ["mid", "new"]);
    }
}
