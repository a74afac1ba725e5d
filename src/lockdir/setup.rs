//! `cibox host setup`: the lock dir made once, by root, so that nobody else owns
//! anything a lease depends on. The folder, `queue/` and `runs/` are root's (mode 1777,
//! sticky: anyone may add a ticket or a run's record, nobody may remove another's), and
//! so are `select.lock`, `queue.seq`, `probe.lock` and each GPU's lock file (mode 0666:
//! anyone may lock them, only root may remove or replace them). A file another user
//! made is replaced, unless it is locked now: then it is named and left.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::{LockDirError, SAFE_FLAGS, lock_holder};
use crate::ownership;

/// What setting up the lock dir did.
#[derive(Debug, Default)]
pub struct Setup {
    /// What was made, replaced or taken over, one line each.
    pub done: Vec<String>,
    /// Files left as they are because someone holds them now, with who.
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
    }
    for sub in [dir.to_path_buf(), dir.join("queue"), dir.join("runs")] {
        root_folder(&sub, &mut report).map_err(|e| err(&sub.display().to_string(), e))?;
    }
    let names = ["select.lock", "queue.seq", "probe.lock"]
        .into_iter()
        .map(str::to_string)
        .chain(gpu_uuids.iter().map(|u| format!("{u}.lock")));
    for name in names {
        let path = dir.join(&name);
        root_file(&path, &mut report).map_err(|e| err(&name, e))?;
    }
    Ok(report)
}

/// A folder of root's with mode 1777; one that is a link, or not a folder, is replaced.
fn root_folder(path: &Path, report: &mut Setup) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => {
            if md.uid() != 0 || md.gid() != 0 {
                report.done.push(format!(
                    "took over {} ({})",
                    path.display(),
                    ownership::owner_of(md.uid())
                ));
            }
        }
        Ok(_) => {
            std::fs::remove_file(path)?;
            report
                .done
                .push(format!("removed {}, which was no folder", path.display()));
            std::fs::create_dir(path)?;
            report.done.push(format!("made {}", path.display()));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(path)?;
            report.done.push(format!("made {}", path.display()));
        }
        Err(e) => return Err(e),
    }
    std::os::unix::fs::lchown(path, Some(0), Some(0))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1777))
}

/// A plain file of root's with mode 0666. Another's, a link or a special file is
/// replaced, unless someone holds a lock on it now.
fn root_file(path: &Path, report: &mut Setup) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_file() && md.uid() == 0 && md.nlink() == 1 => {}
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
    if std::fs::symlink_metadata(path).is_err() {
        let f: File = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(SAFE_FLAGS)
            .mode(0o666)
            .open(path)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o666))?;
        report.done.push(format!("made {}", path.display()));
    }
    Ok(())
}
