//! One probe serves many (docs/interface.md §6).
//!
//! A hand-out needs a probe that started after its GPUs were locked. Waiters served at
//! once each need one, and with a slow nvidia-smi each would cost a process start. So
//! they take turns under `probe.lock` in the lock dir: under it, the last result
//! (`probe.json`: which backend, when it started, what it said) serves every waiter that
//! locked its GPUs before that probe started; otherwise the waiter probes and leaves its
//! result for the ones after it.
//!
//! Anyone who may write the lock dir may write there, and a forged "idle" would hand
//! out a busy GPU. So a result counts only from a plain file of the caller's own or
//! root's, writable by nobody else; any other is ignored and the waiter probes itself.
//! Sharing is only ever a saving: when the lock or the file cannot be used, each waiter
//! probes on its own.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use super::{ComputeApp, GpuState, HostInstant, ProbeError, Reading};
use crate::lockdir::{lock_until, open_read, open_shared_file};

const LOCK: &str = "probe.lock";
const RESULT: &str = "probe.json";
/// A result file larger than this is not one cibox wrote (a thousand GPUs fit).
const MAX_RESULT: u64 = 4 << 20;

#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    backend: String,
    started: HostInstant,
    outcome: Outcome,
}

#[derive(serde::Serialize, serde::Deserialize)]
enum Outcome {
    Read {
        gpus: Vec<GpuState>,
        apps: Vec<ComputeApp>,
    },
    Failed(String),
}

/// A reading from a probe of `backend` that started at `since` or later: another
/// waiter's, or ours (`own`), left for the others.
pub fn probe(
    dir: &Path,
    backend: &str,
    since: HostInstant,
    timeout: Duration,
    own: impl FnOnce() -> Result<Reading, ProbeError>,
) -> Result<Reading, ProbeError> {
    let Ok(lock) = open_shared_file(&dir.join(LOCK)) else {
        return own();
    };
    // A holder is done within one probe timeout; one that holds the lock longer is
    // stuck or hostile, and we probe alone.
    if lock_until(&lock, Instant::now() + timeout).is_err() {
        return own();
    }
    if let Some(r) = read_trusted(&dir.join(RESULT))
        && r.backend == backend
        && r.started >= since
    {
        return match r.outcome {
            Outcome::Read { gpus, apps } => Ok((gpus, apps)),
            Outcome::Failed(message) => Err(ProbeError::Shared(message)),
        };
    }
    let started = HostInstant::now();
    let result = own();
    if let Some(started) = started {
        let outcome = match &result {
            Ok((gpus, apps)) => Outcome::Read {
                gpus: gpus.clone(),
                apps: apps.clone(),
            },
            Err(e) => Outcome::Failed(e.to_string()),
        };
        let record = Record {
            backend: backend.to_string(),
            started,
            outcome,
        };
        // Not being able to leave it only costs the next waiter a probe.
        let _ = write(dir, &record);
    }
    drop(lock);
    result
}

/// The record at `path` if it is one cibox of this user (or root) left.
fn read_trusted(path: &Path) -> Option<Record> {
    let file = open_read(path).ok()?;
    let md = file.metadata().ok()?;
    let me = nix::unistd::geteuid().as_raw();
    let owner_ok = md.uid() == me || md.uid() == 0;
    if !owner_ok || md.mode() & 0o022 != 0 || md.nlink() != 1 || md.len() > MAX_RESULT {
        return None;
    }
    let mut text = Vec::new();
    file.take(MAX_RESULT).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Replaces the record whole (a reader sees the old one or the new one).
fn write(dir: &Path, record: &Record) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix(".probe.")
        .tempfile_in(dir)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.write_all(&serde_json::to_vec(record).map_err(std::io::Error::other)?)?;
    tmp.persist(dir.join(RESULT)).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const U0: &str = "GPU-2f8b7c1e-0000-4a4a-9c9c-000000000000";

    fn reading(used: u64) -> Reading {
        (
            vec![GpuState {
                index: 0,
                uuid: U0.into(),
                memory_used_mib: used,
                memory_total_mib: 81559,
                utilization: 0,
            }],
            Vec::new(),
        )
    }

    #[test]
    fn a_probe_that_started_after_since_serves_the_next_waiter() {
        let tmp = tempfile::tempdir().unwrap();
        let calls = Cell::new(0);
        let own = |used| {
            calls.set(calls.get() + 1);
            Ok(reading(used))
        };
        let before = HostInstant::now().unwrap();
        let t = Duration::from_secs(5);
        let first = probe(tmp.path(), "smi", before, t, || own(1)).unwrap();
        assert_eq!(first.0[0].memory_used_mib, 1);
        // Locked before that probe started: served by it.
        let second = probe(tmp.path(), "smi", before, t, || own(2)).unwrap();
        assert_eq!((second.0[0].memory_used_mib, calls.get()), (1, 1));
        // Locked after it started: needs its own.
        let later = HostInstant::now().unwrap();
        let third = probe(tmp.path(), "smi", later, t, || own(3)).unwrap();
        assert_eq!((third.0[0].memory_used_mib, calls.get()), (3, 2));
        // Another backend's result never serves.
        let fourth = probe(tmp.path(), "nvml", before, t, || own(4)).unwrap();
        assert_eq!((fourth.0[0].memory_used_mib, calls.get()), (4, 3));
    }

    #[test]
    fn a_shared_failure_fails_the_waiters_it_serves() {
        let tmp = tempfile::tempdir().unwrap();
        let since = HostInstant::now().unwrap();
        let t = Duration::from_secs(5);
        let failed = probe(tmp.path(), "smi", since, t, || {
            Err(ProbeError::Shared("GPU probe: it broke".into()))
        });
        assert!(failed.is_err());
        let served = probe(tmp.path(), "smi", since, t, || Ok(reading(0)));
        assert_eq!(served.unwrap_err().to_string(), "GPU probe: it broke");
    }

    #[test]
    fn a_result_others_could_have_written_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let since = HostInstant::now().unwrap();
        let t = Duration::from_secs(5);
        probe(tmp.path(), "smi", since, t, || Ok(reading(1))).unwrap();
        let path = tmp.path().join(RESULT);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mine = probe(tmp.path(), "smi", since, t, || Ok(reading(2))).unwrap();
        assert_eq!(
            mine.0[0].memory_used_mib, 2,
            "a world-writable result is not trusted"
        );
        // A symbolic link in its place is not followed.
        std::fs::remove_file(&path).unwrap();
        let elsewhere = tmp.path().join("elsewhere.json");
        std::fs::write(&elsewhere, b"{}").unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let mine = probe(tmp.path(), "smi", since, t, || Ok(reading(3))).unwrap();
        assert_eq!(mine.0[0].memory_used_mib, 3);
    }
}
