//! What the runner tells its reporters, in the order it happens. The runner prints
//! nothing itself: every line, file and GitHub command comes from a reporter that
//! handles these ([`crate::report::reporter`]).
//!
//! Each [`Event`] carries when it happened, on the wall clock and since its run
//! started, taken once where it happened ([`RunClock`]): reporters keep no clock of
//! their own, and an event a Slurm node relays keeps the node's time.

use std::time::{Duration, Instant, SystemTime};

use crate::engine::EngineError;
use crate::gpu::WaitReport;
use crate::gpu::pool::PoolGpu;
use crate::nofollow::Folder;
use crate::plan::{BatchPlan, RunPlan};
use crate::report::outcome::{BatchResult, RunResult};
use crate::report::sweep::Swept;

pub use crate::plan::container::phases::Phase;

/// One event: what happened, and when.
pub struct Event<'a> {
    /// When it happened, on the wall clock of the host where it happened.
    pub timestamp: SystemTime,
    /// How long into the run it happened (on the run's own monotonic clock, so that
    /// durations a reporter takes from it never go backwards).
    pub elapsed: Duration,
    pub kind: EventKind<'a>,
}

/// Where a run's events take their times from: its start.
#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    started: Instant,
    started_at: SystemTime,
}

impl RunClock {
    /// A clock for a run starting now.
    pub fn start() -> RunClock {
        RunClock {
            started: Instant::now(),
            started_at: SystemTime::now(),
        }
    }

    /// How long the run has been going.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// `kind`, happening now.
    pub fn now<'a>(&self, kind: EventKind<'a>) -> Event<'a> {
        let elapsed = self.started.elapsed();
        Event {
            timestamp: self.started_at + elapsed,
            elapsed,
            kind,
        }
    }

    /// `kind`, which happened at `timestamp` on another host (a Slurm node's clock),
    /// placed on this run's: never before the run started.
    pub fn at<'a>(&self, timestamp: SystemTime, kind: EventKind<'a>) -> Event<'a> {
        Event {
            timestamp,
            elapsed: timestamp
                .duration_since(self.started_at)
                .unwrap_or(Duration::ZERO),
            kind,
        }
    }
}

/// What happened.
pub enum EventKind<'a> {
    /// The image is verified and the run's lock held; batches start next.
    RunStarted {
        plan: &'a RunPlan,
        /// The reports folder, held open: what a reporter writes there goes in by name.
        reports: &'a Folder,
    },
    /// The sweep of this scope's leftover containers (of dead runs) is done.
    Swept { scope: &'a str, swept: &'a Swept },
    /// The batch's folder is ready (fresh, marked as cibox's); nothing runs yet.
    BatchStarted {
        batch: &'a BatchPlan,
        /// `<reports>/<batch>/`, held open.
        dir: &'a Folder,
    },
    /// The batch waits for its GPUs. Sent every poll (10 ms): `report` builds the
    /// (costly) wait report, so a reporter builds one only when it shows it.
    Waiting {
        batch: &'a BatchPlan,
        report: &'a dyn Fn() -> WaitReport,
    },
    /// The batch's Slurm job waits in Slurm's queue (sent as the submitter polls it):
    /// `state` is Slurm's, with its reason (`PENDING (Resources)`); `left`, how long
    /// until the wait gives up (`--wait`).
    Queued {
        batch: &'a BatchPlan,
        job: &'a str,
        state: &'a str,
        left: Duration,
    },
    /// The batch holds its GPUs until it ends.
    LeaseGranted {
        batch: &'a BatchPlan,
        gpus: &'a [PoolGpu],
    },
    /// The batch's container is about to be created (its GPUs, if any, are leased):
    /// its log can be opened. An error here fails the batch, not the run.
    Launching { batch: &'a BatchPlan },
    /// The batch's container runs; its output follows.
    ContainerStarted {
        batch: &'a BatchPlan,
        container: &'a str,
    },
    /// A chunk of the container's output (stdout and stderr interleaved).
    Output {
        batch: &'a BatchPlan,
        bytes: &'a [u8],
    },
    /// The container's output has closed.
    OutputEnded { batch: &'a BatchPlan },
    /// Time passed while the batch ran (every 100 ms), printed or not: a reporter that
    /// shows a quiet batch is alive counts from here.
    Tick { batch: &'a BatchPlan },
    /// A step of the run began or ended (what `-v` shows): `batch` is `None` for the
    /// run's own steps; `at` is the time since the batch started.
    Phase {
        batch: Option<&'a BatchPlan>,
        phase: Phase,
        at: Duration,
        detail: String,
    },
    /// The batch hit its timeout; its container is being stopped.
    TimedOut { batch: &'a BatchPlan },
    /// The container's output could not be followed to its end.
    OutputBroke {
        batch: &'a BatchPlan,
        error: &'a EngineError,
    },
    /// Something kept the batch from running to its end (its status follows).
    BatchFailed {
        batch: &'a BatchPlan,
        error: &'a crate::error::Error,
    },
    /// An attempt at the batch ended without passing, and it runs again (attempt
    /// `next`, 1-based): what the attempt left is set aside before the next begins.
    AttemptEnded {
        batch: &'a BatchPlan,
        result: &'a BatchResult,
        next: u32,
    },
    /// The batch's status and record.
    BatchEnded { result: &'a BatchResult },
    /// Every batch has ended (or a signal stopped the run).
    RunEnded { run: &'a RunResult },
}
