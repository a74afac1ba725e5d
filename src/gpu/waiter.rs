//! The one lease sequence, for `gpu exec` and for batches alike: a [`Waiter`] takes its
//! place in the fair queue on arrival ([`Waiter::arrive`], before the probe, so the
//! order of arrival is the order of service), then waits there for what a
//! [`LeaseRequest`] asks ([`Waiter::lease`]).
//!
//! Each round of the wait is a few named steps: see which candidates are unleased,
//! and, when it is this waiter's turn, choose and lock GPUs under `select.lock`
//! (`Acquisition::choose`), then let the probe that starts after the lock decide
//! (`Acquisition::confirm`). A busy verdict lets them go again and is remembered, so
//! the next choice avoids them.

use std::fs::File;
use std::time::{Duration, Instant};

use super::lease::{Holder, Lease, LeaseState};
use super::overtake::{Busy, Overtake, TicketRequest, idle_among, may_overtake, overtake_allowed};
use super::pool::{self, PoolGpu};
use super::probe::{HostInstant, Snapshot};
use super::queue::{self, Place, Ticket};
use super::{HEAD_START_PER_GPU, LeaseError, MAX_HEAD_START, ProbeFailure, WaitReport, Want};
use crate::lockdir::{LockDir, LockWait, lock_until};
use crate::manifest::IdlePolicy;
use crate::signals;

/// How often the waiter looks at the queue and the locks: hand-off latency is bounded
/// by this plus one probe (and one more per busy verdict).
const POLL: Duration = Duration::from_millis(10);
/// How often a waiter behind the head tries to overtake it (see [`may_overtake`]).
const OVERTAKE_EVERY: Duration = Duration::from_millis(50);
/// When GPUs are unleased but busy with work cibox does not know about, how long to
/// wait before probing again.
const BUSY_RECHECK: Duration = Duration::from_secs(1);
/// How long a waiter ahead may look servable without taking its GPUs: a real one takes
/// them within a probe; one that does not for this long is stuck, or a planted ticket,
/// and is passed over.
const SERVABLE_LIMIT: Duration = Duration::from_secs(30);

/// What a lease asks for.
pub struct LeaseRequest<'a> {
    /// Which GPUs, or how many.
    pub want: Want,
    /// The GPUs CI may use.
    pub pool: &'a [PoolGpu],
    /// When a GPU counts as idle.
    pub policy: &'a IdlePolicy,
    /// Who asks (named in the lock files while the lease is held).
    pub holder: &'a Holder,
    /// How long to wait, from the start of [`Waiter::lease`].
    pub wait: Duration,
    /// Asked at every poll: `Some(why)` gives up the wait (and the place in the queue).
    pub give_up: Option<&'a (dyn Fn() -> Option<String> + Sync)>,
}

/// A place in the queue, taken on arrival.
pub struct Waiter<'d> {
    dir: &'d LockDir,
    ticket: Ticket,
}

impl<'d> Waiter<'d> {
    /// Takes a place in the queue for a request of `need` GPUs, waiting at most until
    /// `deadline` to join.
    pub fn arrive(
        dir: &'d LockDir,
        holder: &Holder,
        need: usize,
        deadline: Instant,
    ) -> Result<Waiter<'d>, LeaseError> {
        // What it asks, from the start: its pool is not known yet (gpu exec probes after
        // it arrives), which the waiters behind read as the strictest case.
        let pending = TicketRequest {
            need,
            pool: Vec::new(),
            devices: None,
            holder: holder.clone(),
        };
        let description = serde_json::to_string(&pending).expect("request serialises");
        let head_start =
            (HEAD_START_PER_GPU * need.saturating_sub(1).min(64) as u32).min(MAX_HEAD_START);
        let ticket =
            Ticket::enqueue(dir, &description, head_start, deadline).map_err(|w| match w {
                LockWait::TimedOut => LeaseError::QueueTimedOut {
                    dir: dir.path().display().to_string(),
                },
                LockWait::Interrupted(sig) => LeaseError::Interrupted(sig),
                LockWait::Io(e) => LeaseError::locks(dir, "joining the queue")(e),
            })?;
        Ok(Waiter { dir, ticket })
    }

    /// Leases what `request` asks, waiting up to `request.wait` in the fair queue. The
    /// head of the queue takes GPUs as soon as enough are free and idle; waiters behind
    /// it take idle GPUs only where `may_overtake` allows. `probe` asks the driver (and
    /// the engine, for the GPUs running cibox containers hold), from a probe that started
    /// at the given instant or later; `on_wait` is called every poll while waiting with a
    /// function that builds the (costly) report, so it can build one only when it means
    /// to show it.
    pub fn lease(
        self,
        request: &LeaseRequest<'_>,
        probe: impl FnMut(Option<HostInstant>) -> Result<Snapshot, ProbeFailure>,
        mut on_wait: impl FnMut(&dyn Fn() -> WaitReport),
    ) -> Result<Lease, LeaseError> {
        let mut a = Acquisition::begin(self, request, probe)?;
        // Busy verdicts since the last pause: each may be followed at once by another
        // choice among the GPUs the probe found idle (bounded by the candidates).
        let mut verdicts = 0;
        loop {
            a.stop_if_signalled()?;
            if let Some(why) = request.give_up.and_then(|g| g()) {
                return Err(LeaseError::GaveUp(why));
            }
            let head = a
                .ticket
                .is_head()
                .map_err(|e| a.io("reading the queue", e))?;
            let free = a.free_candidates()?;
            a.note_free(&free);
            if a.my_turn(head, free.len()) {
                match a.choose(head, &free)? {
                    Choice::Lease(lease, locked_at) => {
                        if let Some(lease) = a.confirm(lease, locked_at, &free)? {
                            return Ok(lease);
                        }
                        verdicts += 1;
                        if a.try_again_at_once(&free, verdicts) {
                            continue;
                        }
                    }
                    Choice::ProbeBusyFirst => {
                        a.refresh_busy(&free)?;
                        continue;
                    }
                    Choice::NotNow => {}
                }
            }
            if Instant::now() >= a.deadline {
                return Err(a.give_up(head));
            }
            on_wait(&|| a.report(head));
            verdicts = 0;
            std::thread::sleep(POLL);
        }
    }
}

/// What one turn under `select.lock` decided.
enum Choice {
    /// These GPUs are locked (at that instant) and named ours; the probe decides.
    Lease(Lease, Option<HostInstant>),
    /// A waiter ahead looked servable for a while: probe before deciding again.
    ProbeBusyFirst,
    /// Nothing to take this round.
    NotNow,
}

/// One wait in progress: what the rounds of [`Waiter::lease`] share.
struct Acquisition<'a, P> {
    dir: &'a LockDir,
    ticket: Ticket,
    /// Keeps the ticket fresh while we wait (see [`Ticket::heartbeat`]).
    _heartbeat: queue::Heartbeat,
    /// `select.lock`, unless it is root's alone and we are not root (see
    /// [`LockDir::open_select_lock`]): then we decide without it.
    select: Option<File>,
    candidates: Vec<PoolGpu>,
    need: usize,
    policy: &'a IdlePolicy,
    /// The holder, with our place in the queue.
    holder: Holder,
    probe: P,
    start: Instant,
    deadline: Instant,
    wait: Duration,
    /// The free candidates last seen: a change means a lease came or went.
    last_free: Vec<String>,
    next_probe: Instant,
    next_overtake: Instant,
    /// What the last probe said of the free GPUs: those busy outside cibox.
    busy: BusyView,
    /// The waiter ahead that looked servable, and since when.
    servable_since: Option<(Place, Instant)>,
    /// Waiters ahead passed over: servable for longer than [`SERVABLE_LIMIT`].
    stuck: Vec<Place>,
    /// The waiter ahead that kept us from taking GPUs last time, for the refusal.
    blocker: Option<Place>,
    /// `select.lock` stayed locked by another process until our deadline.
    select_held: bool,
}

/// The GPUs a probe showed busy outside cibox, and when.
struct BusyView {
    gpus: Vec<Busy>,
    /// When `gpus` was last seen; older than [`BUSY_RECHECK`] it is not trusted to rule a
    /// GPU out (the hand-out's own probe still rules).
    seen: Option<Instant>,
    next_refresh: Instant,
}

impl<'a, P> Acquisition<'a, P>
where
    P: FnMut(Option<HostInstant>) -> Result<Snapshot, ProbeFailure>,
{
    /// Describes our request on the ticket for the waiters behind us, and starts its
    /// heartbeat.
    fn begin(
        waiter: Waiter<'a>,
        request: &LeaseRequest<'a>,
        probe: P,
    ) -> Result<Acquisition<'a, P>, LeaseError> {
        let Waiter { dir, mut ticket } = waiter;
        let start = Instant::now();
        let io = |what: &'static str, e: std::io::Error| LeaseError::locks(dir, what)(e);
        let candidates: Vec<PoolGpu> = match &request.want {
            Want::Count(_) => request.pool.to_vec(),
            Want::Devices(d) => d.clone(),
        };
        let mut holder = request.holder.clone();
        holder.ticket = Some(ticket.place());
        let described = TicketRequest {
            need: request.want.count(),
            pool: request.pool.iter().map(|g| g.uuid.clone()).collect(),
            devices: matches!(request.want, Want::Devices(_))
                .then(|| candidates.iter().map(|g| g.uuid.clone()).collect()),
            holder: holder.clone(),
        };
        ticket
            .describe(&serde_json::to_string(&described).expect("request serialises"))
            .map_err(|e| io("writing the ticket", e))?;
        let heartbeat = ticket
            .heartbeat()
            .map_err(|e| io("starting the ticket's heartbeat", e))?;
        let select = dir
            .open_select_lock()
            .map_err(|e| io("opening select.lock", e))?;
        Ok(Acquisition {
            dir,
            ticket,
            _heartbeat: heartbeat,
            select,
            candidates,
            need: request.want.count(),
            policy: request.policy,
            holder,
            probe,
            start,
            deadline: start + request.wait,
            wait: request.wait,
            last_free: Vec::new(),
            next_probe: start,
            next_overtake: start,
            busy: BusyView {
                gpus: Vec::new(),
                seen: None,
                next_refresh: start,
            },
            servable_since: None,
            stuck: Vec::new(),
            blocker: None,
            select_held: false,
        })
    }

    fn io(&self, what: &'static str, e: std::io::Error) -> LeaseError {
        LeaseError::locks(self.dir, what)(e)
    }

    fn stop_if_signalled(&self) -> Result<(), LeaseError> {
        match signals::received() {
            Some(sig) => Err(LeaseError::Interrupted(sig)),
            None => Ok(()),
        }
    }

    /// The candidates nobody leases now. Something planted where a lock file belongs
    /// (a link, FIFO or hard link) is refused at once rather than waited for: a lock
    /// that is no lock.
    fn free_candidates(&self) -> Result<Vec<PoolGpu>, LeaseError> {
        let mut free = Vec::with_capacity(self.candidates.len());
        for g in &self.candidates {
            match self.dir.state_of(g) {
                Ok(LeaseState::Free) => free.push(g.clone()),
                Ok(LeaseState::Held(_)) => {}
                Err(e) if crate::lockdir::is_planted(&e) => return Err(LeaseError::Planted(e)),
                Err(_) => {}
            }
        }
        Ok(free)
    }

    /// A lease came or went since the last round: worth probing again right away.
    fn note_free(&mut self, free: &[PoolGpu]) {
        let ids: Vec<String> = free.iter().map(|g| g.uuid.clone()).collect();
        if ids != self.last_free {
            self.next_probe = Instant::now();
            self.last_free = ids;
        }
    }

    /// Whether this round may try to take GPUs: the head always, others every
    /// [`OVERTAKE_EVERY`]; only when enough are free and no probe is due later.
    fn my_turn(&mut self, head: bool, free: usize) -> bool {
        let now = Instant::now();
        let turn =
            (head || now >= self.next_overtake) && free >= self.need && now >= self.next_probe;
        if turn && !head {
            self.next_overtake = now + OVERTAKE_EVERY;
        }
        turn
    }

    /// One decision under `select.lock`, so the head and any overtaker do not
    /// interleave. Errors come after the lock is let go.
    fn choose(&mut self, head: bool, free: &[PoolGpu]) -> Result<Choice, LeaseError> {
        let choice = self.choose_locked(head, free);
        if let Some(select) = &self.select {
            let _ = select.unlock();
        }
        choice
    }

    fn choose_locked(&mut self, head: bool, free: &[PoolGpu]) -> Result<Choice, LeaseError> {
        // Waiting for the decision lock is bounded like the rest of the wait; held past
        // our deadline, the wait ends and says who held it.
        match self
            .select
            .as_ref()
            .map_or(Ok(()), |s| lock_until(s, self.deadline))
        {
            Ok(()) => {}
            Err(LockWait::TimedOut) => {
                self.select_held = true;
                return Ok(Choice::NotNow);
            }
            Err(LockWait::Interrupted(sig)) => return Err(LeaseError::Interrupted(sig)),
            Err(LockWait::Io(e)) => return Err(self.io("locking select.lock", e)),
        }
        let mut ahead = if head {
            Vec::new()
        } else {
            self.ticket
                .ahead()
                .map_err(|e| self.io("reading the queue", e))?
        };
        ahead.retain(|a| !self.stuck.contains(&a.place));
        if ahead.is_empty() {
            self.servable_since = None;
        }
        let free: Vec<&PoolGpu> = free.iter().collect();
        // Cheap first: would taking free GPUs be allowed at all?
        if !ahead.is_empty() {
            match overtake_allowed(self.dir, &ahead, &free, &self.busy.gpus, self.need) {
                Overtake::Yes => {}
                Overtake::No(place) => {
                    self.blocker = place.or(self.blocker);
                    self.servable_since = None;
                    return Ok(Choice::NotNow);
                }
                Overtake::NotWhileServable(place) => {
                    self.blocker = Some(place);
                    return Ok(self.while_servable(place));
                }
            }
        }
        let idle = self.choosable(&free);
        if idle.len() < self.need {
            self.next_probe = Instant::now() + BUSY_RECHECK;
            return Ok(Choice::NotNow);
        }
        let Some(mut lease) =
            take(self.dir, &idle, self.need).map_err(|e| self.io("locking", e))?
        else {
            return Ok(Choice::NotNow);
        };
        let locked_at = HostInstant::now();
        if !ahead.is_empty() && may_overtake(self.dir, &ahead, lease.gpus(), &idle) != Overtake::Yes
        {
            return Ok(Choice::NotNow);
        }
        // Named at once, so `gpu status` shows who holds them while they are checked; a
        // busy verdict clears it with the lease.
        lease
            .set_holder(&self.holder)
            .map_err(|e| self.io("writing the holder", e))?;
        Ok(Choice::Lease(lease, locked_at))
    }

    /// A waiter ahead looks servable and should take its GPUs within moments. If it
    /// has not for [`BUSY_RECHECK`], they are likely busy outside cibox: probe (after
    /// `select.lock` is let go), so that GPUs busy for it do not hold up everyone behind
    /// it; the next round decides with what the probe says.
    fn while_servable(&mut self, place: Place) -> Choice {
        let now = Instant::now();
        let since = match self.servable_since {
            Some((p, t)) if p == place => t,
            _ => {
                self.servable_since = Some((place, now));
                now
            }
        };
        if now >= since + SERVABLE_LIMIT {
            self.stuck.push(place);
            return Choice::NotNow;
        }
        if now < since + BUSY_RECHECK || now < self.busy.next_refresh {
            return Choice::NotNow;
        }
        self.busy.next_refresh = now + BUSY_RECHECK;
        Choice::ProbeBusyFirst
    }

    /// The free GPUs to choose from, by what the last probe said: the hand-out's own
    /// probe comes after the GPUs are locked, outside `select.lock`, so hand-outs are
    /// not queued behind the driver. Past [`BUSY_RECHECK`] that word is old: every free
    /// GPU may be chosen, those last seen busy last.
    fn choosable<'f>(&self, free: &[&'f PoolGpu]) -> Vec<&'f PoolGpu> {
        if self.busy.seen.is_none_or(|t| t.elapsed() > BUSY_RECHECK) {
            let mut all = free.to_vec();
            all.sort_by_key(|g| self.busy.gpus.iter().any(|(b, _)| b.uuid == g.uuid));
            all
        } else {
            idle_among(free, &self.busy.gpus)
        }
    }

    /// Probes and remembers which free GPUs are busy outside cibox.
    fn refresh_busy(&mut self, free: &[PoolGpu]) -> Result<(), LeaseError> {
        let snap = (self.probe)(HostInstant::now());
        self.stop_if_signalled()?;
        let snap = snap.map_err(LeaseError::Probe)?;
        self.remember_busy(free, &snap);
        self.refuse_if_too_sick(&snap)
    }

    /// Fails at once when fewer candidates than asked read healthy: waiting cannot
    /// help until someone resets the sick ones.
    fn refuse_if_too_sick(&self, snap: &Snapshot) -> Result<(), LeaseError> {
        let sick = pool::sick_among(&self.candidates, snap);
        let healthy = self.candidates.len() - sick.len();
        if healthy < self.need {
            return Err(LeaseError::Sick {
                need: self.need,
                healthy,
                candidates: self.candidates.len(),
                sick,
            });
        }
        Ok(())
    }

    fn remember_busy(&mut self, free: &[PoolGpu], snap: &Snapshot) {
        self.busy.gpus = free
            .iter()
            .filter_map(|g| pool::busy_reason(&g.uuid, snap, self.policy).map(|r| (g.clone(), r)))
            .collect();
        self.busy.seen = Some(Instant::now());
    }

    /// The probe that decides: it starts after our GPUs are locked, so no one else can
    /// take them meanwhile, and a busy verdict lets them go again. Waiters served at
    /// once share one (see `probe::Prober::probe_since`). `None`: busy outside cibox,
    /// let go; the next choice knows that.
    fn confirm(
        &mut self,
        lease: Lease,
        locked_at: Option<HostInstant>,
        free: &[PoolGpu],
    ) -> Result<Option<Lease>, LeaseError> {
        let snap = (self.probe)(locked_at);
        // Stopped meanwhile (the probe may have waited for another's): the lease is
        // dropped, not handed out.
        self.stop_if_signalled()?;
        let snap = snap.map_err(LeaseError::Probe)?;
        self.remember_busy(free, &snap);
        self.refuse_if_too_sick(&snap)?;
        if lease
            .gpus()
            .iter()
            .all(|g| pool::busy_reason(&g.uuid, &snap, self.policy).is_none())
        {
            return Ok(Some(lease));
        }
        drop(lease);
        self.next_probe = Instant::now();
        Ok(None)
    }

    /// After a busy verdict: whether to choose again before the deadline is looked at
    /// or the poll sleeps. The probe just said which free GPUs are idle, so when enough
    /// are, one try (`--wait 0s`) or the last round goes on to them rather than giving
    /// up with idle GPUs unleased. At most one more choice per candidate, so GPUs that
    /// flip between busy and idle cannot keep it here.
    fn try_again_at_once(&mut self, free: &[PoolGpu], verdicts: usize) -> bool {
        let free: Vec<&PoolGpu> = free.iter().collect();
        let again = verdicts <= self.candidates.len()
            && idle_among(&free, &self.busy.gpus).len() >= self.need;
        if again {
            // An overtaker's turn is rate-limited; this is the same turn, carried on.
            self.next_overtake = Instant::now();
        }
        again
    }

    /// What we know while we wait, for progress lines and the final refusal.
    fn report(&self, head: bool) -> WaitReport {
        WaitReport {
            position: if head { 0 } else { self.ticket.position() },
            first_ahead: None,
            leased: leased_now(self.dir, &self.candidates),
            busy: self.busy.gpus.iter().map(said_of).collect(),
            waited: self.start.elapsed(),
            left: self.deadline.saturating_duration_since(Instant::now()),
        }
    }

    /// The refusal when the wait ran out: what is leased, busy, ahead, and who held
    /// `select.lock` if someone did.
    fn give_up(&self, head: bool) -> LeaseError {
        let mut r = self.report(head);
        if r.position > 0 {
            r.first_ahead = match self.blocker {
                Some(place) => self.ticket.holder_at(place),
                None => self.ticket.holder_ahead(),
            };
        }
        let free = self.candidates.len() - r.leased.len();
        let select_held_by = self.select_held.then(|| {
            self.select
                .as_ref()
                .and_then(crate::lockdir::lock_holder)
                .unwrap_or_else(|| "another process".into())
        });
        LeaseError::TimedOut {
            need: self.need,
            wait: self.wait,
            free,
            candidates: self.candidates.len(),
            waiting: r.describe(),
            dir: self.dir.path().display().to_string(),
            select_held_by,
        }
    }
}

/// A unit as wait lines say it: its GPU's index, and what it is busy with (naming the
/// slice, for a MIG slice).
fn said_of((g, why): &Busy) -> (u32, String) {
    match &g.parent {
        None => (g.index, why.clone()),
        Some(_) => (g.index, format!("slice {}: {why}", g.uuid)),
    }
}

/// Each candidate that is leased now, with its holder.
fn leased_now(dir: &LockDir, gpus: &[PoolGpu]) -> Vec<(u32, String)> {
    gpus.iter()
        .filter_map(|g| match dir.state_of(g) {
            Ok(LeaseState::Held(h)) => {
                let by = h.map(|h| h.describe()).unwrap_or_else(|| {
                    dir.kernel_holder(&g.uuid)
                        .unwrap_or_else(|| "an unknown holder".into())
                });
                Some(match &g.parent {
                    None => (g.index, by),
                    Some(_) => (g.index, format!("(slice {}) {by}", g.uuid)),
                })
            }
            // A whole GPU reads free while slices of it are leased (MIG mode switched
            // off since): it is no more free than a leased one, so name who holds them.
            Ok(LeaseState::Free) if g.parent.is_none() => {
                dir.slice_holders(&g.uuid).map(|by| (g.index, by))
            }
            Ok(LeaseState::Free) => None,
            Err(e) => Some((g.index, format!("unreadable lock file: {e}"))),
        })
        .collect()
}

/// Locks `need` of `idle` in order; all or nothing (no hold-and-wait). A slice whose
/// GPU is leased whole (or a GPU one of whose slices is) is passed over.
fn take(dir: &LockDir, idle: &[&PoolGpu], need: usize) -> std::io::Result<Option<Lease>> {
    let mut gpus = Vec::new();
    let mut files = Vec::new();
    let mut guards = Vec::new();
    for g in idle {
        if gpus.len() == need {
            break;
        }
        if let Some((own, guard)) = dir.try_take_unit(g)? {
            gpus.push((*g).clone());
            files.push(own);
            guards.extend(guard);
        }
    }
    Ok((gpus.len() == need).then(|| Lease::with_guards(gpus, files, guards)))
}
