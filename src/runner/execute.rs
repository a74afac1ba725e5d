//! Executing a [`RunPlan`]: verify the image, hold the run's lock, sweep what dead runs
//! left, then run each batch (lease → container → verdict → lease released) and hand
//! back a [`RunOutcome`]. Everything it has to say goes to the [`Reporter`] as
//! [`Event`]s; it prints nothing itself.

use std::cell::Cell;
use std::os::unix::io::RawFd;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use super::container::ContainerPlan;
use super::error::RunError;
use super::event::Event;
use super::junit::{self, Case};
use super::outcome::{BatchResult, Ended, RunOutcome, Verdict, judge};
use super::plan::{BatchPlan, RunPlan};
use super::record::{GpuRef, RunRecord};
use super::reporter::Reporter;
use super::steps::StepTracker;
use super::watchdog::Watchdog;
use super::{batch_dir, collect};
use crate::engine::{EndCause, Engine, EngineError, FollowEnd, Followed, Removal, Steps, Stop};
use crate::gpu::lease::{Holder, Lease};
use crate::gpu::pool::{self, PoolGpu};
use crate::gpu::{self, Want, probe};
use crate::image::{self, Lockset};
use crate::lockdir::LockDir;
use crate::lockdir::runs::{RunInfo, RunLock};
use crate::manifest::BatchVerdict;
use crate::signals;
use crate::units::rfc3339;

/// The most JUnit a batch's reports may hold in all.
const MAX_REPORTS_BYTES: u64 = 256 << 20;
/// The most failing tests named in a record (the count is in `tests`).
const MAX_FAILED_NAMED: usize = 1000;

/// Grace between SIGTERM and SIGKILL when a batch times out.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

type Result<T, E = RunError> = std::result::Result<T, E>;

/// Runs the plan on `engine`; each image must carry its lockset (by image name).
pub fn execute(
    plan: &RunPlan,
    locksets: &indexmap::IndexMap<String, Lockset>,
    engine: &Engine,
    reporter: &mut dyn Reporter,
) -> Result<RunOutcome> {
    source_readable(plan)?;
    // Every image before anything starts.
    for (name, id) in &plan.images {
        let lockset = locksets.get(name).ok_or_else(|| {
            image::ImageError::refused(format!("no lockset was computed for image `{name}`"))
        })?;
        image::verify(engine, id, lockset).map_err(|e| {
            // Which one, when the manifest has several.
            if plan.manifest.images.len() > 1 {
                e.for_image(name)
            } else {
                e
            }
        })?;
    }
    let gpu = &plan.manifest.gpu;
    // Held for the whole run, so that a sweep by another job of this scope leaves our
    // containers alone; taken before our first container exists.
    let lock_dir = LockDir::open(&gpu.lock_dir, gpu.allow_network_lock_dir)?;
    let run_info = RunInfo {
        project: plan.manifest.project.clone(),
        scope: plan.scope.clone(),
    };
    let _run_lock =
        RunLock::hold(&lock_dir, &plan.run_id, &run_info).map_err(|source| RunError::RunLocks {
            dir: lock_dir.path().display().to_string(),
            what: "cannot take this run's lock".into(),
            source,
        })?;
    // Host-wide: a run killed in any scope leaves containers (and GPUs) behind that
    // nobody else would remove.
    let swept = super::sweep::sweep(engine, None, None, &lock_dir, &plan.host)?;
    // Said at once: whatever fails next, these are gone.
    reporter.handle(&Event::Swept {
        scope: &plan.scope,
        swept: &swept,
    })?;
    let prober = probe::Prober::shared_through(gpu.probe, lock_dir.path());
    let pool = if plan.needs_gpus() {
        // One shared with the runs that started with us will do.
        let snap = prober.probe_since(probe::HostInstant::now())?;
        pool::resolve(&gpu.pool, &snap).map_err(RunError::Pool)?
    } else {
        Vec::new()
    };
    for b in &plan.batches {
        batch_dir::check(&b.dir)?;
    }
    let git_masks = super::git_mask::mask(&plan.source).map_err(RunError::GitMask)?;
    let run = Execution {
        plan,
        engine,
        lock_dir,
        pool,
        prober,
        reporter: Mutex::new(reporter),
        locksets: locksets
            .iter()
            .map(|(name, l)| (name.clone(), l.digest.clone()))
            .collect(),
        git_masks: &git_masks.binds,
    };
    run.emit(&Event::RunStarted { plan })?;
    let mut batches = Vec::new();
    if plan.parallel {
        let joined: Vec<Result<BatchResult>> = std::thread::scope(|s| {
            let handles: Vec<_> = plan
                .batches
                .iter()
                .map(|b| s.spawn(|| run.batch(b)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(RunError::Panicked)))
                .collect()
        });
        for r in joined {
            batches.push(r?);
        }
    } else {
        for b in &plan.batches {
            if signals::received().is_some() {
                break; // a signal between two batches: start no more
            }
            let result = run.batch(b)?;
            let stop = matches!(result.verdict, Verdict::Cancelled(_));
            batches.push(result);
            if stop {
                break; // signals end the run at once
            }
        }
    }
    let stopped_by = batches
        .iter()
        .find_map(|b| match b.verdict {
            Verdict::Cancelled(sig) => Some(sig),
            _ => None,
        })
        .or_else(signals::received);
    if batches.iter().any(|b| b.container_left) {
        _run_lock.leave_record();
    }
    let outcome = RunOutcome {
        batches,
        stopped_by,
        reports: plan.reports.clone(),
    };
    run.emit(&Event::RunEnded { outcome: &outcome })?;
    Ok(outcome)
}

/// When batches run as another user than cibox (cibox is root, or a batch's
/// `container.user` says so), they read `/src` as that user, without capabilities: say
/// so now rather than fail every batch at its first `cp`.
fn source_readable(plan: &RunPlan) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let mut users: Vec<(u32, u32)> = plan.batches.iter().map(|b| b.user).collect();
    users.sort_unstable();
    users.dedup();
    for (uid, gid) in users {
        if (uid, gid) == me {
            continue;
        }
        let md = std::fs::metadata(&plan.source).map_err(|source| RunError::BatchDir {
            dir: plan.source.display().to_string(),
            what: "read",
            source,
        })?;
        // uid 0 in the container has no capability: it reads as an owner or "other".
        let bits = if md.uid() == uid {
            md.mode() >> 6
        } else if md.gid() == gid {
            md.mode() >> 3
        } else {
            md.mode()
        };
        if bits & 0o5 != 0o5 {
            return Err(RunError::SourceUnreadable {
                dir: plan.source.display().to_string(),
                mode: md.mode() & 0o7777,
                uid,
            });
        }
    }
    Ok(())
}

/// What watching one batch's container found.
#[derive(Default)]
struct Watched {
    /// How much the batch printed, for the record (log.txt keeps only so much).
    printed: Cell<u64>,
    /// Its container could not be removed: its folder is not cleaned (it may still
    /// write there) and the run's record stays when the run ends, so the run counts as
    /// dead and a later sweep removes the container.
    container_left: Cell<bool>,
    /// What came out of its `/reports`.
    reports: std::cell::RefCell<collect::Copied>,
    /// Its steps as they came, for `verdict: exit-code`.
    steps: std::cell::RefCell<Option<StepTracker>>,
}

/// One run in progress: what its batches share.
struct Execution<'a> {
    plan: &'a RunPlan,
    engine: &'a Engine,
    lock_dir: LockDir,
    pool: Vec<PoolGpu>,
    /// Shared by the batches: NVML is opened once.
    prober: probe::Prober,
    reporter: Mutex<&'a mut dyn Reporter>,
    /// Each image's lockset digest, by image name.
    locksets: std::collections::HashMap<String, String>,
    /// Binds that hide the source's git credentials.
    git_masks: &'a [String],
}

impl Execution<'_> {
    fn emit(&self, event: &Event<'_>) -> Result<()> {
        self.reporter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .handle(event)
            .map_err(RunError::from)
    }

    /// Runs one batch to its verdict. An error here ends the run (a bad lock dir, an
    /// unwritable reports folder); everything else ends only the batch.
    fn batch(&self, b: &BatchPlan) -> Result<BatchResult> {
        batch_dir::prepare(&b.dir)?;
        let started = SystemTime::now();
        let clock = Instant::now();
        self.emit(&Event::BatchStarted { batch: b })?;
        let mut ended = None;
        // The batch's GPUs, leased for its whole life.
        let mut lease: Option<Lease> = None;
        if b.gpus > 0 {
            match self.lease(b) {
                Ok(l) => {
                    self.emit(&Event::LeaseGranted {
                        batch: b,
                        gpus: l.gpus(),
                    })?;
                    lease = Some(l);
                }
                Err(e) => ended = Some(self.failed(b, e)?),
            }
        }
        let leased: Vec<PoolGpu> = lease
            .as_ref()
            .map(|l| l.gpus().to_vec())
            .unwrap_or_default();
        let watched = Watched::default();
        if b.verdict == BatchVerdict::ExitCode {
            *watched.steps.borrow_mut() = Some(StepTracker::new(&b.run));
        }
        let ended = match ended {
            Some(e) => e,
            // An engine failure ends this batch, not the run: the others still run
            // and the summary is still written.
            None => match self
                .emit(&Event::Launching {
                    batch: b,
                    dir: &b.dir,
                })
                .and_then(|()| {
                    let fds = lease.as_ref().map(|l| l.fds()).unwrap_or_default();
                    self.container(b, &leased, &fds, &watched)
                }) {
                Ok(e) => e,
                Err(e) => self.failed(b, e)?,
            },
        };
        // The container is gone (or, if the engine failed to remove it, still named
        // busy by its GPU label, see `claims`): only now may the GPUs go to someone else.
        drop(lease);
        let (cases, totals, dropped, junit_problem, allow_empty) =
            match watched.steps.borrow_mut().take() {
                // The steps' exit status is the verdict; each step is a case.
                Some(tracker) => {
                    let succeeded = matches!(ended, Ended::Exited(0));
                    let cases = tracker.cases(&b.name, Instant::now(), succeeded);
                    let totals = junit::Totals::of(&cases);
                    (cases, totals, 0, None, true)
                }
                None => {
                    let (collected, problem) = read_reports(&b.dir);
                    let junit::Collected {
                        cases,
                        totals,
                        dropped,
                        ..
                    } = collected;
                    (cases, totals, dropped, problem, b.allow_empty)
                }
            };
        let (verdict, message) = judge(&ended, &totals, junit_problem, allow_empty);
        let plan = self.plan;
        let record = RunRecord {
            schema: 1,
            batch: b.name.clone(),
            status: verdict.status(),
            exit_code: verdict.exit_code(),
            image: b.image.to_string(),
            lockset: self
                .locksets
                .get(&b.image_name)
                .cloned()
                .unwrap_or_default(),
            source: plan.source_info.clone(),
            gpus: leased
                .iter()
                .map(|g| GpuRef {
                    index: g.index,
                    uuid: g.uuid.clone(),
                })
                .collect(),
            host: plan.host.clone(),
            scope: plan.scope.clone(),
            run: plan.run_id.clone(),
            container: b.container.name.clone(),
            fast: plan.fast,
            started_at: rfc3339(started),
            finished_at: rfc3339(SystemTime::now()),
            duration_s: (clock.elapsed().as_millis() as f64) / 1000.0,
            tests: totals,
            cibox_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest_digest: plan.manifest.digest.clone(),
            gpu_count: b.gpus,
            env: b.container.manifest_env.clone(),
            failed_tests: cases
                .iter()
                .filter(|c| matches!(c.outcome, junit::Outcome::Failed | junit::Outcome::Error))
                .map(Case::id)
                .take(MAX_FAILED_NAMED)
                .collect(),
            message,
            container_exit_code: ended.container_exit(),
            output_bytes: watched.printed.get(),
            cases_left_out: dropped,
            reports: watched.reports.take(),
            loosened: b.container.loosened(),
            changed_file: b.changed_file.clone(),
        };
        let result = BatchResult {
            verdict,
            record,
            cases,
            record_path: b.dir.join("result.json"),
            container_left: watched.container_left.get(),
        };
        self.emit(&Event::BatchEnded { result: &result })?;
        Ok(result)
    }

    /// The ending of a batch that `e` kept from running, once reported; an error that
    /// is the run's, not the batch's, ends the run.
    fn failed(&self, b: &BatchPlan, e: RunError) -> Result<Ended> {
        let Some(verdict) = Verdict::of_error(&e) else {
            return Err(e);
        };
        self.emit(&Event::BatchFailed {
            batch: b,
            error: &e,
        })?;
        Ok(Ended::Stopped {
            verdict,
            message: e.to_string(),
            exit: None,
        })
    }

    /// Waits in the queue for the batch's GPUs.
    fn lease(&self, b: &BatchPlan) -> Result<Lease> {
        let need = b.gpus as usize;
        if need > self.pool.len() {
            return Err(RunError::PoolTooSmall {
                batch: b.name.clone(),
                need,
                pool: self.pool.len(),
            });
        }
        let mut holder = Holder::this_process();
        holder.batch = Some(b.name.clone());
        holder.container = Some(b.container.name.clone());
        holder.scope = Some(self.plan.scope.clone());
        holder.run = Some(self.plan.run_id.clone());
        let ticket = gpu::join_queue(
            &self.lock_dir,
            &holder,
            need,
            Instant::now() + self.plan.wait,
        )?;
        let lease = gpu::acquire(
            ticket,
            &self.lock_dir,
            &self.pool,
            &Want::Count(need),
            &self.plan.manifest.gpu.idle,
            self.plan.wait,
            &holder,
            |since| {
                let mut snap = self.prober.probe_since(since)?;
                crate::claims::mark(&mut snap, self.engine)?;
                Ok(snap)
            },
            |report| {
                // A reporter that fails here fails again, and counts, at the batch's end.
                let _ = self.emit(&Event::Waiting { batch: b, report });
            },
        );
        Ok(lease?)
    }

    /// Creates, starts, follows and removes the batch's container. Never leaves it
    /// behind.
    fn container(
        &self,
        b: &BatchPlan,
        gpus: &[PoolGpu],
        lease_fds: &[RawFd],
        watched: &Watched,
    ) -> Result<Ended> {
        let plan: &ContainerPlan = &b.container;
        let id = self.engine.create_container(
            &plan.name,
            plan.body(gpus, self.git_masks, self.engine.recursive_read_only()),
        )?;
        // From here on, if cibox dies the watchdog removes the container.
        let watchdog = match Watchdog::start(&id, lease_fds) {
            Ok(w) => w,
            Err(e) => {
                let _ = self.engine.remove_container(&id);
                return Err(RunError::Watchdog(e));
            }
        };
        // Anonymous, it goes with the container; but one removed by someone else
        // without its volumes leaves it.
        let volume = self.engine.volume_at(&id, "/reports");
        let outcome = self.follow(b, &id, watched);
        // The container still lives (its keeper waits): copy `/reports` out now.
        if outcome.is_ok() {
            let caps = collect::Caps::with_bytes(b.container.reports_size());
            let lost = || {
                Some("the container had stopped before /reports was copied: what the batch wrote there went with it".to_string())
            };
            let mut copied = collect::Copied::default();
            if self.engine.is_running(&id) {
                let stop = collect::StopWhen::now();
                let archive = self.engine.download(&id, "/reports", move || stop.reason());
                copied = collect::extract(archive, &b.dir, &caps, stop);
            }
            // Checked after the copy too: one that raced the container's end read
            // nothing (a copy that found nothing in a live container is no loss).
            let nothing = copied.files == 0 && copied.skipped_count == 0;
            if copied.stopped.is_none() && nothing && !self.engine.is_running(&id) {
                copied.stopped = lost();
            }
            *watched.reports.borrow_mut() = copied;
        }
        // Remove by the ID we created, whatever happened (cancel, timeout, engine error).
        let removed = self.engine.remove(&id);
        if removed.is_ok() {
            watchdog.dismiss();
        } else {
            watched.container_left.set(true);
        }
        if matches!(removed, Ok(Removal::ByOthers))
            && let Some(v) = &volume
        {
            let _ = self.engine.remove_volume(v);
        }
        let ended = outcome?;
        if removed? == Removal::ByOthers {
            // Someone removed it while it ran (a cleanup, a person): whatever its exit
            // code says, the batch did not fail by itself.
            return Ok(Ended::Stopped {
                verdict: Verdict::InfraError,
                message: "the container was removed by someone else while the batch ran".into(),
                exit: ended.container_exit(),
            });
        }
        Ok(ended)
    }

    fn follow(&self, b: &BatchPlan, id: &str, watched: &Watched) -> Result<Ended> {
        let printed = &watched.printed;
        // Whole seconds, as the engine's event filter takes them: one early, so the
        // start's own second is in.
        let started_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .saturating_sub(1);
        if let Err(why) = self.engine.start_container(id) {
            let gpu_hint = if b.gpus > 0
                && (why.contains("device driver") || why.contains("nvidia") || why.contains("cdi"))
            {
                "; the engine has no GPU runtime for this device request: install the NVIDIA Container Toolkit (see `cibox doctor`)"
            } else {
                ""
            };
            return Ok(Ended::Stopped {
                verdict: Verdict::InfraError,
                message: format!("the engine could not start the container: {why}{gpu_hint}"),
                exit: None,
            });
        }
        self.emit(&Event::ContainerStarted {
            batch: b,
            container: &b.container.name,
        })?;
        let mut signal = None;
        let mut report_failed = None;
        let followed = self.engine.follow_exec(
            id,
            Steps {
                cmd: b.container.steps(),
                user: b.container.user(),
                deadline: Instant::now() + b.timeout.0,
                grace: STOP_GRACE,
            },
            || {
                signal = signal.or_else(signals::received);
                signal.is_some()
            },
            |seen| {
                let event = match seen {
                    Followed::Output(bytes) => {
                        printed.set(printed.get() + bytes.len() as u64);
                        if let Some(t) = watched.steps.borrow_mut().as_mut() {
                            t.feed(bytes);
                        }
                        Event::Output { batch: b, bytes }
                    }
                    Followed::DeadlinePassed => Event::TimedOut { batch: b },
                    Followed::StreamBroke(error) => Event::OutputBroke { batch: b, error },
                };
                if let Err(e) = self.emit(&event) {
                    report_failed.get_or_insert(e);
                }
            },
        );
        self.emit(&Event::OutputEnded { batch: b })?;
        if let Some(e) = report_failed {
            return Err(e);
        }
        let FollowEnd { stopped, exit } = match followed {
            Ok(end) => end,
            // The batch could not be started or followed: if the container was killed
            // from outside meanwhile, that is what to say.
            Err(e) => {
                return match self.engine.end_cause(id, started_at) {
                    cause @ Ok(EndCause::KilledThroughEngine(_) | EndCause::OutOfMemory) => {
                        Ok(why_it_ended(b, cause, None))
                    }
                    _ => Err(e.into()),
                };
            }
        };
        Ok(match (stopped, exit) {
            (Some(Stop::Interrupted), _) => {
                let sig = signal.unwrap_or(nix::sys::signal::Signal::SIGTERM);
                Ended::Stopped {
                    verdict: Verdict::Cancelled(sig),
                    message: format!("cancelled by {sig}"),
                    exit,
                }
            }
            (Some(Stop::Deadline), _) => Ended::Stopped {
                verdict: Verdict::Timeout,
                message: format!("the batch hit its timeout of {}", b.timeout),
                exit,
            },
            (None, Some(0)) => Ended::Exited(0),
            (None, code) => why_it_ended(b, self.engine.end_cause(id, started_at), code),
        })
    }
}

/// A batch that ended by itself with a failing or unknown code: as the code says,
/// unless the engine (`cause`) says someone killed it from outside, or says the batch went
/// over its memory limit (which is the batch's failure, told plainly). When the
/// engine cannot be asked, the exit code stands.
fn why_it_ended(b: &BatchPlan, cause: Result<EndCause, EngineError>, code: Option<i64>) -> Ended {
    let shown = code.map_or("unknown".to_string(), |c| c.to_string());
    match cause {
        Ok(EndCause::OutOfMemory) => Ended::Stopped {
            verdict: Verdict::Failed,
            message: format!(
                "the batch went over its memory limit ({}) and the kernel killed it (exit {shown}); raise container.memory or make the tests use less",
                b.container.memory_text()
            ),
            exit: code,
        },
        Ok(EndCause::KilledThroughEngine(signal)) => Ended::Stopped {
            verdict: Verdict::InfraError,
            message: format!(
                "the container was killed from outside through the engine (signal {}: `docker kill`, `docker stop`, a cleanup script) while the batch ran",
                if signal.is_empty() {
                    "unknown"
                } else {
                    &signal
                }
            ),
            exit: code,
        },
        Ok(EndCause::Itself) | Err(_) => code.map_or(Ended::Unknown, Ended::Exited),
    }
}

/// The test cases of the batch's JUnit reports, and the first report that could not
/// be read.
fn read_reports(dir: &Path) -> (junit::Collected, Option<String>) {
    let mut collected = junit::Collected::default();
    let mut problem = None;
    // Bounded like each file: a batch cannot make the host read more than this.
    let mut budget = MAX_REPORTS_BYTES;
    for f in junit::files(dir) {
        let size = std::fs::symlink_metadata(&f).map_or(0, |m| m.len());
        if size > budget {
            problem.get_or_insert(format!(
                "JUnit report {} not read: the batch's reports pass {} MiB in all",
                f.display(),
                MAX_REPORTS_BYTES >> 20
            ));
            continue;
        }
        budget -= size;
        match junit::read(&f)
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
