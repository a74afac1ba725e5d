//! Whether the run that made a container is still alive.
//!
//! A scope is shared: on GitHub Actions every job of a workflow run has the same one,
//! and several runners on one GPU host run those jobs at once. A sweep must therefore
//! remove only the containers of runs that are gone. Each run holds an exclusive
//! `flock` on `<lock_dir>/runs/<run>.lock` for as long as it may have containers; the
//! kernel drops it when the run's cibox exits or is killed, so a lock that can be taken
//! means the run is gone, the same proof the GPU leases rest on.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::gpu::lease::LeaseDir;

/// Run IDs are 16 lowercase hex digits ([`super::new_run_id`]); anything else in a
/// label is not ours to interpret, let alone to turn into a path.
pub fn is_run_id(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn path(dir: &LeaseDir, run: &str) -> PathBuf {
    dir.path().join("runs").join(format!("{run}.lock"))
}

/// The lock a live run holds; dropped when the run ends (after its containers).
pub struct RunLock {
    path: PathBuf,
    _file: File,
}

impl RunLock {
    pub fn hold(dir: &LeaseDir, run: &str) -> std::io::Result<RunLock> {
        debug_assert!(is_run_id(run));
        let path = path(dir, run);
        // Readable by all, so another user's sweep can test the lock.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)?;
        file.lock()?;
        Ok(RunLock { path, _file: file })
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether run `run` (a valid run ID) is alive on this host.
pub fn is_alive(dir: &LeaseDir, run: &str) -> std::io::Result<bool> {
    let path = path(dir, run);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match file.try_lock_shared() {
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(e)) => Err(e),
        Ok(()) => {
            // A run that was killed leaves its file; tidy it when we may.
            let _ = std::fs::remove_file(&path);
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_run_is_alive_and_a_released_one_is_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LeaseDir::open(tmp.path(), false).unwrap();
        let run = "0123456789abcdef";
        assert!(!is_alive(&dir, run).unwrap());
        let lock = RunLock::hold(&dir, run).unwrap();
        assert!(is_alive(&dir, run).unwrap());
        drop(lock);
        assert!(!is_alive(&dir, run).unwrap());
        // A killed run leaves its file, unlocked: gone, and the file is tidied.
        std::fs::write(path(&dir, run), "").unwrap();
        assert!(!is_alive(&dir, run).unwrap());
        assert!(!path(&dir, run).exists());
    }

    #[test]
    fn only_run_ids_are_run_ids() {
        assert!(is_run_id("0123456789abcdef"));
        for bad in [
            "",
            "0123456789ABCDEF",
            "../../etc/passw",
            "0123456789abcde",
            "0123456789abcdefa",
        ] {
            assert!(!is_run_id(bad), "{bad}");
        }
    }
}
