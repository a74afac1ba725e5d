//! The fair queue in front of the leases: waiters are served in the order of their
//! [`Place`], which is the order of arrival with a short head start for big requests,
//! so an 8-GPU request is not starved by a stream of small ones.
//!
//! Each waiter holds a ticket: a file `queue/<at_ms>-<seq>-<pid>` that it keeps locked
//! while it waits. Tickets appear in the folder atomically (a rename) and are numbered
//! without a shared lock: a waiter stopped (Ctrl-Z) while joining would otherwise hold
//! that lock and freeze everyone's arrival. Only the waiter with the lowest live place
//! (the head) may take GPUs. A waiter that dies releases its ticket's lock with its last
//! file descriptor; the next waiter sees that and removes the file, so the dead leave
//! the queue by themselves.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::lockdir::{FileKey, LockDir, LockWait, lock_until, open_read};

/// A live ticket ahead of ours: its place, what it says, and its file (to ask the
/// kernel who holds it).
#[derive(Debug, Clone)]
pub struct Ahead {
    pub place: Place,
    pub text: String,
    pub file: Option<FileKey>,
}

/// Where a waiter stands: lower first. `at_ms` is its arrival on the host's boot clock
/// (one clock for every process, unaffected by wall-clock steps) minus its head start;
/// `seq` orders arrivals in the same millisecond: the nanoseconds of the arrival within
/// it, then the waiter's pid (unique among live processes), so no two places are equal.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Place {
    pub at_ms: u64,
    pub seq: u64,
}

impl Place {
    /// How long ago the waiter arrived (its head start included).
    pub fn age(&self) -> std::time::Duration {
        let now_ms = boot_clock_ns().map_or(0, |ns| ns / 1_000_000);
        std::time::Duration::from_millis(now_ms.saturating_sub(self.at_ms))
    }

    fn parse(name: &str) -> Option<Place> {
        let mut parts = name.splitn(3, '-');
        let at_ms = parts.next()?.parse().ok()?;
        let seq = parts.next()?.parse().ok()?;
        parts.next()?;
        Some(Place { at_ms, seq })
    }
}

fn boot_clock_ns() -> std::io::Result<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)?;
    Ok(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// Pids fit in 22 bits (Linux's `pid_max` is at most 2^22).
const PID_BITS: u32 = 22;

/// A ticket being made (`.new-*`) that is unlocked this long after it was made was left
/// by a waiter killed before its rename: its maker locks it right after creating it.
const STALE_NEW_TICKET: std::time::Duration = std::time::Duration::from_secs(10);

/// The most entries of `queue/` one arrival looks at to clear away.
const CLEARED_PER_ARRIVAL: usize = 10_000;

/// Removes what no waiter holds and nobody touched for a while: `.new-*` tickets left by
/// waiters killed while joining, the tickets of dead waiters wherever they stand, and
/// files that are no ticket at all (as many as this user may remove: in the sticky
/// folder, another user's stay). Dead tickets behind us would otherwise pile up and
/// cost every waiter that reads the queue.
fn remove_stale_new_tickets(queue: &Path) {
    let Ok(entries) = std::fs::read_dir(queue) else {
        return;
    };
    for e in entries.flatten().take(CLEARED_PER_ARRIVAL) {
        let name = e.file_name();
        if name.to_str().is_none_or(|n| n.is_empty()) {
            continue;
        }
        let path = e.path();
        let Ok(file) = open_read(&path) else {
            continue;
        };
        let old = file
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_NEW_TICKET);
        if old && file.try_lock().is_ok() {
            // Another user's file in the sticky folder cannot be removed: left as is.
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// How often a waiter marks its ticket as alive.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);
/// How long a ticket may go without a heartbeat before the waiters behind pass it over.
pub const SILENT_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// Stops a ticket's heartbeat when dropped.
pub struct Heartbeat {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::Thread,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.unpark();
    }
}

/// Whether a ticket's waiter has not shown life for [`SILENT_AFTER`]. A heartbeat
/// from the future is no life either: only a hand that set the time itself leaves one.
fn silent(f: &File) -> bool {
    let Ok(modified) = f.metadata().and_then(|m| m.modified()) else {
        return false;
    };
    match modified.elapsed() {
        Ok(age) => age > SILENT_AFTER,
        Err(ahead) => ahead.duration() > SILENT_AFTER,
    }
}

/// Whether a ticket's place is one its file could have: a waiter takes its place when
/// it makes its ticket (less at most [`MAX_HEAD_START`](super::MAX_HEAD_START)), so a
/// place that claims an arrival long before the file was made was written by hand, to
/// stand ahead of everyone. Where the file system keeps no birth time, any place is.
fn plausible(f: &File, place: &Place) -> bool {
    let Some(made_ago) = f
        .metadata()
        .and_then(|m| m.created())
        .ok()
        .and_then(|t| t.elapsed().ok())
    else {
        return true;
    };
    place.age() <= made_ago + super::MAX_HEAD_START + std::time::Duration::from_secs(2)
}

/// "ticket NAME, owned by uid 1001 (mallory), held by pid 4242 (uid 1001 (mallory))".
fn describe_ticket(name: &str, file: &File) -> String {
    use std::os::unix::fs::MetadataExt;
    let owner = file
        .metadata()
        .map(|m| crate::ownership::owner_of(m.uid()))
        .unwrap_or_default();
    let held = crate::lockdir::lock_holder(file)
        .map(|h| format!(", held by {h}"))
        .unwrap_or_default();
    format!("ticket {name}, {owner}{held}")
}

/// The most of a ticket that is read: its request, with a pool of many GPUs.
const MAX_TICKET: u64 = 64 * 1024;

pub struct Ticket {
    queue: PathBuf,
    name: String,
    place: Place,
    _file: File,
    /// The live ticket just ahead of ours, kept open so checking it costs one syscall.
    ahead: Option<(String, File)>,
}

impl Ticket {
    /// Joins the queue as if it had arrived `head_start` earlier. `description` is
    /// stored in the ticket for humans.
    pub fn enqueue(
        dir: &LockDir,
        description: &str,
        head_start: std::time::Duration,
        deadline: std::time::Instant,
    ) -> Result<Ticket, LockWait> {
        let queue = dir.path().join("queue");
        remove_stale_new_tickets(&queue);
        let pid = std::process::id();
        let now = boot_clock_ns()?;
        let at_ms = (now / 1_000_000).saturating_sub(head_start.as_millis() as u64);
        let seq = ((now % 1_000_000) << PID_BITS) | u64::from(pid & ((1 << PID_BITS) - 1));
        let place = Place { at_ms, seq };
        let name = format!("{at_ms:020}-{seq:020}-{pid}");
        // Locked before it becomes visible, so nobody can take a fresh ticket for dead.
        // Made new under a name nobody can guess: a file planted under a predictable
        // one could be held, or be another user's.
        let (tmp, mut file) = loop {
            let tmp = queue.join(format!(".new-{pid}-{seq}-{}", crate::util::random_hex(8)?));
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
                .mode(0o666)
                .open(&tmp)
            {
                Ok(f) => {
                    use std::os::unix::fs::PermissionsExt;
                    f.set_permissions(std::fs::Permissions::from_mode(0o666))?;
                    break (tmp, f);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e.into()),
            }
        };
        lock_until(&file, deadline)?;
        file.write_all(description.as_bytes())?;
        std::fs::rename(&tmp, queue.join(&name))?;
        Ok(Ticket {
            queue,
            name,
            place,
            _file: file,
            ahead: None,
        })
    }

    /// Whether this ticket is at the head of the queue. Cheap when someone is ahead:
    /// a newcomer placed ahead of us goes unnoticed until that one leaves, which does
    /// not matter, as we are not the head either way.
    pub fn is_head(&mut self) -> std::io::Result<bool> {
        if let Some((_, f)) = &self.ahead {
            match f.try_lock() {
                Err(TryLockError::WouldBlock) => return Ok(false),
                Err(TryLockError::Error(e)) => return Err(e),
                Ok(()) => {
                    // Its owner left or died; if died, its file is still there.
                    let (name, _) = self.ahead.take().expect("checked");
                    let _ = std::fs::remove_file(self.queue.join(name));
                }
            }
        }
        self.ahead = self.find_ahead()?;
        Ok(self.ahead.is_none())
    }

    /// The closest live ticket ahead of ours, removing dead ones on the way.
    fn find_ahead(&self) -> std::io::Result<Option<(String, File)>> {
        let mut ahead: Vec<(Place, String)> = std::fs::read_dir(&self.queue)?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_string();
                let place = Place::parse(&name)?;
                (place < self.place).then_some((place, name))
            })
            .collect();
        ahead.sort_unstable_by_key(|(place, _)| std::cmp::Reverse(*place));
        for (place, name) in ahead {
            let Ok(f) = open_read(&self.queue.join(&name)) else {
                continue; // left between listing and opening, or not a ticket
            };
            match f.try_lock() {
                Err(TryLockError::WouldBlock) if !plausible(&f, &place) => continue,
                Err(TryLockError::WouldBlock) => return Ok(Some((name, f))),
                Err(TryLockError::Error(e)) => return Err(e),
                Ok(()) => {
                    let _ = std::fs::remove_file(self.queue.join(&name));
                }
            }
        }
        Ok(None)
    }

    /// How many live waiters are ahead (0 at the head). Walks the whole queue: for
    /// progress messages, not for the wait loop.
    pub fn position(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.queue) else {
            return 0;
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_string();
                (Place::parse(&name)? < self.place).then_some(name)
            })
            .filter(|name| {
                open_read(&self.queue.join(name))
                    .map(|f| matches!(f.try_lock_shared(), Err(TryLockError::WouldBlock)))
                    .unwrap_or(false)
            })
            .count()
    }

    /// Who holds the ticket at `place`, for a refusal that names what blocks.
    pub fn holder_at(&self, place: Place) -> Option<String> {
        let name = std::fs::read_dir(&self.queue)
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .find(|n| Place::parse(n) == Some(place))?;
        let file = open_read(&self.queue.join(&name)).ok()?;
        Some(describe_ticket(&name, &file))
    }

    /// Who holds the nearest live ticket ahead, for a refusal that names what blocks:
    /// "ticket NAME, owned by uid 1001 (mallory), held by pid 4242 (uid 1001 (mallory))".
    pub fn holder_ahead(&self) -> Option<String> {
        let (name, file) = self.ahead.as_ref()?;
        Some(describe_ticket(name, file))
    }

    pub fn place(&self) -> Place {
        self.place
    }

    /// Replaces what the ticket says about its waiter (written once the request is
    /// known; readers treat a ticket they cannot parse as the strictest case).
    pub fn describe(&mut self, content: &str) -> std::io::Result<()> {
        self._file.set_len(0)?;
        self._file.rewind()?;
        self._file.write_all(content.as_bytes())
    }

    /// Keeps the ticket's heartbeat going from a thread of its own until the returned
    /// guard is dropped: a waiter that is stopped (Ctrl-Z, SIGSTOP, a frozen cgroup)
    /// stops all its threads, so its ticket falls silent and the waiters behind pass
    /// it over ([`SILENT_AFTER`]) until it resumes; it keeps its place.
    pub fn heartbeat(&self) -> std::io::Result<Heartbeat> {
        // By name, through a description of its own: a duplicate of the ticket's would
        // share its lock and keep the ticket alive after it is dropped.
        let path = self.queue.join(&self.name);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cibox-heartbeat".into())
            .spawn(move || {
                while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                    let touched = std::fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
                        .open(&path)
                        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                    if touched.is_err() {
                        return; // the ticket is gone
                    }
                    std::thread::park_timeout(HEARTBEAT);
                }
            })?
            .thread()
            .clone();
        Ok(Heartbeat { stop, thread })
    }

    /// The live tickets ahead of ours that show life, nearest the head first: place,
    /// content and file. A silent one is passed over while it stays silent.
    pub fn ahead(&self) -> std::io::Result<Vec<Ahead>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.queue)?.flatten() {
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let Some(place) = Place::parse(&name).filter(|p| *p < self.place) else {
                continue;
            };
            let Ok(f) = open_read(&self.queue.join(&name)) else {
                continue;
            };
            if !matches!(f.try_lock_shared(), Err(TryLockError::WouldBlock)) {
                continue; // its owner is gone
            }
            if silent(&f) {
                continue; // its owner is stopped: not in the way until it resumes
            }
            if !plausible(&f, &place) {
                continue; // a place written by hand, ahead of its time
            }
            // A ticket is a few hundred bytes; one that is not is read as far as that
            // goes, and then cannot be parsed (the strictest case).
            let file = f.metadata().ok().map(|m| FileKey::of(&m));
            let mut text = String::new();
            let _ = f.take(MAX_TICKET).read_to_string(&mut text);
            out.push(Ahead { place, text, file });
        }
        out.sort_unstable_by_key(|a| a.place);
        Ok(out)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Remove first, then the lock goes with the file: whoever is behind sees the
        // lock free and the name gone, and moves up.
        let _ = std::fs::remove_file(Path::new(&self.queue).join(&self.name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn places_order_by_head_started_arrival_then_seq() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LockDir::open(tmp.path(), false).unwrap();
        // A waiter killed between creating and renaming its ticket left this a minute
        // ago; one being made now (fresh) is left alone.
        let stale = tmp.path().join("queue/.new-99999-7");
        std::fs::write(&stale, "").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - Duration::from_secs(60))
            .unwrap();
        let fresh = tmp.path().join("queue/.new-99998-7");
        std::fs::write(&fresh, "").unwrap();
        let mut small = Ticket::enqueue(&dir, "{}", Duration::ZERO, far()).unwrap();
        assert!(!stale.exists(), "a stale .new- file survived");
        assert!(fresh.exists(), "a .new- file being made was removed");
        let mut big = Ticket::enqueue(&dir, "{}", Duration::from_millis(700), far()).unwrap();
        let mut later = Ticket::enqueue(&dir, "{}", Duration::ZERO, far()).unwrap();
        assert!(big.place() < small.place() && small.place() < later.place());
        assert!(big.is_head().unwrap());
        assert!(!small.is_head().unwrap() && !later.is_head().unwrap());
        assert_eq!(later.position(), 2);
        drop(big);
        assert!(small.is_head().unwrap());
        assert!(!later.is_head().unwrap());
    }
}
