//! Executing a [`RunPlan`]: verify the images, hold the run's lock, sweep what dead runs
//! left, then run each batch ([`batch`]: lease → container ([`container`]) → status →
//! lease released) and hand back a [`RunResult`]. Everything it has to say goes to the
//! [`Reporter`] as [`Event`]s; it prints nothing itself. It talks to the engine only
//! through [`ContainerEngine`], so its decisions are unit-tested with a fake one
//! ([`tests`]).

mod batch;
mod caches;
mod container;
mod snapshot;
#[cfg(test)]
mod tests;

use std::os::unix::io::RawFd;
use std::sync::{Mutex, PoisonError};

use crate::cache::CacheStore;
use crate::engine::ContainerEngine;
use crate::git_mask;
use crate::gpu::pool::{self, PoolGpu};
use crate::gpu::probe;
use crate::image::{self, Lockset};
use crate::lockdir::LockDir;
use crate::lockdir::runs::{RunInfo, RunLock};
use crate::nofollow::Folder;
use crate::plan::{BatchPlan, RunPlan};
use crate::report::event::{EventKind, Phase, RunClock};
use crate::report::outcome::{BatchResult, ContainerEnd, RunResult};
use crate::report::record::Hardware;
use crate::report::reporter::Reporter;
use crate::run::batch_dir;
use crate::run::cleanup::sweep;
use crate::run::cleanup::watchdog::Watchdog;
use crate::run::error::RunError;
use crate::run::order::{FirstFailure, Together, each_batch};
use crate::run::source::{OUTPUT_FOLDERS, SourceSet};
use crate::signals;
use snapshot::Snapshots;

use crate::error::Result;

/// Starts the watchdog of a batch's container (see [`Watchdog::start`]).
type StartWatchdog = fn(&str, &[RawFd]) -> std::io::Result<Watchdog>;

/// Runs the plan on `engine`; each image must carry its lockset (by image name).
pub fn execute(
    plan: &RunPlan,
    locksets: &indexmap::IndexMap<String, Lockset>,
    engine: &dyn ContainerEngine,
    reporter: &mut dyn Reporter,
) -> Result<RunResult> {
    execute_with(plan, locksets, engine, Watchdog::start, reporter)
}

fn execute_with(
    plan: &RunPlan,
    locksets: &indexmap::IndexMap<String, Lockset>,
    engine: &dyn ContainerEngine,
    start_watchdog: StartWatchdog,
    reporter: &mut dyn Reporter,
) -> Result<RunResult> {
    let clock = RunClock::start();
    source_readable(plan)?;
    verify_and_say(plan, locksets, engine, &clock, reporter)?;
    let gpu = &plan.manifest.gpu;
    // Held for the whole run, so that a sweep by another job of this scope leaves our
    // containers alone; taken before our first container exists.
    let lock_dir = LockDir::open(&gpu.lock_dir, gpu.allow_network_lock_dir)?;
    let run_info = RunInfo {
        project: plan.manifest.project.clone(),
        scope: plan.scope.clone(),
    };
    let run_lock =
        RunLock::hold(&lock_dir, &plan.run_id, &run_info).map_err(|source| RunError::RunLocks {
            dir: lock_dir.path().display().to_string(),
            what: "cannot take this run's lock".into(),
            source,
        })?;
    // Host-wide: a run killed in any scope leaves containers (and GPUs) behind that
    // nobody else would remove.
    let swept = sweep::sweep(engine, None, None, &lock_dir, &plan.host)?;
    // Said at once: whatever fails next, these are gone.
    reporter.handle(&clock.now(EventKind::Swept {
        scope: &plan.scope,
        swept: &swept,
    }))?;
    let prober = probe::Prober::shared_through(gpu.probe, lock_dir.path());
    let pool = if plan.needs_gpus() {
        // One shared with the runs that started with us will do.
        let snap = prober.probe_since(probe::HostInstant::now())?;
        pool::resolve_for(gpu, &snap)?
    } else {
        Vec::new()
    };
    let hardware = RunHardware::of(engine, plan.needs_gpus().then_some(&prober));
    for b in &plan.batches {
        batch_dir::refuse_foreign(&b.dir)?;
    }
    let git_masks = git_mask::mask(&plan.source)?;
    let source = source_set(plan, &git_masks.binds)?;
    let cache_store = open_cache_store(plan)?;
    // Made now, when nothing refused the run: refused input leaves nothing behind.
    let reports = batch_dir::reports_folder(&plan.reports)?;
    let no_snapshots = Snapshots::default();
    let run = Execution {
        clock,
        reports,
        cache_store: cache_store.as_ref(),
        plan,
        engine,
        start_watchdog,
        lock_dir,
        pool,
        prober,
        reporter: Mutex::new(reporter),
        locksets: locksets
            .iter()
            .map(|(name, l)| (name.clone(), l.digest.clone()))
            .collect(),
        // Bound only where the source is (cibox on the engine's host); the cleaned
        // configs ship in `/work` either way.
        git_masks: if plan.bind_source {
            &git_masks.binds
        } else {
            &[]
        },
        source: &source,
        hardware,
        first: FirstFailure::new(plan.fail_fast, plan.warmup.clone()),
        snapshots: &no_snapshots,
    };
    run.emit(EventKind::RunStarted {
        plan,
        reports: &run.reports,
    })?;
    let snapshots = Snapshots::make(engine, plan, &source, &mut |detail| {
        // A reporter that fails here fails again, and counts, at the first batch.
        let _ = run.emit(EventKind::Phase {
            batch: None,
            phase: Phase::Copy,
            at: run.clock.elapsed(),
            detail,
        });
    });
    let run = Execution {
        snapshots: &snapshots,
        ..run
    };
    let batches = run.every_batch()?;
    let stopped_by = batches
        .iter()
        .find_map(BatchResult::cancelled_by)
        .or_else(signals::received);
    // Every batch's container is gone (or left, holding its snapshot for a sweep).
    snapshots.remove(engine);
    if batches.iter().any(|b| b.container_left) {
        run_lock.leave_record();
    }
    let result = RunResult {
        run: plan.run_id.clone(),
        batches,
        stopped_by,
        reports: plan.reports.clone(),
    };
    run.emit(EventKind::RunEnded { run: &result })?;
    Ok(result)
}

/// For the unit at `i` of a run on a pool of `pool` GPUs: how many units from it are
/// shards of its batch (1 for a batch of its own), and how many of them go at once:
/// as many as the pool holds GPUs for (a CPU batch's, as many as the host has CPUs),
/// at least one. The rest wait their turn, not for GPUs.
fn shard_wave(plan: &RunPlan, pool: usize, i: usize) -> (usize, usize) {
    let Some(s) = &plan.batches[i].shard else {
        return (1, 1);
    };
    let len = plan.batches[i..]
        .iter()
        .take_while(|b| b.shard.as_ref().is_some_and(|t| t.batch == s.batch))
        .count();
    let width = match plan.batches[i].gpus as usize {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        gpus => pool / gpus,
    };
    (len, width.max(1))
}

/// The run's images verified against the source's locksets, each said as verified.
fn verify_and_say(
    plan: &RunPlan,
    locksets: &indexmap::IndexMap<String, Lockset>,
    engine: &dyn ContainerEngine,
    clock: &RunClock,
    reporter: &mut dyn Reporter,
) -> Result<()> {
    verify_images(plan, locksets, engine)?;
    for (name, id) in &plan.images {
        let lockset = locksets.get(name).map_or("", |l| l.digest.as_str());
        reporter.handle(&clock.now(EventKind::Phase {
            batch: None,
            phase: Phase::Verify,
            at: clock.elapsed(),
            detail: format!("image {name} {id} carries the source's lockset {lockset}"),
        }))?;
    }
    Ok(())
}

/// The host's cache store, when a batch of the run uses caches (the host granted
/// them: see `host::grants`).
fn open_cache_store(plan: &RunPlan) -> Result<Option<CacheStore>> {
    let Some(policy) = plan.caches.as_ref() else {
        return Ok(None);
    };
    if plan.batches.iter().all(|b| b.caches.is_empty()) {
        return Ok(None);
    }
    let host_root = policy.host_root.as_deref().unwrap_or(&policy.root);
    Ok(Some(CacheStore::open(&policy.root, host_root)?))
}

/// What of the source ships, listed once for the run: never cibox's own output folders,
/// the reports folder among them when it lies in the source.
fn source_set(plan: &RunPlan, masks: &[String]) -> Result<SourceSet> {
    let mut outputs: Vec<std::path::PathBuf> = OUTPUT_FOLDERS.iter().map(Into::into).collect();
    if let Ok(rel) = plan.reports.strip_prefix(&plan.source) {
        outputs.push(rel.to_path_buf());
    }
    let set = SourceSet::list(&plan.source, &outputs, masks).map_err(|source| {
        crate::error::Error::from(RunError::BatchDir {
            dir: plan.source.display().to_string(),
            what: "list the files to ship of",
            source,
        })
    })?;
    for n in &set.nested {
        crate::console::warn(format!(
            "{}: a git checkout of its own, not a submodule of {}: git ships none of its files, so batches get it empty; make it a submodule, commit its files here, or pass --source {}",
            n.display(),
            plan.source.display(),
            plan.source.join(n).display()
        ));
    }
    Ok(set)
}

/// Every image the run uses, before anything starts.
fn verify_images(
    plan: &RunPlan,
    locksets: &indexmap::IndexMap<String, Lockset>,
    engine: &dyn ContainerEngine,
) -> Result<()> {
    for (name, id) in &plan.images {
        let lockset = locksets
            .get(name)
            .ok_or_else(|| image::ImageError::NoLockset {
                name: name.to_string(),
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
    Ok(())
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
            }
            .into());
        }
    }
    Ok(())
}

/// One run in progress: what its batches share.
struct Execution<'a> {
    /// The run's clock: every event's time.
    clock: RunClock,
    /// The reports folder, held open.
    reports: Folder,
    plan: &'a RunPlan,
    engine: &'a dyn ContainerEngine,
    start_watchdog: StartWatchdog,
    lock_dir: LockDir,
    pool: Vec<PoolGpu>,
    /// Shared by the batches: NVML is opened once.
    prober: probe::Prober,
    reporter: Mutex<&'a mut dyn Reporter>,
    /// Each image's lockset digest, by image name.
    locksets: std::collections::HashMap<String, String>,
    /// Binds that hide the source's git credentials.
    git_masks: &'a [String],
    /// What of the source each batch gets in `/work`.
    source: &'a SourceSet,
    /// The host's cache store, when a batch of the run uses caches.
    cache_store: Option<&'a CacheStore>,
    /// What the run's batches run on.
    hardware: RunHardware,
    /// The stop at the run's first failure, when it has one.
    first: FirstFailure,
    /// The source shipped once for the batches that share a user.
    snapshots: &'a Snapshots,
}

/// What the run's batches run on, read once: the pool's GPUs (or why the probe could
/// not say what they are), the kernel, the engine.
struct RunHardware {
    gpus: std::result::Result<Vec<probe::GpuHardware>, String>,
    kernel: String,
    engine: String,
}

impl RunHardware {
    /// Asks the engine, the kernel and (for a run with GPU batches) the probe.
    fn of(engine: &dyn ContainerEngine, prober: Option<&probe::Prober>) -> RunHardware {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|k| k.trim().to_string())
            .unwrap_or_default();
        RunHardware {
            gpus: prober.map_or(Ok(Vec::new()), |p| p.hardware().map_err(|e| e.to_string())),
            kernel,
            engine: engine.version(),
        }
    }

    /// What a batch that leased `leased` ran on.
    fn of_batch(&self, leased: &[PoolGpu]) -> Hardware {
        let (gpus, gpus_unknown) = match &self.gpus {
            Ok(all) => (
                leased
                    .iter()
                    .filter_map(|g| all.iter().find(|h| h.uuid == g.uuid).cloned())
                    .collect(),
                None,
            ),
            Err(why) if !leased.is_empty() => (Vec::new(), Some(why.clone())),
            Err(_) => (Vec::new(), None),
        };
        Hardware {
            gpus,
            kernel: self.kernel.clone(),
            engine: self.engine.clone(),
            gpus_unknown,
            fake_gpus: !leased.is_empty() && crate::gpu::fake::is_on(),
        }
    }
}

impl Execution<'_> {
    /// Runs the plan's batches (a sharded batch's shards together, as the pool allows),
    /// each sharded batch's shards then merged into one result.
    fn every_batch(&self) -> Result<Vec<BatchResult>> {
        let plan = self.plan;
        let shards = |i: usize| shard_wave(plan, self.pool.len(), i);
        let together = Together {
            parallel: plan.parallel,
            shards: &shards,
        };
        // A sharded batch's folder, fresh once before its shards make theirs in it:
        // nothing an earlier run left there passes for theirs.
        let mut sharded: Vec<&str> = Vec::new();
        for s in plan.batches.iter().filter_map(|b| b.shard.as_ref()) {
            if !sharded.contains(&s.batch.as_str()) {
                sharded.push(&s.batch);
                batch_dir::prepare(&self.reports, &plan.reports, &plan.reports.join(&s.batch))?;
            }
        }
        let batches = each_batch(
            plan.batches.len(),
            &together,
            &self.first,
            |i| self.batch(&plan.batches[i]),
            |i, why| self.not_run(&plan.batches[i], why),
        )?;
        crate::report::shards::merge(batches, &self.reports, &plan.reports).map_err(|source| {
            RunError::BatchDir {
                dir: plan.reports.display().to_string(),
                what: "write a sharded batch's result.json in",
                source,
            }
            .into()
        })
    }

    /// Tells the reporter `kind`, happening now.
    fn emit(&self, kind: EventKind<'_>) -> Result<()> {
        self.reporter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .handle(&self.clock.now(kind))
            .map_err(crate::error::Error::from)
    }

    /// The ending of a batch that `e` kept from running, once reported; an error that
    /// is the run's, not the batch's, ends the run.
    fn failed(&self, b: &BatchPlan, e: crate::error::Error) -> Result<ContainerEnd> {
        let Some(end) = ContainerEnd::of_error(&e) else {
            return Err(e);
        };
        self.emit(EventKind::BatchFailed {
            batch: b,
            error: &e,
        })?;
        Ok(end)
    }
}
