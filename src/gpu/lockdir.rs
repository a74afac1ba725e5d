//! The lease directory must be on local disk: `flock` over NFS or SMB is emulated, or
//! not shared between clients at all, so two hosts (or one host after a server
//! hiccup) could both believe they hold the same GPU.

use std::path::{Path, PathBuf};

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
