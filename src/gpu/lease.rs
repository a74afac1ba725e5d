//! Leases: one lock file per unit in the lock directory ([`crate::lockdir`]), named by
//! its UUID, held with `flock` for as long as the lease lives and holding a JSON
//! description of the holder. Lock files are never deleted: deleting a file someone has
//! open would let two processes lock two different files for one GPU.
//!
//! A MIG slice is a unit of its own, and its GPU too: a lease of a slice holds the
//! slice's file exclusively and its GPU's file shared; a lease of the whole GPU holds
//! the GPU's file exclusively. So the kernel never grants a GPU whole while one of its
//! slices is leased, nor a slice while its GPU is, whatever each leaser's probe said
//! (MIG mode switched between two probes, `--devices` naming the GPU).

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::PathBuf;

use super::pool::PoolGpu;
use crate::lockdir::LockDir;

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
            host: crate::util::host_name(),
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

/// A GPU's lease state, read without waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    Free,
    /// Locked; the holder's description when it could be read.
    Held(Option<Box<Holder>>),
}

/// A GPU's lock file, named by its UUID.
impl LockDir {
    fn gpu_file(&self, uuid: &str) -> PathBuf {
        self.path().join(format!("{uuid}.lock"))
    }

    /// The file a GPU's lock lives on, for asking the kernel who holds it.
    pub fn lock_file_key(&self, uuid: &str) -> Option<crate::lockdir::FileKey> {
        std::fs::symlink_metadata(self.gpu_file(uuid))
            .ok()
            .map(|m| crate::lockdir::FileKey::of(&m))
    }

    /// Takes one GPU's lock without waiting; `None` when someone holds it.
    pub fn try_take(&self, uuid: &str) -> std::io::Result<Option<File>> {
        self.try_lock_file(uuid, true)
    }

    /// Takes a unit's locks without waiting: a GPU's file exclusively, or a slice's
    /// exclusively and its GPU's shared (the second file). `None` when either is held.
    pub fn try_take_unit(&self, g: &PoolGpu) -> std::io::Result<Option<(File, Option<File>)>> {
        let guard = match &g.parent {
            None => None,
            Some(parent) => match self.try_lock_file(parent, false)? {
                Some(f) => Some(f),
                None => return Ok(None),
            },
        };
        Ok(self.try_take(&g.uuid)?.map(|own| (own, guard)))
    }

    fn try_lock_file(&self, uuid: &str, exclusive: bool) -> std::io::Result<Option<File>> {
        let name = format!("{uuid}.lock");
        let f = self.open_lock_file(&name)?;
        let locked = if exclusive {
            f.try_lock()
        } else {
            f.try_lock_shared()
        };
        match locked {
            // Still the file at its path once locked: a lock on one removed or replaced
            // meanwhile would exclude nobody.
            Ok(()) if crate::lockdir::still_at(&f, &self.path().join(&name)) => Ok(Some(f)),
            Ok(()) => Ok(None),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// A unit's lease state: its own, or, for a slice whose GPU is leased whole, the
    /// GPU's. (A GPU whose slices are leased reads free here; its exclusive lock is
    /// refused all the same.)
    pub fn state_of(&self, g: &PoolGpu) -> std::io::Result<LeaseState> {
        match (self.state(&g.uuid)?, &g.parent) {
            (LeaseState::Free, Some(parent)) => self.state(parent),
            (own, _) => Ok(own),
        }
    }

    /// Who holds a GPU's lock as the kernel says (for a lock file that names no holder:
    /// a lock taken outside cibox, or a holder's words that cannot be read).
    pub fn kernel_holder(&self, uuid: &str) -> Option<String> {
        let f = crate::lockdir::open_read(&self.gpu_file(uuid)).ok()?;
        crate::lockdir::lock_holder(&f)
    }

    /// Who holds the slices of GPU `uuid`, when its own file reads free but some of its
    /// slices are leased (each such lease holds the GPU's file shared, so the kernel
    /// names their takers): `(slice MIG-…) pid 42 (ci, `sleep 60`)`, from the holder
    /// each slice's file names, else as the kernel names the GPU file's taker. `None`
    /// when nobody holds the GPU's file.
    pub fn slice_holders(&self, uuid: &str) -> Option<String> {
        let key = self.lock_file_key(uuid)?;
        let locks = crate::lockdir::Locks::read();
        let takers = locks.takers(key);
        if takers.is_empty() {
            return None;
        }
        let mut named: Vec<String> = std::fs::read_dir(self.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let slice = name.strip_suffix(".lock")?;
                if !slice.starts_with("MIG-") {
                    return None;
                }
                match self.state(slice) {
                    Ok(LeaseState::Held(Some(h))) if takers.contains(&h.pid) => {
                        Some(format!("(slice {slice}) {}", h.describe()))
                    }
                    _ => None,
                }
            })
            .collect();
        named.sort();
        if named.is_empty() {
            return self.kernel_holder(uuid);
        }
        Some(named.join(" and "))
    }

    /// Whether a GPU is leased, and by whom, without waiting and without keeping a lock.
    pub fn state(&self, uuid: &str) -> std::io::Result<LeaseState> {
        let path = self.gpu_file(uuid);
        let mut f = match crate::lockdir::open_read(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LeaseState::Free),
            Err(e) => return Err(e),
        };
        match f.try_lock_shared() {
            Ok(()) => Ok(LeaseState::Free),
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                // A holder is a few hundred bytes; a bigger file is no holder.
                let _ = (&mut f).take(64 * 1024).read_to_string(&mut text);
                Ok(LeaseState::Held(
                    serde_json::from_str(text.trim()).ok().map(Box::new),
                ))
            }
            Err(TryLockError::Error(e)) => Err(e),
        }
    }
}

/// A held lease on some GPUs. Dropping it releases them.
#[derive(Debug)]
pub struct Lease {
    gpus: Vec<PoolGpu>,
    /// Each unit's own lock, held exclusively, naming the holder.
    files: Vec<File>,
    /// The shared locks on the GPUs of leased slices: they name nobody.
    guards: Vec<File>,
}

impl Lease {
    #[cfg(test)]
    pub(crate) fn new(gpus: Vec<PoolGpu>, files: Vec<File>) -> Lease {
        Lease {
            gpus,
            files,
            guards: Vec::new(),
        }
    }

    /// A lease whose slices also hold their GPUs' files shared (`guards`).
    pub(crate) fn with_guards(gpus: Vec<PoolGpu>, files: Vec<File>, guards: Vec<File>) -> Lease {
        Lease {
            gpus,
            files,
            guards,
        }
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
        self.files
            .iter()
            .chain(&self.guards)
            .map(|f| f.as_raw_fd())
            .collect()
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
