//! GPUs: probing what they do ([`probe`]), which ones CI may use ([`pool`]), and
//! leasing them ([`lease`], behind the fair [`queue`]).
//!
//! A GPU is handed out only when it is in the pool, not leased, and idle by a probe that
//! started after it was locked for the hand-out. Anything uncertain fails closed.

pub mod lease;
pub mod pool;
pub mod probe;
pub mod queue;

use std::time::{Duration, Instant};

pub use probe::is_gpu_uuid;

use crate::exit::Failure;
use crate::lockdir::{LockDir, LockWait, lock_until};
use crate::manifest::IdlePolicy;
use crate::signals;
use lease::{Holder, Lease, LeaseState};
use pool::PoolGpu;
use probe::{HostInstant, Snapshot};

/// How much earlier than its arrival a request counts, per GPU it asks for beyond the
/// first. Jobs that a CI fan-out starts together reach the queue in a random order
/// within a fraction of a second; this puts the big ones of such a burst first, which
/// packs the GPUs best (a big request is the hardest to place, and one that waits
/// behind small ones idles the GPUs they free while it drains them). It bends arrival
/// order by at most `(need - 1) ×` this, and never by more than [`MAX_HEAD_START`], so
/// nobody waits behind a request that arrived much later.
pub const HEAD_START_PER_GPU: Duration = Duration::from_millis(100);
/// The head start of a request for 16 GPUs or more (the count is not yet checked
/// against the pool when the place is taken).
pub const MAX_HEAD_START: Duration = Duration::from_millis(1500);

/// What a probe for a hand-out can fail with: the driver, or the engine asked which
/// GPUs running containers hold. Either way nothing is handed out.
pub type ProbeFailure = Box<dyn std::error::Error + Send + Sync>;

/// Why GPUs were not leased.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The wait allowed ran out.
    #[error("{0}")]
    Capacity(String),
    /// cibox was asked to stop while it waited.
    #[error("stopped by {0}")]
    Interrupted(nix::sys::signal::Signal),
    /// The lock directory could not be used.
    #[error("lease dir {dir}: {what}: {source}")]
    Locks {
        dir: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Something other than a lock file sits where one belongs.
    #[error("lock dir: {0}")]
    Planted(#[source] std::io::Error),
    /// The GPUs could not be probed: all count as unavailable.
    #[error("{0}")]
    Probe(ProbeFailure),
}

impl LeaseError {
    pub fn failure(&self) -> Failure {
        match self {
            LeaseError::Capacity(_) => Failure::Capacity,
            LeaseError::Interrupted(sig) => Failure::Signal(*sig),
            // A lock dir cibox may not write is configuration, like a bad gpu.lock_dir.
            LeaseError::Locks { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                Failure::Usage
            }
            LeaseError::Planted(_) => Failure::Usage,
            LeaseError::Locks { source, .. } if crate::lockdir::is_planted(source) => {
                Failure::Usage
            }
            LeaseError::Locks { .. } | LeaseError::Probe(_) => Failure::Infra,
        }
    }

    fn locks(dir: &LockDir, what: &'static str) -> impl Fn(std::io::Error) -> LeaseError {
        let dir = dir.path().display().to_string();
        move |source| LeaseError::Locks {
            dir: dir.clone(),
            what,
            source,
        }
    }
}

/// Takes a place in the queue for a request of `need` GPUs.
pub fn join_queue(
    dir: &LockDir,
    holder: &Holder,
    need: usize,
    deadline: Instant,
) -> Result<queue::Ticket, LeaseError> {
    let description = serde_json::to_string(holder).expect("holder serialises");
    let head_start =
        (HEAD_START_PER_GPU * need.saturating_sub(1).min(64) as u32).min(MAX_HEAD_START);
    queue::Ticket::enqueue(dir, &description, head_start, deadline).map_err(|w| match w {
        LockWait::TimedOut => LeaseError::Capacity(format!(
            "could not join the queue in {} within the wait",
            dir.path().display()
        )),
        LockWait::Interrupted(sig) => LeaseError::Interrupted(sig),
        LockWait::Io(e) => LeaseError::locks(dir, "joining the queue")(e),
    })
}

/// What to lease.
#[derive(Debug, Clone)]
pub enum Want {
    /// Any `n` GPUs of the pool (lowest indices first).
    Count(usize),
    /// Exactly these GPUs.
    Devices(Vec<PoolGpu>),
}

impl Want {
    pub fn count(&self) -> usize {
        match self {
            Want::Count(n) => *n,
            Want::Devices(d) => d.len(),
        }
    }
}

/// Parses `--devices` (indices or UUIDs, comma-separated) against the host and pool.
pub fn parse_devices(
    list: &str,
    snapshot: &Snapshot,
    pool: &[PoolGpu],
) -> Result<Vec<PoolGpu>, String> {
    let mut out: Vec<PoolGpu> = Vec::new();
    for item in list.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(format!("--devices `{list}` has an empty entry"));
        }
        let Some(g) = snapshot
            .gpus
            .iter()
            .find(|g| g.uuid == item || g.index.to_string() == item)
        else {
            return Err(format!("--devices: `{item}` is not a GPU on this host"));
        };
        if out.iter().any(|o| o.uuid == g.uuid) {
            return Err(format!("--devices names GPU {} twice", g.index));
        }
        let Some(p) = pool.iter().find(|p| p.uuid == g.uuid) else {
            return Err(format!(
                "--devices: GPU {} ({}) is not in the CI pool (gpu.pool / CIBOX_GPU_POOL)",
                g.index, g.uuid
            ));
        };
        out.push(p.clone());
    }
    Ok(out)
}

/// What a waiter knows while it waits, for progress lines and the final refusal.
#[derive(Debug, Clone, Default)]
pub struct WaitReport {
    pub position: usize,
    pub leased: Vec<(u32, String)>,
    pub busy: Vec<(u32, String)>,
    pub waited: Duration,
}

impl WaitReport {
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.position > 0 {
            parts.push(format!("{} waiter(s) ahead", self.position));
        }
        if !self.leased.is_empty() {
            let l: Vec<String> = self
                .leased
                .iter()
                .map(|(i, h)| format!("GPU {i} by {h}"))
                .collect();
            parts.push(format!("leased: {}", l.join("; ")));
        }
        if !self.busy.is_empty() {
            let b: Vec<String> = self
                .busy
                .iter()
                .map(|(i, r)| format!("GPU {i} {r}"))
                .collect();
            parts.push(format!("busy outside cibox: {}", b.join("; ")));
        }
        if parts.is_empty() {
            "waiting for the queue to move".into()
        } else {
            parts.join(", ")
        }
    }
}

/// How often the waiter looks at the queue and the locks: hand-off latency is bounded
/// by this plus one probe (and one more per busy verdict).
const POLL: Duration = Duration::from_millis(10);
/// How often a waiter behind the head tries to overtake it (see [`may_overtake`]).
const OVERTAKE_EVERY: Duration = Duration::from_millis(50);
/// When GPUs are unleased but busy with work cibox does not know about, how long to
/// wait before probing again.
const BUSY_RECHECK: Duration = Duration::from_secs(1);

/// What a ticket tells the waiters behind it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Request {
    need: usize,
    /// The pool it chooses from (UUIDs).
    pool: Vec<String>,
    /// Exactly these GPUs, for `--devices`.
    devices: Option<Vec<String>>,
    holder: Holder,
}

fn leased_now(dir: &LockDir, gpus: &[PoolGpu]) -> Vec<(u32, String)> {
    gpus.iter()
        .filter_map(|g| match dir.state(&g.uuid) {
            Ok(LeaseState::Held(h)) => Some((
                g.index,
                h.map(|h| h.describe())
                    .unwrap_or_else(|| "an unknown holder".into()),
            )),
            Ok(LeaseState::Free) => None,
            Err(e) => Some((g.index, format!("unreadable lock file: {e}"))),
        })
        .collect()
}

/// Whether we may take `mine` now, ahead of the waiters in `ahead`. Never when one of
/// them could be served from the GPUs available right now (`available`: unleased and
/// not known to be busy): overtaking only fills GPUs nobody ahead can use yet. And for each waiter A ahead, the GPUs of A's pool held by
/// leases granted to places behind A (its overtakers), plus ours, must leave room for A's
/// request once the holders from before A finish, so nobody is starved: an 8-GPU request
/// on 8 GPUs is never overtaken.
fn may_overtake(
    dir: &LockDir,
    ahead: &[(queue::Place, String)],
    mine: &[PoolGpu],
    available: &[&PoolGpu],
) -> Overtake {
    for (place, text) in ahead {
        let Ok(a) = serde_json::from_str::<Request>(text) else {
            return Overtake::No; // a waiter we cannot read: assume the strictest case
        };
        // A waiter that holds GPUs under its own place is checking them (its probe
        // runs after it locked them): it may yet let them go and need others, so
        // nobody goes ahead of it meanwhile.
        let checking = a.pool.iter().any(|uuid| {
            matches!(dir.state(uuid), Ok(LeaseState::Held(Some(h))) if h.ticket == Some(*place))
        });
        if checking {
            return Overtake::No;
        } else if let Some(devices) = &a.devices {
            if devices
                .iter()
                .all(|d| available.iter().any(|g| &g.uuid == d))
            {
                return Overtake::NotWhileServable(*place);
            }
            if mine.iter().any(|g| devices.contains(&g.uuid)) {
                return Overtake::No;
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
            return Overtake::No;
        }
    }
    Overtake::Yes
}

/// Whether a waiter may take GPUs ahead of those before it in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overtake {
    Yes,
    No,
    /// The waiter at this place could be served from the available GPUs: it takes
    /// them itself, unless they are busy in a way not known yet.
    NotWhileServable(queue::Place),
}

/// Leases `want` from `pool`, waiting up to `wait` in the fair queue, where `ticket`
/// holds our place (taken on arrival, before the probe, so the order of arrival is the
/// order of service). The head of the queue takes GPUs as soon as enough are free and
/// idle; waiters behind it take idle GPUs only where [`may_overtake`] allows. `probe`
/// asks the driver, from a probe that started at the given instant or later; `on_wait` is called every poll while waiting with a function that
/// builds the (costly) report, so it can build one only when it means to show it.
#[allow(clippy::too_many_arguments)]
pub fn acquire(
    mut ticket: queue::Ticket,
    dir: &LockDir,
    pool: &[PoolGpu],
    want: &Want,
    policy: &IdlePolicy,
    wait: Duration,
    holder: &Holder,
    mut probe: impl FnMut(Option<HostInstant>) -> Result<Snapshot, ProbeFailure>,
    mut on_wait: impl FnMut(&dyn Fn() -> WaitReport),
) -> Result<Lease, LeaseError> {
    let start = Instant::now();
    let deadline = start + wait;
    let io = |what: &'static str, e: std::io::Error| LeaseError::locks(dir, what)(e);
    let candidates: Vec<PoolGpu> = match want {
        Want::Count(_) => pool.to_vec(),
        Want::Devices(d) => d.clone(),
    };
    let need = want.count();
    let mut holder = holder.clone();
    holder.ticket = Some(ticket.place());
    let request = Request {
        need,
        pool: pool.iter().map(|g| g.uuid.clone()).collect(),
        devices: matches!(want, Want::Devices(_))
            .then(|| candidates.iter().map(|g| g.uuid.clone()).collect()),
        holder: holder.clone(),
    };
    ticket
        .describe(&serde_json::to_string(&request).expect("request serialises"))
        .map_err(|e| io("writing the ticket", e))?;
    let _heartbeat = ticket
        .heartbeat()
        .map_err(|e| io("starting the ticket's heartbeat", e))?;
    let select = crate::lockdir::open_shared_file(&dir.path().join("select.lock"))
        .map_err(|e| io("opening select.lock", e))?;
    let mut last_free: Vec<String> = Vec::new();
    let mut next_probe = start;
    let mut next_overtake = start;
    let mut busy: Vec<(u32, String)> = Vec::new();
    // When `busy` was last seen; older than BUSY_RECHECK it is not trusted to rule a GPU
    // out (the hand-out's own probe still rules).
    let mut busy_seen: Option<Instant> = None;
    let mut next_busy_refresh = start;
    let mut servable_since: Option<(queue::Place, Instant)> = None;
    let mut select_held = false;
    // Set under select.lock when the GPUs should be probed once it is let go.
    let mut refresh_busy = false;
    // When the GPUs of the lease being decided were locked.
    let mut locked_at: Option<HostInstant> = None;
    loop {
        if let Some(sig) = signals::received() {
            return Err(LeaseError::Interrupted(sig));
        }
        let head = ticket.is_head().map_err(|e| io("reading the queue", e))?;
        let mut free: Vec<&PoolGpu> = Vec::with_capacity(candidates.len());
        for g in &candidates {
            match dir.state(&g.uuid) {
                Ok(LeaseState::Free) => free.push(g),
                Ok(LeaseState::Held(_)) => {}
                // Someone put a link, FIFO or hard link where a lock file belongs:
                // refuse at once rather than wait for a lock that is no lock.
                Err(e) if crate::lockdir::is_planted(&e) => return Err(LeaseError::Planted(e)),
                Err(_) => {}
            }
        }
        let free_ids: Vec<String> = free.iter().map(|g| g.uuid.clone()).collect();
        if free_ids != last_free {
            // A lease came or went: worth probing again right away.
            next_probe = Instant::now();
            last_free = free_ids;
        }
        let now = Instant::now();
        let my_turn = head || now >= next_overtake;
        if my_turn && free.len() >= need && now >= next_probe {
            if !head {
                next_overtake = now + OVERTAKE_EVERY;
            }
            // One decision at a time: the head and any overtaker must not interleave.
            let attempt = (|| -> Result<Option<Lease>, LeaseError> {
                // Waiting for the decision lock is bounded like the rest of the wait;
                // held past our deadline, the wait ends below and says who held it.
                match lock_until(&select, deadline) {
                    Ok(()) => {}
                    Err(LockWait::TimedOut) => {
                        select_held = true;
                        return Ok(None);
                    }
                    Err(LockWait::Interrupted(sig)) => return Err(LeaseError::Interrupted(sig)),
                    Err(LockWait::Io(e)) => return Err(io("locking select.lock", e)),
                }
                let ahead = if head {
                    Vec::new()
                } else {
                    ticket.ahead().map_err(|e| io("reading the queue", e))?
                };
                // Cheap first: would taking free GPUs be allowed at all?
                if !ahead.is_empty() {
                    match overtake_allowed(dir, &ahead, &free, &busy, need) {
                        Overtake::Yes => {}
                        Overtake::No => return Ok(None),
                        Overtake::NotWhileServable(place) => {
                            // A waiter ahead looks servable and should take its GPUs
                            // within moments. If it has not for BUSY_RECHECK, they are
                            // likely busy outside cibox: probe, so that GPUs busy for
                            // it do not hold up everyone behind it.
                            let now = Instant::now();
                            let since = match servable_since {
                                Some((p, t)) if p == place => t,
                                _ => {
                                    servable_since = Some((place, now));
                                    now
                                }
                            };
                            if now < since + BUSY_RECHECK || now < next_busy_refresh {
                                return Ok(None);
                            }
                            next_busy_refresh = now + BUSY_RECHECK;
                            // Probed after select.lock is let go (below); the next
                            // round decides with what it says.
                            refresh_busy = true;
                            return Ok(None);
                        }
                    }
                }
                // Choose by what the last probe said: the hand-out's own probe comes
                // after the GPUs are locked, outside this lock, so hand-outs are not
                // queued behind the driver. Past BUSY_RECHECK that word is old: every
                // free GPU may be chosen, those last seen busy last.
                let idle = if busy_seen.is_none_or(|t| t.elapsed() > BUSY_RECHECK) {
                    let mut all = free.clone();
                    all.sort_by_key(|g| busy.iter().any(|(i, _)| *i == g.index));
                    all
                } else {
                    idle_among(&free, &busy)
                };
                if idle.len() < need {
                    next_probe = Instant::now() + BUSY_RECHECK;
                    return Ok(None);
                }
                let Some(mut lease) = take(dir, &idle, need).map_err(|e| io("locking", e))? else {
                    return Ok(None);
                };
                locked_at = HostInstant::now();
                if !ahead.is_empty()
                    && may_overtake(dir, &ahead, lease.gpus(), &idle) != Overtake::Yes
                {
                    return Ok(None);
                }
                // Named at once, so `gpu status` shows who holds them while they are
                // checked; a busy verdict clears it with the lease.
                lease
                    .set_holder(&holder)
                    .map_err(|e| io("writing the holder", e))?;
                Ok(Some(lease))
            })();
            let _ = select.unlock();
            if std::mem::take(&mut refresh_busy) {
                let snap = probe(HostInstant::now());
                if let Some(sig) = signals::received() {
                    return Err(LeaseError::Interrupted(sig));
                }
                let snap = snap.map_err(LeaseError::Probe)?;
                busy = busy_among(&free, &snap, policy);
                busy_seen = Some(Instant::now());
                continue;
            }
            if let Some(lease) = attempt? {
                // The probe that decides: it starts after our GPUs are locked, so no one
                // else can take them meanwhile, and a busy verdict lets them go again.
                // Waiters served at once share one (see `probe::Prober::probe_since`).
                let snap = probe(locked_at);
                // Stopped meanwhile (the probe may have waited for another's): the
                // lease is dropped, not handed out.
                if let Some(sig) = signals::received() {
                    return Err(LeaseError::Interrupted(sig));
                }
                let snap = snap.map_err(LeaseError::Probe)?;
                busy = busy_among(&free, &snap, policy);
                busy_seen = Some(Instant::now());
                if lease
                    .gpus()
                    .iter()
                    .all(|g| pool::busy_reason(&g.uuid, &snap, policy).is_none())
                {
                    drop(ticket);
                    return Ok(lease);
                }
                // Busy outside cibox: let them go, and choose again knowing that.
                drop(lease);
                next_probe = Instant::now();
            }
        }
        let report = || WaitReport {
            position: if head { 0 } else { ticket.position() },
            leased: leased_now(dir, &candidates),
            busy: busy.clone(),
            waited: start.elapsed(),
        };
        if Instant::now() >= deadline {
            let r = report();
            let free = candidates.len() - r.leased.len();
            let held = if select_held {
                format!(
                    "; select.lock in {} stays locked by another process",
                    dir.path().display()
                )
            } else {
                String::new()
            };
            return Err(LeaseError::Capacity(format!(
                "could not lease {need} GPU(s) within {}: {free} of {} unleased; {}{held}",
                crate::units::Span(wait),
                candidates.len(),
                r.describe()
            )));
        }
        on_wait(&report);
        std::thread::sleep(POLL);
    }
}

/// The GPUs of `free` that `snap` shows busy, with the reason.
fn busy_among(free: &[&PoolGpu], snap: &Snapshot, policy: &IdlePolicy) -> Vec<(u32, String)> {
    free.iter()
        .filter_map(|g| pool::busy_reason(&g.uuid, snap, policy).map(|r| (g.index, r)))
        .collect()
}

fn idle_among<'a>(free: &[&'a PoolGpu], busy: &[(u32, String)]) -> Vec<&'a PoolGpu> {
    free.iter()
        .copied()
        .filter(|g| !busy.iter().any(|(i, _)| *i == g.index))
        .collect()
}

/// Whether a waiter behind the head could take `need` of the free GPUs not known to be
/// busy, by [`may_overtake`].
fn overtake_allowed(
    dir: &LockDir,
    ahead: &[(queue::Place, String)],
    free: &[&PoolGpu],
    busy: &[(u32, String)],
    need: usize,
) -> Overtake {
    let idle = idle_among(free, busy);
    let tentative: Vec<PoolGpu> = idle.iter().take(need).map(|g| (*g).clone()).collect();
    if tentative.len() < need {
        return Overtake::No;
    }
    may_overtake(dir, ahead, &tentative, &idle)
}

/// Locks `need` of `idle` in order; all or nothing (no hold-and-wait).
fn take(dir: &LockDir, idle: &[&PoolGpu], need: usize) -> std::io::Result<Option<Lease>> {
    let mut gpus = Vec::new();
    let mut files = Vec::new();
    for g in idle {
        if gpus.len() == need {
            break;
        }
        if let Some(f) = dir.try_take(&g.uuid)? {
            gpus.push((*g).clone());
            files.push(f);
        }
    }
    Ok((gpus.len() == need).then(|| Lease::new(gpus, files)))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let request = Request {
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
            Overtake::No,
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
        assert_eq!(may_overtake(&dir, &ahead, &pool[5..8], &free), Overtake::No);
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
        assert_eq!(may_overtake(&dir, &ahead, &pool[6..7], &some), Overtake::No);
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
            Overtake::No,
            "it may find GPU 0 busy and need another"
        );
    }

    #[test]
    fn an_unreadable_waiter_ahead_is_never_overtaken() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LockDir::open(tmp.path(), false).unwrap();
        let pool = gpus(8);
        let ahead = [(place(100), "not a request".to_string())];
        assert_eq!(
            may_overtake(&dir, &ahead, &pool[..1], &refs(&pool)),
            Overtake::No
        );
    }
}
