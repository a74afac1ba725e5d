//! Overtaking in the queue: when a waiter behind the head may take GPUs ahead of those
//! before it, so that GPUs nobody ahead can use yet are not left idle, and nobody ahead
//! is starved by it.

use super::lease::{Holder, LeaseState};
use super::pool::PoolGpu;
use super::queue;
use crate::lockdir::LockDir;

/// How long a waiter may take to say which pool it chooses from (a probe, and the
/// engine asked about orphans, each bounded far below this).
const PENDING_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

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
/// on 8 GPUs is never overtaken.
pub(super) fn may_overtake(
    dir: &LockDir,
    ahead: &[(queue::Place, String)],
    mine: &[PoolGpu],
    available: &[&PoolGpu],
) -> Overtake {
    for (place, text) in ahead {
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
        // A waiter that holds GPUs under its own place is checking them (its probe
        // runs after it locked them): it may yet let them go and need others, so
        // nobody goes ahead of it meanwhile.
        let checking = a.pool.iter().any(|uuid| {
            matches!(dir.state(uuid), Ok(LeaseState::Held(Some(h))) if h.ticket == Some(*place))
        });
        if checking {
            return Overtake::No(Some(*place));
        } else if let Some(devices) = &a.devices {
            if devices
                .iter()
                .all(|d| available.iter().any(|g| &g.uuid == d))
            {
                return Overtake::NotWhileServable(*place);
            }
            if mine.iter().any(|g| devices.contains(&g.uuid)) {
                return Overtake::No(Some(*place));
            }
            continue;
        } else if available
            .iter()
            .filter(|g| a.pool.contains(&g.uuid))
            .count()
            >= a.need
        {
            return Overtake::NotWhileServable(*place);
        }
        let overtakers = a
            .pool
            .iter()
            .filter(|uuid| !mine.iter().any(|g| &&g.uuid == uuid))
            .filter(|uuid| match dir.state(uuid) {
                Ok(LeaseState::Held(Some(h))) => h.ticket.is_none_or(|t| t > *place),
                Ok(LeaseState::Held(None)) | Err(_) => true,
                Ok(LeaseState::Free) => false,
            })
            .count();
        let mine_in_pool = mine.iter().filter(|g| a.pool.contains(&g.uuid)).count();
        if overtakers + mine_in_pool + a.need > a.pool.len() {
            return Overtake::No(Some(*place));
        }
    }
    Overtake::Yes
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

/// The GPUs of `free` not known to be busy.
pub(super) fn idle_among<'a>(free: &[&'a PoolGpu], busy: &[(u32, String)]) -> Vec<&'a PoolGpu> {
    free.iter()
        .copied()
        .filter(|g| !busy.iter().any(|(i, _)| *i == g.index))
        .collect()
}

/// Whether a waiter behind the head could take `need` of the free GPUs not known to be
/// busy, by [`may_overtake`].
pub(super) fn overtake_allowed(
    dir: &LockDir,
    ahead: &[(queue::Place, String)],
    free: &[&PoolGpu],
    busy: &[(u32, String)],
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
            })
            .collect()
    }

    fn place(at_ms: u64) -> queue::Place {
        queue::Place { at_ms, seq: 0 }
    }

    /// A waiter at `at_ms` for `need` of `pool` (or exactly `devices`).
    fn waiter(
        at_ms: u64,
        need: usize,
        pool: &[PoolGpu],
        devices: Option<&[PoolGpu]>,
    ) -> (queue::Place, String) {
        let request = TicketRequest {
            need,
            pool: pool.iter().map(|g| g.uuid.clone()).collect(),
            devices: devices.map(|d| d.iter().map(|g| g.uuid.clone()).collect()),
            holder: Holder::default(),
        };
        (place(at_ms), serde_json::to_string(&request).unwrap())
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
        let planted = [(place(100), "not a request".to_string())];
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
}
