//! Batches as Slurm jobs (docs/interface.md §14). On a login node whose host policy
//! says `scheduler: slurm`, [`execute`] submits each batch of a plan as a job (`srun`,
//! one task per node) and relays what the nodes tell: each node runs the batch as a
//! local run does (`cibox __slurm-node`: the GPUs Slurm allocated, leased and checked,
//! the same disposable container) and sends its events back on `srun`'s output. The
//! reporters see the run as they see a local one.
//!
//! - [`node`]: what a node is told ([`NodeJob`]) and how it plans the batch again;
//! - `follow`: one batch's job, from `srun` to its end (queue, cancel, deadlines);
//! - `relay`: the nodes' messages as the submitter's events;
//! - `records`: the batch's record, from its nodes' or, when none came, from why;
//! - `watchdog`: a job never outlives the cibox that submitted it.

mod follow;
pub mod node;
mod records;
mod relay;
mod watchdog;

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

pub use node::NodeJob;
pub use watchdog::watch as watch_job;

use crate::host::SlurmPolicy;
use crate::image::Lockset;
use crate::nofollow::Folder;
use crate::plan::RunPlan;
use crate::report::event::{Event, EventKind, RunClock};
use crate::report::outcome::{BatchResult, RunResult};
use crate::report::reporter::Reporter;
use crate::run::batch_dir;
use crate::run::error::RunError;
use crate::run::order::{FirstFailure, Together, each_batch};
use crate::signals;
use crate::slurm::cluster::{Ask, Cluster};

use crate::error::Result;

/// Submits the plan's batches to Slurm and follows them to their end.
pub fn execute(
    plan: &RunPlan,
    locksets: &indexmap::IndexMap<String, Lockset>,
    policy: &SlurmPolicy,
    reporter: &mut dyn Reporter,
) -> Result<RunResult> {
    // Before anything is submitted: the controller answers, and could run every batch.
    let cluster = Cluster::query()?;
    let partition = cluster.partition(policy.partition.as_deref())?.clone();
    for b in &plan.batches {
        // A model Slurm cannot be asked for is refused before anything is submitted.
        policy.gres_type(&b.name, b.gpu_model.as_deref())?;
        cluster.check(
            &partition,
            Ask {
                batch: &b.name,
                nodes: b.nodes,
                gpus_per_node: b.gpus,
            },
        )?;
        batch_dir::refuse_foreign(&b.dir)?;
    }
    let cibox = match &policy.cibox {
        Some(path) => path.clone(),
        None => std::env::current_exe().map_err(RunError::CurrentExe)?,
    };
    let reports = batch_dir::reports_folder(&plan.reports)?;
    let run = Submission {
        clock: RunClock::start(),
        reports,
        plan,
        policy,
        partition: partition.name,
        cibox,
        locksets: locksets
            .iter()
            .map(|(name, l)| (name.clone(), l.digest.clone()))
            .collect(),
        reporter: Mutex::new(reporter),
        first: FirstFailure::new(plan.fail_fast, plan.warmup.clone()),
    };
    run.emit(EventKind::RunStarted {
        plan,
        reports: &run.reports,
    })?;
    let together = Together {
        parallel: plan.parallel,
        shards: &|_| (1, 1),
    };
    let batches = each_batch(
        plan.batches.len(),
        &together,
        &run.first,
        |i| run.batch(i),
        |i, why| run.not_run(i, why),
    )?;
    let stopped_by = batches
        .iter()
        .find_map(BatchResult::cancelled_by)
        .or_else(signals::received);
    let result = RunResult {
        run: plan.run_id.clone(),
        batches,
        stopped_by,
        reports: plan.reports.clone(),
    };
    run.emit(EventKind::RunEnded { run: &result })?;
    Ok(result)
}

/// One run submitted to Slurm: what its batches' jobs share.
struct Submission<'a> {
    /// The run's clock: the time of the events the submitter sees itself.
    clock: RunClock,
    /// The reports folder, held open.
    reports: Folder,
    plan: &'a RunPlan,
    policy: &'a SlurmPolicy,
    /// The partition every job goes to (the policy's, or the cluster's default).
    partition: String,
    /// The cibox the nodes run.
    cibox: PathBuf,
    /// Each image's lockset digest, by image name.
    locksets: std::collections::HashMap<String, String>,
    reporter: Mutex<&'a mut dyn Reporter>,
    /// The stop at the run's first failure, when it has one.
    pub(super) first: FirstFailure,
}

impl Submission<'_> {
    /// Tells the reporter `kind`, happening now.
    fn emit(&self, kind: EventKind<'_>) -> Result<()> {
        self.tell(&self.clock.now(kind))
    }

    /// Tells the reporter `kind`, which happened on a node at `at` (its clock).
    fn emit_at(&self, at: std::time::SystemTime, kind: EventKind<'_>) -> Result<()> {
        self.tell(&self.clock.at(at, kind))
    }

    fn tell(&self, event: &Event<'_>) -> Result<()> {
        self.reporter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .handle(event)
            .map_err(crate::error::Error::from)
    }
}
