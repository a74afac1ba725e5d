//! Overtaking in the queue: when a waiter behind the head may take GPUs ahead of those
//! before it, so that GPUs nobody ahead can use yet are not left idle, and nobody ahead
//! is starved by it.

use super::lease::{Holder, LeaseState};
use super::pool::PoolGpu;
use super::queue::{self, Ahead};
use crate::lockdir::{FileKey, Identity, LockDir, Locks};

/// How long a waiter may take to say which pool it chooses from (a probe, and the
/// engine asked about orphans, each bounded far below this).
const PENDING_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// How long a waiter ahead that waits for GPUs its own user holds may keep the waiters
/// behind it from GPUs it cannot use (see [`waits_on_itself`]).
pub(super) const SELF_BLOCK_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What a ticket tells the waiters behind it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct TicketRequest {
    pub need: usize,
    /// The pool it chooses from (UUIDs).
    pub pool: Vec<String>,
    /// Exactly these GPUs, for `--devices`.
    pub devices: Option<Vec<String>>,
    pub holder: Holder,
}

/// Whether we may take `mine` now, ahead of the waiters in `ahead`. Never when one of
/// them could be served from the GPUs available right now (`available`: unleased and
/// not known to be busy): overtaking only fills GPUs nobody ahead can use yet. And for each waiter A ahead, the GPUs of A's pool held by
/// leases granted to places behind A (its overtakers), plus ours, must leave room for A's
/// request once the holders from before A finish, so nobody is starved: an 8-GPU request
/// on 8 GPUs is never overtaken, unless it waits on its own user's GPUs and has for
/// [`SELF_BLOCK_LIMIT`] ([`waits_on_itself`]).
pub(super) fn may_overtake(
    dir: &LockDir,
    ahead: &[Ahead],
    mine: &[PoolGpu],
    available: &[&PoolGpu],
) -> Overtake {
    // The kernel's lock table, read once and only when a waiter ahead has waited long.
    let mut locks: Option<Locks> = None;
    for Ahead { place, text, file } in ahead {
        // Every cibox ticket says what it asks from the moment it is in the queue (a
        // waiter that does not know its pool yet says so, the strictest case). One that
        // does not is no cibox waiter's: a file planted to hold everyone up. It is
        // passed over like a stopped waiter.
        let Ok(a) = serde_json::from_str::<TicketRequest>(text) else {
            continue;
        };
        // A waiter learns its pool within a probe of arriving; one that still has not
        // long after is stuck or planted, and is passed over too.
        if a.pool.is_empty() && place.age() > PENDING_LIMIT {
            continue;
        }
        // A request no pool could ever serve (more GPUs than its pool, devices outside
        // it) is no waiter's either: it would hold everyone up for ever.
        let impossible = a.need == 0
            || (!a.pool.is_empty() && a.need > a.pool.len())
            || a.devices
                .as_ref()
                .is_some_and(|d| d.len() != a.need || d.iter().any(|u| !a.pool.contains(u)));
        if impossible {
            continue;
        }
        let Some(verdict) = blocks(dir, *place, &a, mine, available) else {
            continue;
        };
        // One that has waited long for GPUs its own user holds stops holding back the
        // rest: holding one GPU and asking for all of them would otherwise keep every
        // other one idle for as long as that user likes.
        if place.age() > SELF_BLOCK_LIMIT
            && waits_on_itself(dir, &a, *file, mine, locks.get_or_insert_with(Locks::read))
        {
            continue;
        }
        return verdict;
    }
    Overtake::Yes
}

/// Whether the waiter at `place`, asking `a`, keeps us from taking `mine` now (`None`:
/// it does not), by the rules of [`may_overtake`].
fn blocks(
    dir: &LockDir,
    place: queue::Place,
    a: &TicketRequest,
    mine: &[PoolGpu],
    available: &[&PoolGpu],
) -> Option<Overtake> {
    // A waiter that holds GPUs under its own place is checking them (its probe runs
    // after it locked them): it may yet let them go and need others, so nobody goes
    // ahead of it meanwhile.
    let checking = a.pool.iter().any(
        |uuid| matches!(dir.state(uuid), Ok(LeaseState::Held(Some(h))) if h.ticket == Some(place)),
    );
    if checking {
        return Some(Overtake::No(Some(place)));
    } else if let Some(devices) = &a.devices {
        if devices
            .iter()
            .all(|d| available.iter().any(|g| &g.uuid == d))
        {
            return Some(Overtake::NotWhileServable(place));
        }
        if mine.iter().any(|g| devices.contains(&g.uuid)) {
            return Some(Overtake::No(Some(place)));
        }
        return None;
    } else if available
        .iter()
        .filter(|g| a.pool.contains(&g.uuid))
        .count()
        >= a.need
    {
        return Some(Overtake::NotWhileServable(place));
    }
    let overtakers = a
        .pool
        .iter()
        .filter(|uuid| !mine.iter().any(|g| &&g.uuid == uuid))
        .filter(|uuid| match dir.state(uuid) {
            Ok(LeaseState::Held(Some(h))) => h.ticket.is_none_or(|t| t > place),
            Ok(LeaseState::Held(None)) | Err(_) => true,
            Ok(LeaseState::Free) => false,
        })
        .count();
    let mine_in_pool = mine.iter().filter(|g| a.pool.contains(&g.uuid)).count();
    (overtakers + mine_in_pool + a.need > a.pool.len()).then_some(Overtake::No(Some(place)))
}

/// Whether a waiter (its request `a`, its ticket `file`) cannot be served until GPUs its
/// own user holds come free: leases of its pool (other than `mine`, the ones a waiter
/// behind is taking) whose locks, as the kernel says, a process of the ticket's user
/// took (the same user; for root, whose processes are every CI job's, also the same
/// session), or a process that has exited and left the lock to another (nobody can say
/// whose: counted as its own). What a lease's holder writes in its lock file (its
/// place in the queue) is not asked: the user could write anything there. Such a
/// waiter waits on itself; after [`SELF_BLOCK_LIMIT`] the waiters behind may take what
/// it cannot use. A ticket whose file is not known is never judged so.
fn waits_on_itself(
    dir: &LockDir,
    a: &TicketRequest,
    file: Option<FileKey>,
    mine: &[PoolGpu],
    locks: &Locks,
) -> bool {
    // A waiter that has not said its pool yet waits on nobody's GPUs (PENDING_LIMIT).
    let Some(file) = file.filter(|_| !a.pool.is_empty()) else {
        return false;
    };
    let Some(pid) = locks.taken_by(file) else {
        return false; // nobody holds the ticket: a dead waiter's
    };
    let waiter = crate::lockdir::identity(pid);
    let own = |holder: Option<Identity>| match (waiter, holder) {
        (Some(w), Some(h)) => w.uid == h.uid && (w.uid != 0 || w.session == h.session),
        _ => true,
    };
    let own_held: Vec<&String> = a
        .pool
        .iter()
        .filter(|uuid| !mine.iter().any(|g| &&g.uuid == uuid))
        .filter(|uuid| {
            dir.lock_file_key(uuid)
                .and_then(|k| locks.taken_by(k))
                .is_some_and(|pid| own(crate::lockdir::identity(pid)))
        })
        .collect();
    match &a.devices {
        Some(devices) => devices.iter().any(|d| own_held.contains(&d)),
        None => own_held.len() + a.need > a.pool.len(),
    }
}

/// Whether a waiter may take GPUs ahead of those before it in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Overtake {
    Yes,
    /// Not now; the waiter ahead it would wrong, when one would.
    No(Option<queue::Place>),
    /// The waiter at this place could be served from the available GPUs: it takes
    /// them itself, unless they are busy in a way not known yet.
    NotWhileServable(queue::Place),
}

/// A unit the last probe showed busy outside cibox, and why.
pub(super) type Busy = (PoolGpu, String);

/// The GPUs of `free` not known to be busy.
pub(super) fn idle_among<'a>(free: &[&'a PoolGpu], busy: &[Busy]) -> Vec<&'a PoolGpu> {
    free.iter()
        .copied()
        .filter(|g| !busy.iter().any(|(b, _)| b.uuid == g.uuid))
        .collect()
}

/// Whether a waiter behind the head could take `need` of the free GPUs not known to be
/// busy, by [`may_overtake`].
pub(super) fn overtake_allowed(
    dir: &LockDir,
    ahead: &[Ahead],
    free: &[&PoolGpu],
    busy: &[Busy],
    need: usize,
) -> Overtake {
    let idle = idle_among(free, busy);
    let tentative: Vec<PoolGpu> = idle.iter().take(need).map(|g| (*g).clone()).collect();
    if tentative.len() < need {
        return Overtake::No(None);
    }
    may_overtake(dir, ahead, &tentative, &idle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::lease::Lease;

    fn gpus(n: u32) -> Vec<PoolGpu> {
        (0..n)
            .map(|i| PoolGpu {
                index: i,
                uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
                parent: None,
            })
            .collect()
    }

    fn place(at_ms: u64) -> queue::Place {
        queue::Place { at_ms, seq: 0 }
    }

    /// A waiter at `at_ms` for `need` of `pool` (or exactly `devices`).
    fn waiter(at_ms: u64, need: usize, pool: &[PoolGpu], devices: Option<&[PoolGpu]>) -> Ahead {
        let request = TicketRequest {
            need,
            pool: pool.iter().map(|g| g.uuid.clone()).collect(),
            devices: devices.map(|d| d.iter().map(|g| g.uuid.clone()).collect()),
            holder: Holder::default(),
        };
        Ahead {
            place: place(at_ms),
            text: serde_json::to_string(&request).unwrap(),
            file: None,
        }
    }

    /// Leases `gpus` as granted to the queue place at `at_ms`.
    fn leased(dir: &LockDir, gpus: &[PoolGpu], at_ms: u64) -> Lease {
        let files = gpus
            .iter()
            .map(|g| dir.try_take(&g.uuid).unwrap().expect("free"))
            .collect();
        let mut lease = Lease::new(gpus.to_vec(), files);
        let holder = Holder {
            ticket: Some(place(at_ms)),
            ..Holder::default()
        };
        lease.set_holder(&holder).unwrap();
        lease
    }

    fn refs(g: &[PoolGpu]) -> Vec<&PoolGpu> {
        g.iter().collect()
    }

    #[test]
    fn a_full_pool_request_is_never_overtaken() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LockDir::open(tmp.path(), false).unwrap();
        let pool = gpus(8);
        // Four GPUs held by earlier holders, four free; an 8-GPU request waits ahead.
        let _earlier = leased(&dir, &pool[..4], 10);
        let ahead = [waiter(100, 8, &pool, None)];
        let free = refs(&pool[4..]);
        assert_eq!(
            may_overtake(&dir, &ahead, &pool[4..5], &free),
            Overtake::No(Some(place(100))),
            "taking one would leave the 8-GPU request short once the earlier holders finish"
        );
    }

    #[test]
    fn overtakers_may_fill_only_what_the_head_cannot_use_yet() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LockDir::open(tmp.path(), false).unwrap();
        let pool = gpus(8);
        // Five GPUs held by holders from before the head: 3 free, the head needs 4.
        let _earlier = leased(&dir, &pool[..5], 10);
        let ahead = [waiter(100, 4, &pool, None)];
        let free = refs(&pool[5..]);
        assert_eq!(
            may_overtake(&dir, &ahead, &pool[5..6], &free),
            Overtake::Yes,
            "1 overtaker + 4 for the head fit in 8"
        );
        // With two overtakers already holding GPUs (granted to places behind the head),
        // three more would leave the head short: 2 + 3 + 4 > 8.
        drop(_earlier);
        let _before = leased(&dir, &pool[..3], 10);
        let _overtakers = leased(&dir, &pool[3..5], 200);
        assert_eq!(
            may_overtake(&dir, &ahead, &pool[5..8], &free),
            Overtake::No(Some(place(100)))
        );
        assert_eq!(
            may_overtake(&dir, &ahead, &pool[5..7], &free),
            Overtake::Yes,
            "2 + 2 + 4 still fit"
        );
    }

    #[test]
    fn a_servable_waiter_ahead_takes_its_gpus_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LockDir::open(tmp.path(), false).unwrap();
        let pool = gpus(8);
        let ahead = [waiter(100, 2, &pool, None)];
        let free = refs(&pool);
        assert_eq!(
            may_overtake(&dir, &ahead, &pool[..1], &free),
            Overtake::NotWhileServable(place(100))
        );
        // Exact devices: servable when all are available; otherwise only a request
        // that would take one of them is held back.
        let ahead = [waiter(100, 2, &pool, Some(&pool[6..8]))];
        let some = refs(&pool[..7]);
        assert_eq!(may_overtake(&dir, &ahead, &pool[..1], &some), Overtake::Yes);
        assert_eq!(
            may_overtake(&dir, &ahead, &pool[6..7], &some),
            Overtake::No(Some(place(100)))
        );
        assert_eq!(
            may_overtake(&dir, &ahead, &pool[..1], &free),
            Overtake::NotWhileServable(place(100))
        );
    }

    #[test]
    fn a_waiter_checking_its_gpus_is_never_overtaken() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LockDir::open(tmp.path(), false).unwrap();
        let pool = gpus(4);
        // The head holds GPU 0 under its own place while its probe runs; it needs 1.
        let _checking = leased(&dir, &pool[..1], 100);
        let ahead = [waiter(100, 1, &pool, None)];
        let free = refs(&pool[1..]);
        assert_eq!(
            may_overtake(&dir, &ahead, &pool[1..2], &free),
            Overtake::No(Some(place(100))),
            "it may find GPU 0 busy and need another"
        );
    }

    #[test]
    fn a_ticket_that_is_no_request_is_passed_over_and_one_without_a_pool_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LockDir::open(tmp.path(), false).unwrap();
        let pool = gpus(8);
        let planted = [Ahead {
            place: place(100),
            text: "not a request".to_string(),
            file: None,
        }];
        assert_eq!(
            may_overtake(&dir, &planted, &pool[..1], &refs(&pool)),
            Overtake::Yes
        );
        // A waiter that arrived just now but has not resolved its pool yet: the
        // strictest case; one that arrived long ago and still has not is passed over.
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
        let now_ms = now.tv_sec() as u64 * 1000 + now.tv_nsec() as u64 / 1_000_000;
        let pending = [waiter(now_ms, 1, &[], None)];
        assert_eq!(
            may_overtake(&dir, &pending, &pool[..1], &refs(&pool)),
            Overtake::No(Some(place(now_ms)))
        );
        // One that asks what no pool could give is passed over.
        let impossible = [waiter(100, 9, &pool, None)];
        assert_eq!(
            may_overtake(&dir, &impossible, &pool[..1], &refs(&pool)),
            Overtake::Yes
        );
        let stuck = [waiter(now_ms.saturating_sub(600_000), 1, &[], None)];
        assert_eq!(
            may_overtake(&dir, &stuck, &pool[..1], &refs(&pool)),
            Overtake::Yes
        );
    }

    #[test]
    fn a_waiter_that_waits_on_its_own_gpus_holds_back_the_rest_only_for_a_while() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LockDir::open(tmp.path(), false).unwrap();
        let pool = gpus(8);
        // This process holds GPU 0 (granted to an earlier place) and, ahead in the
        // queue, asks for all 8: it waits on itself.
        let _mine = leased(&dir, &pool[..1], 10);
        let ticket_path = tmp.path().join("queue/ticket");
        let ticket = std::fs::File::create(&ticket_path).unwrap();
        ticket.lock().unwrap();
        let key = Some(FileKey::of(&ticket.metadata().unwrap()));
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
        let now_ms = now.tv_sec() as u64 * 1000 + now.tv_nsec() as u64 / 1_000_000;
        let asking = |at_ms: u64, file: Option<FileKey>| {
            let mut w = waiter(at_ms, 8, &pool, None);
            w.file = file;
            [w]
        };
        let free = refs(&pool[1..]);
        // Just arrived: it still holds back the rest, as any waiter ahead does.
        assert_eq!(
            may_overtake(&dir, &asking(now_ms, key), &pool[1..2], &free),
            Overtake::No(Some(place(now_ms)))
        );
        // Past the limit it does not: what it waits for, its own user holds.
        let old = now_ms.saturating_sub(SELF_BLOCK_LIMIT.as_millis() as u64 + 5_000);
        assert_eq!(
            may_overtake(&dir, &asking(old, key), &pool[1..2], &free),
            Overtake::Yes
        );
        // One that has not said its pool yet waits on nobody (up to PENDING_LIMIT).
        let mut pending = waiter(old, 1, &[], None);
        pending.file = key;
        assert_eq!(
            may_overtake(&dir, &[pending], &pool[1..2], &free),
            Overtake::No(Some(place(old)))
        );
        // A ticket nobody holds, or one not known, is never judged so.
        assert_eq!(
            may_overtake(&dir, &asking(old, None), &pool[1..2], &free),
            Overtake::No(Some(place(old)))
        );
        // GPU 0 held by a process of another session (for root, another CI job's): the
        // waiter waits on others, and keeps its place however long it waits.
        drop(_mine);
        let lock = tmp.path().join(format!("{}.lock", pool[0].uuid));
        let mut other = std::process::Command::new("setsid")
            .args(["flock", "-x"])
            .arg(&lock)
            .args(["sleep", "30"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let held = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(25));
            matches!(dir.state(&pool[0].uuid), Ok(LeaseState::Held(_)))
        });
        assert!(held, "flock did not take GPU 0");
        assert_eq!(
            may_overtake(&dir, &asking(old, key), &pool[1..2], &free),
            Overtake::No(Some(place(old)))
        );
        // The whole session (setsid runs flock in place, which runs sleep): no
        // process of the test outlives it.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(other.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = other.wait();
    }
}
