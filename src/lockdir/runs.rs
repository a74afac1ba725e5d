//! Whether the run that made a container is still alive.
//!
//! A scope is shared: on GitHub Actions every job of a workflow run has the same one,
//! and several runners on one GPU host run those jobs at once. A sweep must therefore
//! remove only the containers of runs that are gone. Each run holds an exclusive
//! `flock` on `<lock_dir>/runs/<run>.lock` for as long as it may have containers; the
//! kernel drops it when the run's cibox exits or is killed, so a lock that can be taken
//! means the run is gone, the same proof the GPU leases rest on.
//!
//! A run that ends normally removes its file. A file whose lock is free is the record
//! of a run that died: only then can an orphaned container exist, which is what lets
//! `gpu exec` ask the engine only when there is reason to ([`crate::claims`]). The file
//! names the run's project and scope, so the sweep of that scope forgets the record
//! once none of the run's containers is left.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use super::LockDir;

/// Run IDs are 16 lowercase hex digits ([`crate::plan::new_run_id`]); anything else in a
/// label is not ours to interpret, let alone to turn into a path.
pub fn is_run_id(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn runs_dir(dir: &LockDir) -> PathBuf {
    dir.path().join("runs")
}

fn path(dir: &LockDir, run: &str) -> PathBuf {
    runs_dir(dir).join(format!("{run}.lock"))
}

/// What a run's file says of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunInfo {
    pub project: String,
    pub scope: String,
}

/// The lock a live run holds; dropped when the run ends (after its containers).
pub struct RunLock {
    path: PathBuf,
    _file: File,
    /// Keep the record when the run ends: a container of it could not be removed, and
    /// the record of a dead run is what gets it swept (and its GPUs counted busy).
    keep: std::cell::Cell<bool>,
}

impl RunLock {
    pub fn hold(dir: &LockDir, run: &str, info: &RunInfo) -> std::io::Result<RunLock> {
        debug_assert!(is_run_id(run));
        let path = path(dir, run);
        // Readable by all, so another user's sweep can test the lock.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)?;
        file.lock()?;
        file.write_all(&serde_json::to_vec(info).expect("run info serialises"))?;
        Ok(RunLock {
            path,
            _file: file,
            keep: std::cell::Cell::new(false),
        })
    }
}

impl RunLock {
    /// Leaves the record behind when the run ends (unlocked: a dead run's).
    pub fn leave_record(&self) {
        self.keep.set(true);
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        if !self.keep.get() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What the lock dir says of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Its cibox holds its lock.
    Alive,
    /// Its record is there and nobody holds it: its cibox died.
    Dead,
    /// No record of it here (it used another lock dir, or this is no cibox's file):
    /// it cannot be judged, and counts as alive.
    Unknown,
}

/// What `dir` says of run `run` (a valid run ID).
pub fn liveness(dir: &LockDir, run: &str) -> std::io::Result<Liveness> {
    let file = match super::open_read(&path(dir, run)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Liveness::Unknown),
        // A run's record is a plain file it made itself, which nobody else can replace
        // in the sticky runs/; anything else under its name is no run's record.
        Err(e) if super::is_planted(&e) => return Ok(Liveness::Unknown),
        Err(e) => return Err(e),
    };
    match file.try_lock_shared() {
        Err(TryLockError::WouldBlock) => Ok(Liveness::Alive),
        Err(TryLockError::Error(e)) => Err(e),
        Ok(()) => Ok(Liveness::Dead),
    }
}

/// The record of a run whose cibox is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadRun {
    pub run: String,
    /// What the record says (`None` when it cannot be read).
    pub info: Option<RunInfo>,
    /// Who wrote the record: `runs/` is writable by every user, so only root's records
    /// and the caller's own are more than somebody's word.
    pub owner: u32,
}

impl DeadRun {
    /// Written by root or by the calling user.
    pub fn vouched_for(&self) -> bool {
        super::vouched_for(self.owner)
    }
}

/// The runs recorded in `runs/` whose cibox is gone.
pub fn dead_runs(dir: &LockDir) -> std::io::Result<Vec<DeadRun>> {
    let entries = match std::fs::read_dir(runs_dir(dir)) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut dead = Vec::new();
    for e in entries {
        let e = e?;
        let name = e.file_name();
        let Some(run) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".lock"))
            .filter(|r| is_run_id(r))
        else {
            continue;
        };
        let mut file = match super::open_read(&e.path()) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // just ended
            Err(e) if super::is_planted(&e) => continue,                    // not a run's record
            Err(e) => return Err(e),
        };
        let owner = std::os::unix::fs::MetadataExt::uid(&file.metadata()?);
        match file.try_lock_shared() {
            Err(TryLockError::WouldBlock) => continue,
            Err(TryLockError::Error(e)) => return Err(e),
            Ok(()) => {
                let mut text = String::new();
                // A record is a few dozen bytes.
                let info = (&mut file)
                    .take(64 * 1024)
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| serde_json::from_str(&text).ok());
                dead.push(DeadRun {
                    run: run.to_string(),
                    info,
                    owner,
                });
            }
        }
    }
    Ok(dead)
}

/// Forgets a dead run's record (none of its containers is left).
pub fn forget(dir: &LockDir, run: &str) {
    let _ = std::fs::remove_file(path(dir, run));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> RunInfo {
        RunInfo {
            project: "p".into(),
            scope: "s".into(),
        }
    }

    #[test]
    fn a_held_run_is_alive_and_a_dead_one_is_listed_until_forgotten() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LockDir::open(tmp.path(), false).unwrap();
        let run = "0123456789abcdef";
        assert_eq!(liveness(&dir, run).unwrap(), Liveness::Unknown);
        let lock = RunLock::hold(&dir, run, &info()).unwrap();
        assert_eq!(liveness(&dir, run).unwrap(), Liveness::Alive);
        assert!(dead_runs(&dir).unwrap().is_empty());
        drop(lock);
        assert_eq!(
            liveness(&dir, run).unwrap(),
            Liveness::Unknown,
            "ended: no record"
        );
        assert!(
            dead_runs(&dir).unwrap().is_empty(),
            "a run that ended is no record"
        );
        // A killed run leaves its file, unlocked: a dead run, until a sweep forgets it.
        std::fs::write(path(&dir, run), serde_json::to_vec(&info()).unwrap()).unwrap();
        assert_eq!(liveness(&dir, run).unwrap(), Liveness::Dead);
        let owner = nix::unistd::geteuid().as_raw();
        assert_eq!(
            dead_runs(&dir).unwrap(),
            [DeadRun {
                run: run.to_string(),
                info: Some(info()),
                owner
            }]
        );
        forget(&dir, run);
        assert!(dead_runs(&dir).unwrap().is_empty());
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
