//! The shared lock directory (`gpu.lock_dir`, by default `/run/lock/cibox`): one folder
//! that every cibox on the host uses for GPU leases (`<UUID>.lock`, [`crate::gpu::lease`]),
//! the fair queue (`queue/`, `queue.seq`, [`crate::gpu::queue`]), the decision lock
//! (`select.lock`) and run locks (`runs/`, [`runs`]). This module
//! owns its layout and sharing rules; see docs/interface.md §11.
//!
//! It must be on local disk: `flock` over NFS or SMB is emulated, or not shared between
//! clients at all, so two hosts (or one host after a server hiccup) could both believe
//! they hold the same GPU.
//!
//! Sharing between users of one host: the directory (and its `queue/` and `runs/`) is
//! created with mode 1777 (world-writable, sticky, like /tmp) and every lock file with
//! mode 0666, so any user can open and lock any file while nobody can delete or replace
//! another user's file. Files are opened without `O_CREAT` first, because Linux's
//! `fs.protected_regular` refuses `O_CREAT` on another user's file in a sticky folder.

pub mod runs;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::exit::Failure;

/// File systems whose `flock` cannot be trusted for leases.
const NETWORK_FS: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x517B, "SMB"),
    (0x5346_414F, "AFS"),
    (0x00C3_6400, "Ceph"),
    (0x0102_1997, "9P"),
    (0x6573_5546, "FUSE"),
];

/// Why a lock directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LockDirError {
    #[error(
        "lock dir {dir}: on a network file system ({fs}); flock is not reliable there: put gpu.lock_dir on local disk"
    )]
    Network { dir: String, fs: &'static str },
    #[error("lock dir {dir}: {reason}")]
    Unusable { dir: String, reason: String },
}

impl LockDirError {
    /// A lock dir that cannot be used is configuration (`gpu.lock_dir`), like a bad
    /// pool entry.
    pub fn failure(&self) -> Failure {
        Failure::Usage
    }
}

/// The nearest folder that exists: the lock dir itself, or the parent it will be made in.
fn existing_ancestor(dir: &Path) -> PathBuf {
    let mut p = dir.to_path_buf();
    while !p.exists() {
        match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => p = parent.to_path_buf(),
            _ => return PathBuf::from("."),
        }
    }
    p
}

/// Names the network file system `path` lives on, if any.
pub fn network_fs(path: &Path) -> Result<Option<&'static str>, std::io::Error> {
    let st = nix::sys::statfs::statfs(path).map_err(std::io::Error::from)?;
    let magic = st.filesystem_type().0 as i64;
    Ok(NETWORK_FS
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, name)| *name))
}

/// Checks that `dir` is (or can become) a local, writable folder. Returns a short
/// description for reports.
pub fn check(dir: &Path) -> Result<String, LockDirError> {
    let shown = dir.display().to_string();
    let unusable = |reason: String| LockDirError::Unusable {
        dir: shown.clone(),
        reason,
    };
    let at = existing_ancestor(dir);
    if !at.is_dir() {
        return Err(unusable(format!("{} is not a directory", at.display())));
    }
    match network_fs(&at) {
        Ok(Some(fs)) => {
            return Err(LockDirError::Network {
                dir: shown.clone(),
                fs,
            });
        }
        Ok(None) => {}
        Err(e) => return Err(unusable(format!("cannot stat its file system: {e}"))),
    }
    let probe = at.join(format!(".cibox-write-check-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) => {
            return Err(unusable(format!(
                "{} is not writable ({e}); create it with mode 1777 or run as a user who may write there",
                at.display()
            )));
        }
    }
    Ok(if at == dir {
        format!("{shown}: local, writable")
    } else {
        format!(
            "{shown}: does not exist yet; will be created in {} (local, writable)",
            at.display()
        )
    })
}

/// The shared lock directory (`gpu.lock_dir`): GPU leases, the queue, run locks.
#[derive(Debug, Clone)]
pub struct LockDir {
    path: PathBuf,
}

fn create_shared_dir(path: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(path) {
        Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1777)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens `path` read-write, creating it with mode 0666 when it does not exist.
pub fn open_shared_file(path: &Path) -> std::io::Result<File> {
    loop {
        match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => return Ok(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o666)
            .open(path)
        {
            Ok(f) => {
                // The umask may have narrowed the mode; other users must be able to lock.
                f.set_permissions(std::fs::Permissions::from_mode(0o666))?;
                return Ok(f);
            }
            // Someone else created it between our two opens: open theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

impl LockDir {
    /// Opens (creating when missing) a lease directory on local disk.
    pub fn open(path: &Path, allow_network_fs: bool) -> Result<LockDir, LockDirError> {
        let shown = path.display().to_string();
        let unusable = |reason: String| LockDirError::Unusable {
            dir: shown.clone(),
            reason,
        };
        if !path.exists() {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| unusable(format!("cannot create {}: {e}", parent.display())))?;
            }
            create_shared_dir(path).map_err(|e| unusable(format!("cannot create it: {e}")))?;
        }
        if !path.is_dir() {
            return Err(unusable("exists and is not a directory".into()));
        }
        if !allow_network_fs {
            match network_fs(path) {
                Ok(Some(fs)) => return Err(LockDirError::Network { dir: shown, fs }),
                Ok(None) => {}
                Err(e) => return Err(unusable(format!("cannot stat its file system: {e}"))),
            }
        }
        for sub in ["queue", "runs"] {
            create_shared_dir(&path.join(sub))
                .map_err(|e| unusable(format!("cannot create {sub}/: {e}")))?;
        }
        // A lease needs to write its lock files; find out now rather than mid-wait.
        let probe = path.join("queue.seq");
        open_shared_file(&probe).map_err(|e| {
            unusable(format!(
                "not writable ({e}); make it mode 1777 or run as a user who may write there"
            ))
        })?;
        Ok(LockDir {
            path: path.to_path_buf(),
        })
    }

    /// The directory as it is, for reading lease states only: nothing is created, and
    /// a missing directory means no GPU is leased.
    pub fn existing(path: &Path) -> LockDir {
        LockDir {
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}
