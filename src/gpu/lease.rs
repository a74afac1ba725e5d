//! Leases: one lock file per GPU, named by UUID, held with `flock` for as long as the
//! lease lives and holding a JSON description of the holder.
//!
//! Sharing between users of one host: the lease directory (and its `queue/`) is created
//! with mode 1777 (world-writable, sticky, like /tmp) and every lock file with mode 0666,
//! so any user can open and lock any GPU's file while nobody can delete or replace
//! another user's file. Files are opened without `O_CREAT` first, because Linux's
//! `fs.protected_regular` refuses `O_CREAT` on another user's file in a sticky folder.
//! Lock files are never deleted: deleting a file someone has open would let two
//! processes lock two different files for one GPU.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use super::lockdir::{self, LockDirError};
use super::pool::PoolGpu;

/// Who holds a lease, for `gpu status` and waiting messages. Diagnostics only: the lock
/// itself is the truth.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub host: String,
    pub user: String,
    pub scope: Option<String>,
    pub run: Option<String>,
    pub batch: Option<String>,
    pub container: Option<String>,
    pub command: Option<String>,
    pub since: String,
    /// The queue place the lease was granted to: who overtook whom.
    #[serde(default)]
    pub ticket: Option<super::queue::Place>,
}

impl Holder {
    /// A holder description for this process.
    pub fn this_process() -> Holder {
        Holder {
            pid: std::process::id(),
            host: host_name(),
            user: nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| nix::unistd::getuid().to_string()),
            since: crate::units::rfc3339(std::time::SystemTime::now()),
            ..Holder::default()
        }
    }

    /// One short phrase: `pid 123 (alice, batch 4a)`.
    pub fn describe(&self) -> String {
        let mut parts = vec![self.user.clone()];
        if let Some(b) = &self.batch {
            parts.push(format!("batch {b}"));
        }
        if let Some(c) = &self.container {
            parts.push(format!("container {c}"));
        } else if let Some(c) = &self.command {
            let short: String = c.chars().take(40).collect();
            parts.push(format!("`{short}`"));
        }
        format!("pid {} ({})", self.pid, parts.join(", "))
    }
}

/// This host's name, as leases, containers and run records name it.
pub fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

/// A GPU's lease state, read without waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    Free,
    /// Locked; the holder's description when it could be read.
    Held(Option<Box<Holder>>),
}

/// The lease directory (`gpu.lock_dir`).
#[derive(Debug, Clone)]
pub struct LeaseDir {
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
pub(crate) fn open_shared_file(path: &Path) -> std::io::Result<File> {
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

impl LeaseDir {
    /// Opens (creating when missing) a lease directory on local disk.
    pub fn open(path: &Path, allow_network_fs: bool) -> Result<LeaseDir, LockDirError> {
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
            match lockdir::network_fs(path) {
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
        Ok(LeaseDir {
            path: path.to_path_buf(),
        })
    }

    /// The directory as it is, for reading lease states only: nothing is created, and
    /// a missing directory means no GPU is leased.
    pub fn existing(path: &Path) -> LeaseDir {
        LeaseDir {
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn gpu_file(&self, uuid: &str) -> PathBuf {
        self.path.join(format!("{uuid}.lock"))
    }

    /// Takes one GPU's lock without waiting; `None` when someone holds it.
    pub fn try_take(&self, uuid: &str) -> std::io::Result<Option<File>> {
        let f = open_shared_file(&self.gpu_file(uuid))?;
        match f.try_lock() {
            Ok(()) => Ok(Some(f)),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// Whether a GPU is leased, and by whom, without waiting and without keeping a lock.
    pub fn state(&self, uuid: &str) -> std::io::Result<LeaseState> {
        let path = self.gpu_file(uuid);
        let mut f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LeaseState::Free),
            Err(e) => return Err(e),
        };
        match f.try_lock_shared() {
            Ok(()) => Ok(LeaseState::Free),
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = f.read_to_string(&mut text);
                Ok(LeaseState::Held(
                    serde_json::from_str(text.trim()).ok().map(Box::new),
                ))
            }
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    pub fn is_free(&self, uuid: &str) -> bool {
        matches!(self.state(uuid), Ok(LeaseState::Free))
    }
}

/// A held lease on some GPUs. Dropping it releases them.
#[derive(Debug)]
pub struct Lease {
    gpus: Vec<PoolGpu>,
    files: Vec<File>,
}

impl Lease {
    pub(crate) fn new(gpus: Vec<PoolGpu>, files: Vec<File>) -> Lease {
        Lease { gpus, files }
    }

    pub fn gpus(&self) -> &[PoolGpu] {
        &self.gpus
    }

    pub fn uuids(&self) -> Vec<String> {
        self.gpus.iter().map(|g| g.uuid.clone()).collect()
    }

    /// Records who holds the lease in each lock file.
    pub fn set_holder(&mut self, holder: &Holder) -> std::io::Result<()> {
        let text = serde_json::to_string(holder).expect("holder serialises");
        for f in &mut self.files {
            f.set_len(0)?;
            f.rewind()?;
            f.write_all(text.as_bytes())?;
            f.write_all(b"\n")?;
        }
        Ok(())
    }

    /// The lock files' descriptors, for a child that must keep the lease alive as long
    /// as any of its processes lives (flock belongs to the open file description).
    pub fn fds(&self) -> Vec<RawFd> {
        self.files.iter().map(|f| f.as_raw_fd()).collect()
    }

    /// Releases the lease now.
    pub fn release(self) {
        drop(self);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        for f in &self.files {
            // Clear the holder so a stale description never outlives the lease; closing
            // the file (right after) is what releases the lock.
            let _ = f.set_len(0);
        }
    }
}
