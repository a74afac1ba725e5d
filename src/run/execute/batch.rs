//! One batch, from its fresh folder to its record: lease its GPUs, run its container,
//! judge how it ended with what it left, write nothing itself (the reporters write
//! `result.json` from [`EventKind::BatchEnded`]).

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::time::{Instant, SystemTime};

use crate::claims::ContainerClaims;
use crate::gpu::lease::{Holder, Lease};
use crate::gpu::pool::PoolGpu;
use crate::gpu::{LeaseError, LeaseRequest, Waiter, Want};
use crate::manifest::BatchVerdict;
use crate::nofollow::Folder;
use crate::plan::container::phases::PhaseTracker;
use crate::plan::run_plan::{BatchPlan, NodeRole};
use crate::report::event::{EventKind, Phase};
use crate::report::junit::{self, Case, CaseStatus};
use crate::report::outcome::{BatchResult, ContainerEnd, Status, judge};
use crate::report::record::Copied;
use crate::report::record::{GpuRef, RunRecord, SlurmJob};
use crate::report::steps::StepTracker;
use crate::run::batch_dir;
use crate::run::error::RunError;
use crate::run::execute::{Execution, Result};

/// The most JUnit a batch's reports may hold in all.
const MAX_REPORTS_BYTES: u64 = 256 << 20;
/// The most failing tests named in a record (the count is in `tests`).
const MAX_FAILED_NAMED: usize = 1000;

/// What watching one batch's container found.
pub(super) struct Watched {
    /// When the batch started (its phases are timed from here).
    pub started: Instant,
    /// Its folder in the reports folder, held open.
    pub dir: Folder,
    /// How much the batch printed, for the record (log.txt keeps only so much).
    pub printed: Cell<u64>,
    /// Its container could not be removed: its folder is not cleaned (it may still
    /// write there) and the run's record stays when the run ends, so the run counts as
    /// dead and a later sweep removes the container.
    pub container_left: Cell<bool>,
    /// What came out of its `/reports`.
    pub reports: RefCell<Copied>,
    /// The engine says the container itself was killed (from outside, or for memory):
    /// whatever its state reads a moment later, its `/reports` went with it.
    pub container_died: Cell<bool>,
    /// Its steps as they came, for `verdict: exit-code`.
    pub steps: RefCell<Option<StepTracker>>,
    /// Which phase of its script was under way.
    pub phases: RefCell<PhaseTracker>,
    /// How many phase lines its output gave.
    pub phases_said: Cell<usize>,
    /// Its caches while its container lives.
    pub caches: RefCell<Option<crate::run::execute::caches::BatchCaches>>,
}

impl Watched {
    fn new(started: Instant, dir: Folder) -> Watched {
        Watched {
            started,
            dir,
            printed: Cell::default(),
            container_left: Cell::default(),
            reports: RefCell::default(),
            container_died: Cell::default(),
            steps: RefCell::default(),
            phases: RefCell::default(),
            phases_said: Cell::default(),
            caches: RefCell::default(),
        }
    }
}

/// What a batch did, for its record.
struct Ran<'a> {
    ended: &'a ContainerEnd,
    cases: &'a Cases,
    leased: &'a [PoolGpu],
    watched: &'a Watched,
    started: SystemTime,
    clock: Instant,
    /// How long it waited for its GPUs (until granted or refused).
    gpu_wait: std::time::Duration,
}

/// The batch's test cases and what judging them needs.
struct Cases {
    cases: Vec<Case>,
    totals: junit::Totals,
    dropped: usize,
    junit_problem: Option<String>,
    allow_empty: bool,
}

impl Cases {
    /// No test ran: none is counted, and none is missed.
    fn none() -> Cases {
        Cases {
            cases: Vec::new(),
            totals: junit::Totals::default(),
            dropped: 0,
            junit_problem: None,
            allow_empty: true,
        }
    }
}

impl Execution<'_> {
    /// Runs one batch to its status, running it again while its retries allow. An
    /// error here ends the run (a bad lock dir, an unwritable reports folder);
    /// everything else ends only the batch.
    pub(super) fn batch(&self, b: &BatchPlan) -> Result<BatchResult> {
        let dir = self.batch_dir(b)?;
        crate::run::attempts::run(b, |n| self.attempt(b, &dir, n), |e| self.emit(e))
    }

    /// The batch's folder, fresh (on a Slurm node, the submitter's), and said.
    fn batch_dir(&self, b: &BatchPlan) -> Result<Folder> {
        let dir = if self.plan.node.is_some() {
            batch_dir::prepare_on_node(&self.reports, &self.plan.reports, &b.dir)?
        } else {
            batch_dir::prepare(&self.reports, &self.plan.reports, &b.dir)?
        };
        self.emit(EventKind::BatchStarted {
            batch: b,
            dir: &dir,
        })?;
        Ok(dir)
    }

    /// The record of a batch the stop at the run's first failure kept from starting.
    pub(super) fn not_run(&self, b: &BatchPlan, why: &str) -> Result<BatchResult> {
        let dir = self.batch_dir(b)?;
        drop(dir);
        let result = self.never_ran(b, why, SystemTime::now(), Instant::now());
        self.emit(EventKind::BatchEnded { result: &result })?;
        Ok(result)
    }

    /// A batch that did not start, and why.
    fn never_ran(
        &self,
        b: &BatchPlan,
        why: &str,
        started: SystemTime,
        clock: Instant,
    ) -> BatchResult {
        let lockset = self
            .locksets
            .get(&b.image_name)
            .cloned()
            .unwrap_or_default();
        let mut record =
            RunRecord::planned(self.plan, b, lockset, Status::NotRun, 0, started, clock);
        record.message = Some(why.to_string());
        BatchResult {
            record,
            cases: Vec::new(),
            earlier: Vec::new(),
            record_path: b.dir.join("result.json"),
            container_left: false,
        }
    }

    /// Attempt `n` (1-based) at the batch: lease its GPUs, run its container, judge how
    /// it ended with what it left, release its GPUs.
    fn attempt(&self, b: &BatchPlan, dir: &Folder, n: u32) -> Result<BatchResult> {
        let dir = dir.try_clone().map_err(|source| RunError::BatchDir {
            dir: b.dir.display().to_string(),
            what: "hold",
            source,
        })?;
        let started = SystemTime::now();
        let clock = Instant::now();
        // The batch's GPUs, leased for this attempt's whole life.
        let waiting = Instant::now();
        let (lease, refused) = if b.gpus > 0 {
            match self.lease(b, n) {
                Ok(l) => {
                    self.emit(EventKind::LeaseGranted {
                        batch: b,
                        gpus: l.gpus(),
                    })?;
                    let gpus: Vec<String> = l
                        .gpus()
                        .iter()
                        .map(|g| match &g.parent {
                            None => format!("GPU {} ({})", g.index, g.uuid),
                            Some(_) => g.label(),
                        })
                        .collect();
                    self.phase(
                        b,
                        Phase::Lease,
                        clock,
                        format!(
                            "{} after waiting {}",
                            gpus.join(", "),
                            crate::units::human(waiting.elapsed())
                        ),
                    )?;
                    (Some(l), None)
                }
                // Another batch failed while this one waited, and the run stops at its
                // first failure.
                Err(e) if matches!(e.downcast_ref::<LeaseError>(), Some(LeaseError::GaveUp(_))) => {
                    let why = self.first.why_not().unwrap_or_else(|| e.to_string());
                    return Ok(self.never_ran(b, &why, started, clock));
                }
                Err(e) => (None, Some(self.failed(b, e)?)),
            }
        } else {
            self.phase(b, Phase::Lease, clock, "no GPU asked".into())?;
            (None, None)
        };
        // It got its GPUs as another batch failed: it does not start.
        if n == 1
            && refused.is_none()
            && let Some(why) = self.first.why_not()
        {
            drop(lease);
            return Ok(self.never_ran(b, &why, started, clock));
        }
        let gpu_wait = waiting.elapsed();
        let leased: Vec<PoolGpu> = lease
            .as_ref()
            .map(|l| l.gpus().to_vec())
            .unwrap_or_default();
        let watched = Watched::new(clock, dir);
        if b.verdict == BatchVerdict::ExitCode {
            *watched.steps.borrow_mut() = Some(StepTracker::new(&b.run));
        }
        let ended = match refused {
            Some(e) => e,
            None => self.launch(b, lease.as_ref(), &leased, &watched, n)?,
        };
        // The container is gone (or, if the engine failed to remove it, still named
        // busy by its GPU label, see `claims`): only now may the GPUs go to someone else.
        drop(lease);
        let cases = self.cases(b, &ended, &watched);
        let collected = {
            let copied = watched.reports.borrow();
            format!(
                "{} file(s), {} byte(s) copied out of /reports; {} test case(s)",
                copied.files, copied.bytes, cases.totals.total
            )
        };
        self.phase(b, Phase::Collect, clock, collected)?;
        let mut record = self.record(
            b,
            &Ran {
                ended: &ended,
                cases: &cases,
                leased: &leased,
                watched: &watched,
                started,
                clock,
                gpu_wait,
            },
        );
        self.name_sick_gpus(&mut record);
        self.keep_caches(&watched, &mut record);
        Ok(BatchResult {
            record,
            cases: cases.cases,
            earlier: Vec::new(),
            record_path: b.dir.join("result.json"),
            container_left: watched.container_left.get(),
        })
    }

    /// Its container is gone: a trusted layer of a batch that passed is kept, and a
    /// batch that did not pass with a cache full says so in its message.
    fn keep_caches(&self, watched: &Watched, record: &mut RunRecord) {
        if let Some(caches) = watched.caches.borrow_mut().take() {
            record.caches = self.finish_caches(
                caches,
                record.status == Status::Passed,
                watched.container_left.get(),
            );
            // A batch that did not pass with a cache full: most likely why, so said
            // where a person looks first, not only in the record's `caches`.
            if record.status != Status::Passed {
                let full: Vec<String> = record
                    .caches
                    .iter()
                    .filter(|c| c.full)
                    .filter_map(|c| Some(format!("cache {}: {}", c.name, c.problem.as_ref()?)))
                    .collect();
                if !full.is_empty() {
                    let said = full.join("; ");
                    record.message = Some(match record.message.take() {
                        Some(m) => format!("{m}; {said}"),
                        None => said,
                    });
                }
            }
        }
    }

    /// After an infrastructure error: the batch's GPUs that the driver now reads
    /// unhealthy are named in its record and its message (a retry leases anew, and a
    /// sick GPU is leased to nobody). A probe that fails adds nothing: the error
    /// stands as it was.
    fn name_sick_gpus(&self, record: &mut RunRecord) {
        if record.status != Status::InfraError || record.gpus.is_empty() {
            return;
        }
        let Ok(snap) = self.prober.probe() else {
            return;
        };
        let mut said = Vec::new();
        for g in &mut record.gpus {
            g.sick = snap
                .gpus
                .iter()
                .find(|s| s.uuid == g.uuid)
                .and_then(|s| s.sick.clone());
            if let Some(why) = &g.sick {
                said.push(format!(
                    "GPU {} ({}) reads unhealthy: {why}",
                    g.index, g.uuid
                ));
            }
        }
        if !said.is_empty() {
            let said = said.join("; ");
            record.message = Some(match record.message.take() {
                Some(m) => format!("{m}; {said}"),
                None => said,
            });
        }
    }

    /// Says that a step of the batch is done or under way (what `-v` shows).
    pub(super) fn phase(
        &self,
        b: &BatchPlan,
        phase: Phase,
        started: Instant,
        detail: String,
    ) -> Result<()> {
        self.emit(EventKind::Phase {
            batch: Some(b),
            phase,
            at: started.elapsed(),
            detail,
        })
    }

    /// Runs the batch's container. An engine failure ends this batch, not the run: the
    /// others still run and the summary is still written.
    fn launch(
        &self,
        b: &BatchPlan,
        lease: Option<&Lease>,
        leased: &[PoolGpu],
        watched: &Watched,
        attempt: u32,
    ) -> Result<ContainerEnd> {
        let ran = self.emit(EventKind::Launching { batch: b }).and_then(|()| {
            let fds = lease.map(|l| l.fds()).unwrap_or_default();
            // On a Slurm node the submitter counts the attempts.
            let attempt = self
                .plan
                .node
                .as_ref()
                .map_or(attempt, |n| n.attempt.max(1));
            self.container(b, leased, &fds, watched, attempt)
        });
        match ran {
            Ok(end) => Ok(end),
            Err(e) => self.failed(b, e),
        }
    }

    /// Waits in the queue for the batch's GPUs: any of the pool, or on a node of a
    /// Slurm job exactly those Slurm allocated.
    /// Only a batch's first attempt gives up when another batch failed a run that
    /// stops at its first failure: a batch already under way ends its attempts.
    fn lease(&self, b: &BatchPlan, attempt: u32) -> Result<Lease> {
        let need = b.gpus as usize;
        // A model narrows the pool to its GPUs (read once, at the run's start): a
        // host without enough of them is capacity, naming the models it has.
        let pool = crate::gpu::model::narrow(
            &self.pool,
            self.hardware.gpus.as_deref().map_err(String::as_str),
            b.gpu_model.as_deref(),
            need,
        )?;
        if need > pool.len() {
            return Err(RunError::PoolTooSmall {
                batch: b.name.clone(),
                need,
                pool: pool.len(),
            }
            .into());
        }
        let want = match &self.plan.node {
            Some(node) => Want::Devices(self.allocated(b, node, &pool)?),
            None => Want::Count(need),
        };
        let mut holder = Holder::this_process();
        holder.batch = Some(b.name.clone());
        holder.container = Some(b.container.name.clone());
        holder.scope = Some(self.plan.scope.clone());
        holder.run = Some(self.plan.run_id.clone());
        let waiter = Waiter::arrive(
            &self.lock_dir,
            &holder,
            need,
            Instant::now() + self.plan.wait,
        )?;
        let give_up = || self.first.why_not();
        let request = LeaseRequest {
            want,
            pool: &pool,
            policy: &self.plan.manifest.gpu.idle,
            holder: &holder,
            wait: self.plan.wait,
            give_up: (attempt == 1).then_some(&give_up as &(dyn Fn() -> Option<String> + Sync)),
        };
        let mut claims =
            ContainerClaims::asking(self.lock_dir.clone(), self.prober.clone(), self.engine);
        let lease = waiter.lease(
            &request,
            |since| claims.probe_since(since).map_err(Into::into),
            |report| {
                // A reporter that fails here fails again, and counts, at the batch's end.
                let _ = self.emit(EventKind::Waiting { batch: b, report });
            },
        );
        match (&self.plan.node, lease) {
            // Slurm counts them free: whatever holds them is outside Slurm. Fail closed.
            (
                Some(node),
                Err(why @ (LeaseError::QueueTimedOut { .. } | LeaseError::TimedOut { .. })),
            ) => Err(RunError::SlurmGpusHeld {
                job_id: node.job_id.clone(),
                node: node.node.clone(),
                wait: self.plan.wait,
                why,
            }
            .into()),
            // Slurm allocated a sick unit: it does not know, and would again.
            (Some(node), Err(why @ LeaseError::Sick { .. })) => Err(RunError::SlurmGpusSick {
                job_id: node.job_id.clone(),
                node: node.node.clone(),
                why,
            }
            .into()),
            (_, lease) => Ok(lease?),
        }
    }

    /// The GPUs of `pool` (the batch's: of its model, if it names one) Slurm allocated
    /// to the batch on this node: by identity where Slurm names them so (MIG slices),
    /// else by index, which names only whole GPUs.
    fn allocated(&self, b: &BatchPlan, node: &NodeRole, pool: &[PoolGpu]) -> Result<Vec<PoolGpu>> {
        let allocated = if node.gpu_ids.is_empty() {
            node.gpus.len()
        } else {
            node.gpu_ids.len()
        };
        if allocated != b.gpus as usize {
            return Err(RunError::SlurmGpuCount {
                allocated,
                node: node.node.clone(),
                batch: b.name.clone(),
                asks: b.gpus,
            }
            .into());
        }
        if !node.gpu_ids.is_empty() {
            return node
                .gpu_ids
                .iter()
                .map(|id| {
                    pool.iter().find(|g| g.uuid == *id).cloned().ok_or_else(|| {
                        RunError::SlurmUnitOutsidePool {
                            id: id.clone(),
                            node: node.node.clone(),
                            batch: b.name.clone(),
                        }
                        .into()
                    })
                })
                .collect();
        }
        node.gpus
            .iter()
            .map(|i| {
                pool.iter()
                    .find(|g| g.index == *i && g.parent.is_none())
                    .cloned()
                    .ok_or_else(|| {
                        RunError::SlurmGpuOutsidePool {
                            index: *i,
                            node: node.node.clone(),
                            batch: b.name.clone(),
                            pool: pool.iter().map(|g| g.index).collect(),
                        }
                        .into()
                    })
            })
            .collect()
    }

    /// The batch's test cases: its steps, for `verdict: exit-code` (the steps' exit
    /// status is the verdict and each step is a case), else its JUnit reports.
    fn cases(&self, b: &BatchPlan, ended: &ContainerEnd, watched: &Watched) -> Cases {
        // A batch that failed installing its source ran no test: none is counted.
        if let ContainerEnd::Exited(code) = ended
            && *code != 0
            && watched.phases.borrow().setup_failure(*code).is_some()
        {
            return Cases::none();
        }
        if let Some(tracker) = watched.steps.borrow_mut().take() {
            let succeeded = matches!(ended, ContainerEnd::Exited(0));
            // A batch that failed before its first step (its source could not be
            // copied in, its container would not start, it was cancelled meanwhile) ran
            // no test: its steps are not counted as skipped tests.
            if !succeeded && !tracker.began() {
                return Cases::none();
            }
            let cases = tracker.cases(&b.name, Instant::now(), succeeded);
            let totals = junit::Totals::of(&cases);
            return Cases {
                cases,
                totals,
                dropped: 0,
                junit_problem: None,
                allow_empty: true,
            };
        }
        let (collected, junit_problem) = read_reports(&watched.dir, &b.dir);
        let junit::Collected {
            cases,
            totals,
            dropped,
            ..
        } = collected;
        Cases {
            cases,
            totals,
            dropped,
            junit_problem,
            allow_empty: b.allow_empty,
        }
    }

    /// The batch's run record (`result.json`): its status, and what it ran on and with.
    fn record(&self, b: &BatchPlan, ran: &Ran<'_>) -> RunRecord {
        let Ran {
            ended,
            cases,
            leased,
            watched,
            started,
            clock,
            gpu_wait,
        } = *ran;
        let setup_failed = match ended {
            ContainerEnd::Exited(code) if *code != 0 => {
                watched.phases.borrow().setup_failure(*code)
            }
            _ => None,
        };
        let (status, message) = match setup_failed {
            Some(why) => (crate::report::outcome::Status::Failed, Some(why)),
            None => judge(
                ended,
                &cases.totals,
                cases.junit_problem.clone(),
                cases.allow_empty,
            ),
        };
        let plan = self.plan;
        let lockset = self
            .locksets
            .get(&b.image_name)
            .cloned()
            .unwrap_or_default();
        let exit_code = status.exit_code(ended.cancelled_by());
        RunRecord {
            gpus: leased
                .iter()
                .map(|g| GpuRef {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    node: plan.node.as_ref().map(|n| n.node.clone()),
                    sick: None,
                })
                .collect(),
            // On a Slurm node the run's, not the task's own (see `NodeRole::task_run_id`).
            run: plan
                .node
                .as_ref()
                .map_or_else(|| plan.run_id.clone(), |n| n.run_id.clone()),
            gpu_wait_s: (gpu_wait.as_millis() as f64) / 1000.0,
            hardware: Some(self.hardware.of_batch(leased)),
            tests: cases.totals.clone(),
            failed_tests: cases
                .cases
                .iter()
                .filter(|c| matches!(c.status, CaseStatus::Failed | CaseStatus::Error))
                .map(Case::id)
                .take(MAX_FAILED_NAMED)
                .collect(),
            message,
            container_exit_code: ended.container_exit(),
            output_bytes: watched.printed.get(),
            cases_left_out: cases.dropped,
            reports: watched.reports.take(),
            slurm: plan.node.as_ref().map(|n| SlurmJob {
                job_id: Some(n.job_id.clone()),
                name: String::new(),
                partition: None,
                nodes: vec![n.node.clone()],
            }),
            ..RunRecord::planned(plan, b, lockset, status, exit_code, started, clock)
        }
    }
}

/// The test cases of the batch's JUnit reports, and the first report that could not
/// be read.
fn read_reports(dir: &Folder, shown: &Path) -> (junit::Collected, Option<String>) {
    let mut collected = junit::Collected::default();
    let mut problem = None;
    // Bounded like each file: a batch cannot make the host read more than this.
    let mut budget = MAX_REPORTS_BYTES;
    // Read in the folder the run holds, named as the user knows it.
    let held = dir.held_path();
    for read in junit::files(&held) {
        let f = shown.join(read.strip_prefix(&held).unwrap_or(&read));
        let size = std::fs::symlink_metadata(&read).map_or(0, |m| m.len());
        if size > budget {
            problem.get_or_insert(format!(
                "JUnit report {} not read: the batch's reports pass {} MiB in all",
                f.display(),
                MAX_REPORTS_BYTES >> 20
            ));
            continue;
        }
        budget -= size;
        match junit::read(&read)
            .map_err(|e| e.to_string())
            .and_then(|t| junit::parse_into(&t, &mut collected))
        {
            Ok(()) => {}
            Err(e) => {
                problem.get_or_insert(format!("unreadable JUnit report {}: {e}", f.display()));
            }
        }
    }
    (collected, problem)
}
