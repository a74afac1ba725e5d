//! What the runner tells its reporters, in the order it happens. The runner prints
//! nothing itself: every line, file and GitHub command comes from a reporter that
//! handles these ([`crate::report::reporter`]).

use std::path::Path;
use std::time::Duration;

use crate::engine::EngineError;
use crate::gpu::WaitReport;
use crate::gpu::pool::PoolGpu;
use crate::plan::{BatchPlan, RunPlan};
use crate::report::outcome::{BatchResult, RunResult};
use crate::report::sweep::Swept;

/// The steps of a run and of each batch, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The run's images were verified against their lock files.
    Verify,
    /// The batch's Slurm job left Slurm's queue: its nodes were allocated.
    Queue,
    /// The batch's GPUs were leased (or it needs none).
    Lease,
    /// Its container was created.
    Create,
    /// The source was copied into its `/work`.
    Copy,
    /// An install, preflight or run step was announced.
    Install,
    Preflight,
    Run,
    /// Its `/reports` was copied out and its test cases read.
    Collect,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Verify => "verify",
            Phase::Queue => "queue",
            Phase::Lease => "lease",
            Phase::Create => "create",
            Phase::Copy => "copy",
            Phase::Install => "install",
            Phase::Preflight => "preflight",
            Phase::Run => "run",
            Phase::Collect => "collect",
        }
    }
}

pub enum Event<'a> {
    /// The image is verified and the run's lock held; batches start next.
    RunStarted { plan: &'a RunPlan },
    /// The sweep of this scope's leftover containers (of dead runs) is done.
    Swept { scope: &'a str, swept: &'a Swept },
    /// The batch's folder is ready (fresh, marked as cibox's); nothing runs yet.
    BatchStarted,
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
    Launching { batch: &'a BatchPlan, dir: &'a Path },
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
    /// The batch's status and record.
    BatchEnded { result: &'a BatchResult },
    /// Every batch has ended (or a signal stopped the run).
    RunEnded { run: &'a RunResult },
}
