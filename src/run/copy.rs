//! `/reports` comes out of the container, it is not shared with it: cibox reads the
//! folder as a tar stream through the engine's archive API while the container still
//! lives, and writes into `<reports>/<batch>/` only what is safe to hand on. Regular
//! files and folders are kept, with plain modes (`0644`, `0755` when any execute bit was
//! set, folders `0755`): no symlink, hard link, device, FIFO or socket, no setuid or
//! setgid bit, nothing outside the folder, nothing under cibox's own names. The copy
//! stops at a cap on bytes, files and path length.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use crate::nofollow::Folder;
use crate::report::record::Copied;

/// What may come out of one batch's `/reports`.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Bytes of file content in all.
    pub bytes: u64,
    /// Files and folders.
    pub entries: usize,
    /// Bytes of one relative path.
    pub path_len: usize,
    /// Folders deep.
    pub depth: usize,
}

impl Caps {
    pub const fn with_bytes(bytes: u64) -> Caps {
        Caps {
            bytes,
            entries: 100_000,
            path_len: 1024,
            depth: 32,
        }
    }
}

/// How long the whole copy may take; after a cancel, at most [`COPY_AFTER_CANCEL`].
const COPY_DEADLINE: Duration = Duration::from_secs(300);
const COPY_AFTER_CANCEL: Duration = Duration::from_secs(10);

/// When a copy must stop: a terminating signal beyond those received before it began (a
/// cancelled batch's reports are still copied, a second Ctrl-C stops that), or its
/// deadline.
#[derive(Debug, Clone, Copy)]
pub struct StopWhen {
    signals_before: u32,
    deadline: Instant,
}

impl StopWhen {
    pub fn now() -> StopWhen {
        let signals_before = crate::signals::count();
        let budget = if signals_before > 0 {
            COPY_AFTER_CANCEL
        } else {
            COPY_DEADLINE
        };
        StopWhen {
            signals_before,
            deadline: Instant::now() + budget,
        }
    }

    /// Why the copy must stop now, if it must.
    pub fn reason(&self) -> Option<String> {
        if crate::signals::count() > self.signals_before {
            return Some("interrupted by a signal".into());
        }
        (Instant::now() >= self.deadline).then(|| "not done in time".to_string())
    }
}

/// The archive stream, bounded in bytes (what the caps allow, with room for the tar
/// headers) and by [`StopWhen`]: a batch cannot make the copy read more than it may keep
/// (sparse files claim any size) or outlast its time.
struct Bounded<R> {
    inner: R,
    left: u64,
    stop: StopWhen,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(why) = self.stop.reason() {
            return Err(std::io::Error::other(why));
        }
        if self.left == 0 {
            return Err(std::io::Error::other(
                "the archive is longer than its caps allow",
            ));
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Names cibox writes in a batch folder itself.
fn reserved(first: &str) -> bool {
    matches!(
        first,
        "log.txt" | "result.json" | crate::run::batch_dir::MARKER
    ) || first.starts_with(".result.json")
        || crate::report::junit::is_attempt_folder(first)
}

/// The path of an entry below the archive's top folder (`reports/…`), or why it has
/// none that cibox will write.
fn relative(raw: &Path, caps: &Caps) -> Result<Option<PathBuf>, String> {
    let shown = crate::util::escape(&raw.to_string_lossy()).to_string();
    let mut parts = Vec::new();
    for (i, c) in raw.components().enumerate() {
        match c {
            Component::Normal(n) if i > 0 => parts.push(
                n.to_str()
                    .ok_or_else(|| format!("`{shown}`: not a UTF-8 name"))?,
            ),
            // The archive's own top folder.
            Component::Normal(_) => {}
            Component::CurDir => {}
            _ => return Err(format!("`{shown}`: leaves the folder")),
        }
    }
    if parts.is_empty() {
        return Ok(None);
    }
    let rel: PathBuf = parts.iter().collect();
    if rel.as_os_str().len() > caps.path_len || parts.len() > caps.depth {
        return Err(format!(
            "`{shown}`: path longer than {} bytes or deeper than {} folders",
            caps.path_len, caps.depth
        ));
    }
    if reserved(parts[0]) {
        return Err(format!("`{shown}`: a name cibox writes itself"));
    }
    Ok(Some(rel))
}

/// The folder `rel` below `dest`, made with any parent missing as plain folders; a
/// name that exists must be a folder cibox made (never followed: see [`Folder`]).
fn make_dirs(dest: &Folder, rel: &Path) -> std::io::Result<Folder> {
    dest.make_path(rel, 0o755).map_err(|e| {
        if matches!(
            e.raw_os_error(),
            Some(nix::libc::ENOTDIR | nix::libc::ELOOP)
        ) {
            std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file of that name was copied already",
            )
        } else {
            e
        }
    })
}

/// Copies what is safe from the tar stream of `/reports` into `dest` (cibox's batch
/// folder, which exists). Never fails: what could not be copied is in the result.
pub fn extract(archive: impl Read, dest: &Folder, caps: &Caps, stop: StopWhen) -> Copied {
    let mut copied = Copied::default();
    let bounded = Bounded {
        inner: archive,
        // Each entry takes a header, an extended one for a long name (PAX, with the
        // name), and padding.
        left: caps.bytes + 6144 * (caps.entries as u64 + 2),
        stop,
    };
    let mut archive = tar::Archive::new(bounded);
    // What the entries claim to hold, copied or not: a skipped one is read through too.
    let mut claimed = 0u64;
    let entries = match archive.entries() {
        Ok(e) => e,
        Err(e) => {
            copied.stopped = Some(format!("the archive could not be read: {e}"));
            return copied;
        }
    };
    let mut seen = 0usize;
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => {
                copied.stopped = Some(format!("the archive broke off: {e}"));
                break;
            }
        };
        seen += 1;
        if seen > caps.entries + 1 {
            copied.stopped = Some(format!(
                "more than {} files and folders: the rest was not copied",
                caps.entries
            ));
            break;
        }
        claimed = claimed.saturating_add(entry.size());
        if claimed > caps.bytes {
            copied.stopped = Some(format!(
                "the entries claim more than the {} byte cap: the copy stopped there",
                caps.bytes
            ));
            break;
        }
        let raw = match entry.path() {
            Ok(p) => p.into_owned(),
            Err(e) => {
                copied.skip(format!("an entry with an unreadable name: {e}"));
                continue;
            }
        };
        let rel = match relative(&raw, caps) {
            Ok(Some(rel)) => rel,
            Ok(None) => continue,
            Err(why) => {
                copied.skip(why);
                continue;
            }
        };
        let shown = crate::util::escape(&rel.to_string_lossy()).to_string();
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            if let Err(e) = make_dirs(dest, &rel).map(drop) {
                copied.skip(format!("`{shown}`: {e}"));
            }
            continue;
        }
        if !kind.is_file() {
            let what = if kind.is_symlink() {
                "a symlink"
            } else if kind.is_hard_link() {
                "a hard link"
            } else if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_character_special() || kind.is_block_special() {
                "a device"
            } else {
                "not a regular file"
            };
            copied.skip(format!("`{shown}`: {what}, not copied"));
            continue;
        }
        let size = entry.size();
        let parent = match make_dirs(dest, rel.parent().unwrap_or(Path::new(""))) {
            Ok(p) => p,
            Err(e) => {
                copied.skip(format!("`{shown}`: {e}"));
                continue;
            }
        };
        let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
        let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let file = parent.create_new(name, if executable { 0o755 } else { 0o644 });
        let mut file = match file {
            Ok(f) => f,
            Err(e) => {
                copied.skip(format!("`{shown}`: {e}"));
                continue;
            }
        };
        match std::io::copy(&mut (&mut entry).take(size), &mut file) {
            Ok(n) => {
                copied.files += 1;
                copied.bytes += n;
            }
            Err(e) => {
                copied.stopped = Some(format!("`{shown}` broke off: {e}"));
                break;
            }
        }
    }
    copied
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar stream as the engine sends it for `/reports`.
    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o700);
        dir.set_size(0);
        dir.set_cksum();
        b.append_data(&mut dir, "reports/", std::io::empty())
            .unwrap();
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, body: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_size(body.len() as u64);
        h.set_cksum();
        b.append_data(&mut h, path, body).unwrap();
    }

    fn special(b: &mut tar::Builder<Vec<u8>>, path: &str, kind: tar::EntryType, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o777);
        if !target.is_empty() {
            h.set_link_name(target).unwrap();
        }
        h.set_cksum();
        b.append_data(&mut h, path, std::io::empty()).unwrap();
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn regular_files_and_folders_come_out_with_plain_modes() {
        let tar = archive(|b| {
            file(b, "reports/junit.xml", 0o6755, b"<testsuite/>");
            file(b, "reports/deep/er/notes.txt", 0o600, b"hi");
        });
        let dest = tempfile::tempdir().unwrap();
        let c = extract(
            &tar[..],
            &Folder::open(dest.path()).unwrap(),
            &Caps::with_bytes(1 << 20),
            StopWhen::now(),
        );
        assert_eq!((c.files, c.bytes, c.skipped_count), (2, 14, 0), "{c:?}");
        assert_eq!(mode(&dest.path().join("junit.xml")), 0o755, "no setuid");
        assert_eq!(mode(&dest.path().join("deep/er/notes.txt")), 0o644);
        assert_eq!(mode(&dest.path().join("deep")), 0o755);
    }

    #[test]
    fn links_devices_fifos_escapes_and_cibox_names_are_skipped() {
        let tar = archive(|b| {
            special(b, "reports/hostroot", tar::EntryType::Symlink, "/");
            special(b, "reports/shadow.xml", tar::EntryType::Link, "/etc/shadow");
            special(b, "reports/pipe", tar::EntryType::Fifo, "");
            special(b, "reports/null", tar::EntryType::Char, "");
            file(b, "reports/result.json", 0o644, b"{}");
            file(b, "reports/log.txt", 0o644, b"forged");
            file(b, "reports/ok.xml", 0o644, b"x");
        });
        // A path that leaves the folder cannot be made with the builder's checks.
        let mut tar = tar;
        let evil = {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(1);
            h.set_mode(0o644);
            h.as_old_mut().name[..18].copy_from_slice(b"reports/../escaped");
            h.set_cksum();
            let mut v = h.as_bytes().to_vec();
            v.extend_from_slice(&[b'x'; 512][..512]);
            v
        };
        // Insert before the two closing zero blocks.
        let end = tar.len() - 1024;
        tar.splice(end..end, evil);
        let dest = tempfile::tempdir().unwrap();
        let inner = dest.path().join("batch");
        std::fs::create_dir(&inner).unwrap();
        let c = extract(
            &tar[..],
            &Folder::open(&inner).unwrap(),
            &Caps::with_bytes(1 << 20),
            StopWhen::now(),
        );
        assert_eq!(c.files, 1, "{c:?}");
        assert_eq!(c.skipped_count, 7, "{c:?}");
        assert!(inner.join("ok.xml").is_file());
        assert!(!dest.path().join("escaped").exists());
        for name in [
            "hostroot",
            "shadow.xml",
            "pipe",
            "null",
            "result.json",
            "log.txt",
        ] {
            assert!(
                std::fs::symlink_metadata(inner.join(name)).is_err(),
                "{name} was copied"
            );
        }
    }

    #[test]
    fn the_copy_stops_at_its_caps() {
        let tar = archive(|b| {
            for i in 0..10 {
                file(b, &format!("reports/f{i}"), 0o644, &[b'x'; 100]);
            }
        });
        let dest = tempfile::tempdir().unwrap();
        let c = extract(
            &tar[..],
            &Folder::open(dest.path()).unwrap(),
            &Caps::with_bytes(550),
            StopWhen::now(),
        );
        assert_eq!(c.files, 5);
        assert!(c.stopped.unwrap().contains("550 byte cap"));
        // What a skipped entry claims counts too (a sparse file can claim any size).
        let claims = archive(|b| {
            file(b, "reports/result.json", 0o644, &[b'x'; 400]);
            file(b, "reports/ok", 0o644, &[b'x'; 400]);
        });
        let dest = tempfile::tempdir().unwrap();
        let c = extract(
            &claims[..],
            &Folder::open(dest.path()).unwrap(),
            &Caps::with_bytes(550),
            StopWhen::now(),
        );
        assert_eq!((c.files, c.skipped_count), (0, 1), "{c:?}");
        assert!(c.stopped.unwrap().contains("claim more than"));
        let dest = tempfile::tempdir().unwrap();
        let caps = Caps {
            entries: 3,
            ..Caps::with_bytes(1 << 20)
        };
        let c = extract(
            &tar[..],
            &Folder::open(dest.path()).unwrap(),
            &caps,
            StopWhen::now(),
        );
        assert!(c.files <= 3, "{c:?}");
        assert!(c.stopped.unwrap().contains("more than 3 files"));
        let deep = archive(|b| file(b, &format!("reports/{}x", "d/".repeat(40)), 0o644, b"x"));
        let dest = tempfile::tempdir().unwrap();
        let c = extract(
            &deep[..],
            &Folder::open(dest.path()).unwrap(),
            &Caps::with_bytes(1 << 20),
            StopWhen::now(),
        );
        assert_eq!((c.files, c.skipped_count), (0, 1), "{c:?}");
    }
}
