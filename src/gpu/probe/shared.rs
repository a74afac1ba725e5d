//! One probe serves many (docs/interface.md §6).
//!
//! A hand-out needs a probe that started after its GPUs were locked. Waiters served at
//! once each need one, and with a slow nvidia-smi each would cost a process start. So a
//! waiter that finds `probe.lock` free takes it, notes in `probe.started` when its probe
//! starts, probes, and leaves the reading in `probe.json` for the others. A waiter that
//! finds the lock taken by a probe that started after its own GPUs were locked waits for
//! that probe and takes its reading; one whose GPUs were locked after that probe started
//! cannot use it, and probes at once on its own instead of queueing behind it. A free
//! lock with a fresh enough `probe.json` serves too.
//!
//! The start is read on the monotonic clock, which is one clock for the processes of one
//! boot and one time namespace: a record counts only from the same boot (the kernel's
//! boot id) and time namespace, and never when it claims to have started after now.
//! It counts only when it shows the GPUs the waiter itself saw (a cibox in a container
//! may see fewer). Failures are not shared: they may be one process's own (a short
//! timeout, a killed child), and each waiter finds out for itself.
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

use super::error::ProbeError;
use super::reading::{ComputeApp, GpuState, HostInstant, Reading};
use crate::lockdir::{LockWait, lock_until, open_read, open_shared_file, vouched_for};

const LOCK: &str = "probe.lock";
const RESULT: &str = "probe.json";
/// A result file larger than this is not one cibox wrote (a thousand GPUs fit).
const MAX_RESULT: u64 = 4 << 20;

const STARTED: &str = "probe.started";

/// Where and when a probe started: the record of one in flight, and the head of one
/// done.
#[derive(serde::Serialize, serde::Deserialize, PartialEq, Eq)]
struct Start {
    backend: String,
    /// Where `started` was read: the boot, the time and the mount namespace.
    clock: String,
    started: HostInstant,
}

impl Start {
    /// Whether a probe that started so serves a waiter whose GPUs were locked at
    /// `since`: same backend, same clock, not before `since`, not after now.
    fn serves(&self, backend: &str, clock: &str, since: HostInstant) -> bool {
        self.backend == backend
            && self.clock == clock
            && self.started >= since
            && HostInstant::now().is_some_and(|now| self.started <= now)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    #[serde(flatten)]
    start: Start,
    gpus: Vec<GpuState>,
    apps: Vec<ComputeApp>,
}

/// The boot and time namespace this process reads the monotonic clock in, and the
/// mount namespace it sees the GPUs' device files in (a cibox in a container may see
/// fewer GPUs than one on the host).
fn clock_identity() -> Option<String> {
    // Fixed for the life of the process: read once, not on every hand-out.
    static IDENTITY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    IDENTITY.get_or_init(read_clock_identity).clone()
}

fn read_clock_identity() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    // Kernels without time namespaces have no such link: one clock for all.
    let time = std::fs::read_link("/proc/self/ns/time")
        .map(|l| l.display().to_string())
        .unwrap_or_default();
    let mnt = std::fs::read_link("/proc/self/ns/mnt").ok()?;
    Some(format!("{} {time} {}", boot.trim(), mnt.display()))
}

/// A reading from a probe of `backend` that started at `since` or later and that
/// `fits` (the GPUs the caller sees): another waiter's, or ours (`own`), left for the
/// others.
pub fn probe(
    dir: &Path,
    backend: &str,
    since: HostInstant,
    timeout: Duration,
    fits: impl Fn(&Reading) -> bool,
    own: impl FnOnce() -> Result<Reading, ProbeError>,
) -> Result<Reading, ProbeError> {
    let (Ok(lock), Some(clock)) = (open_shared_file(&dir.join(LOCK)), clock_identity()) else {
        return own();
    };
    let done = |since| {
        read_trusted::<Record>(&dir.join(RESULT))
            .filter(|r| r.start.serves(backend, &clock, since))
            .map(|r| (r.gpus, r.apps))
            .filter(&fits)
    };
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            // A probe is under way. Only one that started after our GPUs were locked
            // can serve us: wait for it (a holder is done within one probe timeout;
            // past that it is stuck or hostile). Any other: probe now, on our own.
            let in_flight = read_trusted::<Start>(&dir.join(STARTED))
                .is_some_and(|s| s.serves(backend, &clock, since));
            if !in_flight {
                return own();
            }
            match lock_until(&lock, Instant::now() + timeout) {
                Ok(()) => {}
                Err(LockWait::Interrupted(sig)) => return Err(ProbeError::Interrupted(sig)),
                Err(LockWait::TimedOut | LockWait::Io(_)) => return own(),
            }
        }
        Err(std::fs::TryLockError::Error(_)) => return own(),
    }
    if let Some(reading) = done(since) {
        return Ok(reading);
    }
    let Some(started) = HostInstant::now() else {
        return own();
    };
    let start = Start {
        backend: backend.to_string(),
        clock,
        started,
    };
    // Not being able to leave these only costs others a probe of their own.
    remove_stale_temps(dir);
    let _ = write(dir, STARTED, &start);
    let result = own();
    if let Ok((gpus, apps)) = &result {
        let record = Record {
            start,
            gpus: gpus.clone(),
            apps: apps.clone(),
        };
        let _ = write(dir, RESULT, &record);
    }
    drop(lock);
    result
}

/// The record at `path` if it is one cibox of this user (or root) left.
fn read_trusted<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let file = open_read(path).ok()?;
    let md = file.metadata().ok()?;
    if !vouched_for(md.uid()) || md.mode() & 0o022 != 0 || md.nlink() != 1 || md.len() > MAX_RESULT
    {
        return None;
    }
    let mut text = Vec::new();
    file.take(MAX_RESULT).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
}

/// How old a `.probe.*` temp file must be to count as left by a writer that was killed
/// between making it and renaming it into place (a write takes milliseconds).
const STALE_TEMP: Duration = Duration::from_secs(60);

/// Removes the `.probe.*` temp files of our uid older than [`STALE_TEMP`]: a writer
/// killed mid-write leaves one, and nothing else ever would. Only the holder of `probe.lock` writes, so one younger is at most a writer's at work
/// now; it is left. Plain files only, never followed; failures only leave them.
fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let me = nix::unistd::geteuid().as_raw();
    for entry in entries.flatten() {
        if !entry.file_name().as_encoded_bytes().starts_with(b".probe.") {
            continue;
        }
        let Ok(md) = entry.metadata() else { continue };
        let old = md
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > STALE_TEMP);
        if md.file_type().is_file() && md.uid() == me && old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Replaces the record whole (a reader sees the old one or the new one).
fn write(dir: &Path, name: &str, record: &impl serde::Serialize) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix(".probe.")
        .tempfile_in(dir)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.write_all(&serde_json::to_vec(record).map_err(std::io::Error::other)?)?;
    tmp.persist(dir.join(name)).map_err(|e| e.error)?;
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
                parent: None,
                memory_used_mib: used,
                memory_total_mib: 81559,
                utilization: Some(0),
                sick: None,
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
        let any = |_: &Reading| true;
        let first = probe(tmp.path(), "smi", before, t, any, || own(1)).unwrap();
        assert_eq!(first.0[0].memory_used_mib, 1);
        // Locked before that probe started: served by it.
        let second = probe(tmp.path(), "smi", before, t, any, || own(2)).unwrap();
        assert_eq!((second.0[0].memory_used_mib, calls.get()), (1, 1));
        // Locked after it started: needs its own.
        let later = HostInstant::now().unwrap();
        let third = probe(tmp.path(), "smi", later, t, any, || own(3)).unwrap();
        assert_eq!((third.0[0].memory_used_mib, calls.get()), (3, 2));
        // Another backend's result never serves.
        let fourth = probe(tmp.path(), "nvml", before, t, any, || own(4)).unwrap();
        assert_eq!((fourth.0[0].memory_used_mib, calls.get()), (4, 3));
        // Nor one that shows other GPUs than the caller sees.
        let none = |_: &Reading| false;
        let fifth = probe(tmp.path(), "nvml", before, t, none, || own(5)).unwrap();
        assert_eq!((fifth.0[0].memory_used_mib, calls.get()), (5, 4));
    }

    #[test]
    fn a_probe_in_flight_serves_those_locked_before_it_started_and_no_one_else_waits() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let t = Duration::from_secs(30);
        let before = HostInstant::now().unwrap();
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        // A probe that starts, says so, and answers only when told.
        let first = {
            let dir = dir.clone();
            std::thread::spawn(move || {
                probe(
                    &dir,
                    "smi",
                    before,
                    t,
                    |_| true,
                    || {
                        started_tx.send(()).unwrap();
                        hold.recv().unwrap();
                        Ok(reading(1))
                    },
                )
            })
        };
        started.recv().unwrap();
        // Locked after that probe started: it cannot serve, so this one probes at once
        // (were it to wait, the test would hang: the first answers only after this).
        let after = HostInstant::now().unwrap();
        let own = probe(&dir, "smi", after, t, |_| true, || Ok(reading(3))).unwrap();
        assert_eq!(own.0[0].memory_used_mib, 3);
        // Locked before it started: waits for it and takes its reading.
        let waiter = {
            let dir = dir.clone();
            std::thread::spawn(move || {
                probe(&dir, "smi", before, t, |_| true, || Ok(reading(2))).unwrap()
            })
        };
        release.send(()).unwrap();
        assert_eq!(first.join().unwrap().unwrap().0[0].memory_used_mib, 1);
        assert_eq!(waiter.join().unwrap().0[0].memory_used_mib, 1);
    }

    #[test]
    fn a_record_of_another_boot_or_from_the_future_never_serves() {
        let tmp = tempfile::tempdir().unwrap();
        let since = HostInstant::now().unwrap();
        let t = Duration::from_secs(5);
        let any = |_: &Reading| true;
        probe(tmp.path(), "smi", since, t, any, || Ok(reading(1))).unwrap();
        let path = tmp.path().join(RESULT);
        let edit = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            f(&mut v);
            std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        };
        edit(&|v| v["clock"] = "another-boot".into());
        let mine = probe(tmp.path(), "smi", since, t, any, || Ok(reading(2))).unwrap();
        assert_eq!(mine.0[0].memory_used_mib, 2);
        edit(&|v| v["started"] = (u64::MAX / 2).into());
        let mine = probe(tmp.path(), "smi", since, t, any, || Ok(reading(3))).unwrap();
        assert_eq!(mine.0[0].memory_used_mib, 3);
    }

    #[test]
    fn a_failure_is_not_shared() {
        let tmp = tempfile::tempdir().unwrap();
        let since = HostInstant::now().unwrap();
        let t = Duration::from_secs(5);
        let any = |_: &Reading| true;
        let failed = probe(tmp.path(), "smi", since, t, any, || {
            Err(ProbeError::Spawn {
                program: "x".into(),
                reason: "it broke".into(),
                knob: "CIBOX_NVIDIA_SMI",
            })
        });
        assert!(failed.is_err());
        let mine = probe(tmp.path(), "smi", since, t, any, || Ok(reading(7))).unwrap();
        assert_eq!(mine.0[0].memory_used_mib, 7);
    }

    #[test]
    fn a_result_others_could_have_written_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let since = HostInstant::now().unwrap();
        let t = Duration::from_secs(5);
        probe(tmp.path(), "smi", since, t, |_| true, || Ok(reading(1))).unwrap();
        let path = tmp.path().join(RESULT);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mine = probe(tmp.path(), "smi", since, t, |_| true, || Ok(reading(2))).unwrap();
        assert_eq!(
            mine.0[0].memory_used_mib, 2,
            "a world-writable result is not trusted"
        );
        // A symbolic link in its place is not followed.
        std::fs::remove_file(&path).unwrap();
        let elsewhere = tmp.path().join("elsewhere.json");
        std::fs::write(&elsewhere, b"{}").unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let mine = probe(tmp.path(), "smi", since, t, |_| true, || Ok(reading(3))).unwrap();
        assert_eq!(mine.0[0].memory_used_mib, 3);
    }

    #[test]
    fn temp_files_a_killed_writer_left_do_not_pile_up() {
        // A writer killed between making its `.probe.*` temp file and renaming it
        // leaves it behind; the next write removes those of ours older than a minute,
        // and leaves a fresh one (another writer's, at work now) and other files alone.
        let tmp = tempfile::tempdir().unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(120);
        let plant = |name: &str, aged: bool| {
            let path = tmp.path().join(name);
            let f = std::fs::File::create(&path).unwrap();
            if aged {
                f.set_modified(old).unwrap();
            }
            path
        };
        let stale = [plant(".probe.AbC123", true), plant(".probe.zzz", true)];
        let fresh = plant(".probe.fresh1", false);
        let other = plant("unrelated.old", true);
        let since = HostInstant::now().unwrap();
        let t = Duration::from_secs(5);
        probe(tmp.path(), "smi", since, t, |_| true, || Ok(reading(1))).unwrap();
        for s in &stale {
            assert!(!s.exists(), "{} was left", s.display());
        }
        assert!(fresh.exists() && other.exists());
        let left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".probe."))
            .collect();
        assert_eq!(left, [".probe.fresh1"], "only the fresh temp file is left");
    }
}
