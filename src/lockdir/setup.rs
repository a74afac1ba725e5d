//! `cibox host setup`: the lock dir made once, by root, so that nobody else owns
//! anything a lease depends on. The folder, `queue/` and `runs/` are root's (mode 1777,
//! sticky: anyone may add a ticket or a run's record, nobody may remove another's), and
//! so are `queue.seq`, `probe.lock` and each GPU's lock file (mode 0666: anyone may lock
//! them, only root may remove or replace them) and `select.lock` (mode 0600: only root
//! may hold it; anyone else decides without it, see `LockDir::open_select_lock`).
//!
//! Root works here in folders others may write, so nothing is done through a path that
//! someone could swap for a link between a check and a change: a folder another user
//! made is moved aside (never chowned or chmodded in place) and a fresh one made with
//! `mkdir`; modes and owners are set on an open descriptor (`O_NOFOLLOW`); files are
//! made with `O_EXCL`. Anything that is held now (a lease, a ticket) is named and left:
//! setup does not pull a lock file from under a lease.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{LockDirError, SAFE_FLAGS, lock_holder};
use crate::ownership;

/// What setting up the lock dir did.
#[derive(Debug, Default)]
pub struct Setup {
    /// What was made, replaced or moved aside, one line each.
    pub done: Vec<String>,
    /// What was left as it is because someone holds it now, with who.
    pub left: Vec<String>,
}

/// Makes `dir` and its files root's. Must run as root.
pub fn setup(dir: &Path, gpu_uuids: &[String]) -> Result<Setup, LockDirError> {
    let shown = dir.display().to_string();
    let err = |what: &str, e: std::io::Error| LockDirError::Unusable {
        dir: shown.clone(),
        reason: format!("{what}: {e}"),
    };
    let mut report = Setup::default();
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| err("cannot create its parent", e))?;
        // Only root may change the folders above it, and in its parent nobody may rename
        // another's entry (a sticky /run/lock is fine): else the lock dir could be swapped
        // for a link at any time.
        let md = std::fs::metadata(parent).map_err(|e| err("its parent", e))?;
        let why = ownership::changeable_by_others(parent, 0).or_else(|| {
            (md.uid() != 0 || (md.mode() & 0o022 != 0 && md.mode() & 0o1000 == 0)).then(|| {
                format!(
                    "lies in {} ({}, mode {:o}), where others could rename it",
                    parent.display(),
                    ownership::owner_of(md.uid()),
                    md.mode() & 0o7777
                )
            })
        });
        if let Some(why) = why {
            return Err(LockDirError::Unusable {
                dir: shown.clone(),
                reason: format!("cannot be made root's: it {why}"),
            });
        }
    }
    for sub in [dir.to_path_buf(), dir.join("queue"), dir.join("runs")] {
        if !root_folder(&sub, &mut report).map_err(|e| err(&sub.display().to_string(), e))? {
            // A folder in use was left: nothing below it can be trusted to set up.
            return Ok(report);
        }
    }
    // `select.lock` is root's alone: whoever can open it can hold it, and every
    // hand-out waits for it. The others anyone may lock (mode 0666).
    let names = [("select.lock".to_string(), SELECT_MODE)]
        .into_iter()
        .chain(
            ["queue.seq", "probe.lock"]
                .into_iter()
                .map(|n| (n.to_string(), 0o666)),
        )
        .chain(gpu_uuids.iter().map(|u| (format!("{u}.lock"), 0o666)));
    for (name, mode) in names {
        let path = dir.join(&name);
        root_file(&path, mode, &mut report).map_err(|e| err(&name, e))?;
    }
    Ok(report)
}

/// A folder of root's with mode 1777. One that is a link, no folder, or another
/// user's is moved aside and made anew, unless something in it is held now. Whether
/// the folder is root's now.
fn root_folder(path: &Path, report: &mut Setup) -> std::io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() && md.uid() == 0 => {}
        Ok(md) => {
            if md.is_dir()
                && let Some(held) = held_inside(path)
            {
                report.left.push(format!(
                    "{} ({}) holds {held}: run setup again once it is released",
                    path.display(),
                    ownership::owner_of(md.uid())
                ));
                return Ok(false);
            }
            let aside = moved_aside(path)?;
            report.done.push(format!(
                "moved {} ({}{}) aside to {}",
                path.display(),
                ownership::owner_of(md.uid()),
                if md.is_dir() { "" } else { ", no folder" },
                aside.display()
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if std::fs::symlink_metadata(path).is_err() {
        // Made by root, private until it is set up: nobody else can have it meanwhile.
        std::fs::DirBuilder::new().mode(0o700).create(path)?;
        report.done.push(format!("made {}", path.display()));
    }
    let folder = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)?;
    let md = folder.metadata()?;
    if md.uid() != 0 {
        // Swapped between the checks above and the open: leave it for another try.
        return Err(std::io::Error::other(format!(
            "{} changed hands while it was set up; run setup again",
            path.display()
        )));
    }
    nix::unistd::fchown(folder.as_fd(), Some(0.into()), Some(0.into()))?;
    folder.set_permissions(std::fs::Permissions::from_mode(0o1777))?;
    Ok(true)
}

/// Renames `path` to a fresh name beside it (root may, in a sticky folder): what it
/// was is kept for its owner to look at, and nothing of it is used.
fn moved_aside(path: &Path) -> std::io::Result<PathBuf> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let aside = path.with_file_name(format!("{name}.set-aside-{}", crate::util::random_hex(4)?));
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

/// The first file in `dir` someone holds a lock on now, named with its holder.
fn held_inside(dir: &Path) -> Option<String> {
    let entries = std::fs::read_dir(dir).ok()?;
    for e in entries.flatten().take(100_000) {
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(SAFE_FLAGS)
            .open(e.path())
        else {
            continue;
        };
        if file.metadata().is_ok_and(|m| m.is_file())
            && matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
        {
            return Some(format!(
                "{}, held by {}",
                e.path().display(),
                lock_holder(&file).unwrap_or_else(|| "a process".into())
            ));
        }
    }
    None
}

/// The mode of `select.lock` once set up: root's alone (see [`super::LockDir::open_select_lock`]).
pub const SELECT_MODE: u32 = 0o600;

/// A plain file of root's with `mode`. Another's, a link or a special file is
/// replaced, unless someone holds a lock on it now.
fn root_file(path: &Path, mode: u32, report: &mut Setup) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_file() && md.uid() == 0 => {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(SAFE_FLAGS)
                .open(path)?;
            // Narrowed, a file another user opened before keeps their descriptor (and
            // may be held through it): such a one is set aside like another's.
            if md.mode() & 0o777 != mode
                && mode & 0o077 == 0
                && matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
            {
                report.left.push(format!(
                    "{} is held by {}: run setup again once it is released",
                    path.display(),
                    lock_holder(&file).unwrap_or_else(|| "a process".into())
                ));
                return Ok(());
            }
            if md.mode() & 0o777 == mode || mode & 0o077 != 0 {
                file.set_permissions(std::fs::Permissions::from_mode(mode))?;
                return Ok(());
            }
            drop(file);
            // Made anew rather than narrowed: a descriptor someone opened on the old
            // file while anyone could would let them hold it still.
            std::fs::remove_file(path)?;
        }
        Ok(md) => {
            if md.is_file() {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(SAFE_FLAGS)
                    .open(path)?;
                if matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)) {
                    report.left.push(format!(
                        "{} ({}) is held by {}: run setup again once it is released",
                        path.display(),
                        ownership::owner_of(md.uid()),
                        lock_holder(&file).unwrap_or_else(|| "a process".into())
                    ));
                    return Ok(());
                }
            }
            // Unlinks the name itself (a link is not followed).
            std::fs::remove_file(path)?;
            report.done.push(format!(
                "replaced {} ({}{})",
                path.display(),
                ownership::owner_of(md.uid()),
                if md.is_file() { "" } else { ", no plain file" }
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let f: File = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(SAFE_FLAGS)
        .mode(mode)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    report.done.push(format!("made {}", path.display()));
    Ok(())
}
