//! GPUs: probing what they do ([`probe`]), which ones CI may use ([`pool`]) and which
//! of those a request for a model may have ([`model`]), leasing them ([`lease`])
//! through one sequence ([`waiter`]) behind the fair [`queue`], where waiters may
//! overtake only as `overtake` allows, and handing leased ones to a container as their
//! vendor does it ([`vendor`]).
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - [`fake`]: fake GPUs of a vendor and model, for a machine without them;
//! - [`probe`]: what the driver says, each vendor's backend giving one reading;
//! - [`pool`]: the units CI may use, and the idle verdict;
//! - [`model`]: the units a request for a model may have;
//! - [`queue`]: the fair queue's tickets;
//! - [`lease`]: the lock files;
//! - [`overtake`]: when a waiter may go ahead;
//! - [`waiter`]: the lease sequence;
//! - [`vendor`]: how each vendor's leased units reach a container or a command.
//!
//! A GPU is handed out only when it is in the pool, not leased, and idle by a probe that
//! started after it was locked for the hand-out. Anything uncertain fails closed.

pub mod fake;
pub mod lease;
pub mod model;
mod overtake;
pub mod pool;
pub mod probe;
pub mod queue;
pub mod vendor;
pub mod waiter;

use std::time::Duration;

pub use waiter::{LeaseRequest, Waiter};

use crate::exit::Failure;
use crate::lockdir::LockDir;
use pool::PoolGpu;
use probe::Snapshot;

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
    /// The wait allowed ran out before the request had a place in the queue.
    #[error("could not join the queue in {dir} within the wait")]
    QueueTimedOut { dir: String },
    /// The wait allowed ran out before enough GPUs were free and idle.
    #[error(
        "could not lease {need} GPU(s) within {}: {free} of {candidates} unleased; {waiting}{}",
        crate::units::Span(*.wait),
        held(.select_held_by, .dir)
    )]
    TimedOut {
        need: usize,
        wait: Duration,
        /// The candidates not leased at the end of the wait.
        free: usize,
        candidates: usize,
        /// What the wait came to: the place in the queue, and who holds or uses what.
        waiting: String,
        dir: String,
        /// Who held `select.lock` (the hand-out's lock) at the end, when it stayed held.
        select_held_by: Option<String>,
    },
    /// Too few of the candidates read healthy for the request ever to be met while the
    /// others stay sick (they come back only when the driver reads them healthy,
    /// after a reset): said at once, naming each and why.
    #[error(
        "cannot lease {need} GPU(s): {healthy} of {candidates} read healthy; the driver reports {}",
        .sick.join("; ")
    )]
    Sick {
        need: usize,
        healthy: usize,
        candidates: usize,
        /// Each sick candidate and why (`GPU 3 (GPU-…): 2 uncorrected ECC errors …`).
        sick: Vec<String>,
    },
    /// cibox was asked to stop while it waited.
    #[error("stopped by {0}")]
    Interrupted(nix::sys::signal::Signal),
    /// The asker gave up waiting (another batch of its run failed, and the run stops
    /// at its first failure).
    #[error("gave up waiting: {0}")]
    GaveUp(String),
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
    pub(crate) fn locks(
        dir: &LockDir,
        what: &'static str,
    ) -> impl Fn(std::io::Error) -> LeaseError {
        let dir = dir.path().display().to_string();
        move |source| LeaseError::Locks {
            dir: dir.clone(),
            what,
            source,
        }
    }
}

impl crate::error::ErrorKind for LeaseError {
    fn failure(&self) -> Failure {
        match self {
            LeaseError::QueueTimedOut { .. }
            | LeaseError::TimedOut { .. }
            | LeaseError::Sick { .. } => Failure::Capacity,
            LeaseError::Interrupted(sig) => Failure::Signal(*sig),
            // The run that gave up says why; nothing failed here.
            LeaseError::GaveUp(_) => Failure::Infra,
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
}

/// `; select.lock in DIR stays locked by HOLDER`, when it stayed held.
fn held(by: &Option<String>, dir: &str) -> String {
    match by {
        Some(holder) => format!("; select.lock in {dir} stays locked by {holder}"),
        None => String::new(),
    }
}

/// Why `--devices` does not name GPUs a command may lease: a usage error.
#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    #[error("--devices `{list}` has an empty entry")]
    EmptyEntry { list: String },
    #[error("--devices: `{item}` is not a GPU on this host")]
    NotOnHost { item: String },
    #[error("--devices names GPU {index} twice")]
    Twice { index: u32 },
    #[error("--devices: GPU {index} ({uuid}) is not in the CI pool (gpu.pool / CIBOX_GPU_POOL)")]
    NotInPool { index: u32, uuid: String },
}

impl crate::error::ErrorKind for DevicesError {
    fn failure(&self) -> Failure {
        Failure::Usage
    }
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
) -> Result<Vec<PoolGpu>, DevicesError> {
    let mut out: Vec<PoolGpu> = Vec::new();
    for item in list.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(DevicesError::EmptyEntry { list: list.into() });
        }
        // An index names a whole GPU; a MIG slice is named by its UUID.
        let Some(g) = snapshot
            .gpus
            .iter()
            .find(|g| g.uuid == item || (g.parent.is_none() && g.index.to_string() == item))
        else {
            return Err(DevicesError::NotOnHost { item: item.into() });
        };
        if out.iter().any(|o| o.uuid == g.uuid) {
            return Err(DevicesError::Twice { index: g.index });
        }
        let Some(p) = pool.iter().find(|p| p.uuid == g.uuid) else {
            return Err(DevicesError::NotInPool {
                index: g.index,
                uuid: g.uuid.clone(),
            });
        };
        out.push(p.clone());
    }
    Ok(out)
}

/// When a wait that has `left` to go gives up, as wait lines say it: `gives up in
/// 4m 48s, at 12:04:05Z` (whole seconds, rounded up: a 30 s wait reads 30s at its
/// start).
pub fn gives_up(left: Duration) -> String {
    let clock = crate::units::rfc3339(std::time::SystemTime::now() + left);
    let whole = Duration::from_secs(left.as_secs() + u64::from(left.subsec_nanos() > 0));
    format!(
        "gives up in {}, at {}Z",
        crate::units::human(whole),
        &clock[11..19]
    )
}

/// What a waiter knows while it waits, for progress lines and the final refusal.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct WaitReport {
    pub position: usize,
    /// Who holds the nearest ticket ahead, when there is one (for the final refusal).
    pub first_ahead: Option<String>,
    pub leased: Vec<(u32, String)>,
    pub busy: Vec<(u32, String)>,
    pub waited: Duration,
    /// How long until the wait gives up.
    pub left: Duration,
}

impl WaitReport {
    /// The wait line's text: the place in the queue, what holds the GPUs, and when the
    /// wait gives up (`queue position 2 (1 waiter(s) ahead), leased: GPU 0 by …; gives up
    /// in 4m 48s, at 12:04:05Z`).
    pub fn progress(&self) -> String {
        format!(
            "queue position {}, {}; {}",
            self.position + 1,
            self.describe(),
            gives_up(self.left)
        )
    }

    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.position > 0 {
            let first = self
                .first_ahead
                .as_ref()
                .map(|f| format!(" (the first: {f})"))
                .unwrap_or_default();
            parts.push(format!("{} waiter(s) ahead{first}", self.position));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_that_ran_out_says_what_it_came_to() {
        let out = |held: Option<&str>| LeaseError::TimedOut {
            need: 2,
            wait: Duration::from_secs(30),
            free: 1,
            candidates: 4,
            waiting: "leased: GPU 0 by pid 7".into(),
            dir: "/run/cibox".into(),
            select_held_by: held.map(str::to_string),
        };
        assert_eq!(
            out(None).to_string(),
            "could not lease 2 GPU(s) within 30s: 1 of 4 unleased; leased: GPU 0 by pid 7"
        );
        assert_eq!(
            out(Some("pid 9")).to_string(),
            "could not lease 2 GPU(s) within 30s: 1 of 4 unleased; leased: GPU 0 by pid 7; select.lock in /run/cibox stays locked by pid 9"
        );
        assert_eq!(
            crate::error::Error::from(out(None)).exit_code(),
            crate::exit::CAPACITY
        );
    }
}
