//! Running batches, each in its own disposable container (SPEC sections 6 and 7).
//!
//! Per batch: lease its GPUs → create the container → start → stream its output →
//! wait with the deadline (or a signal) → collect reports → remove the container by
//! exact name → write `result.json` → release the lease. The image is verified once,
//! before anything starts.

pub mod claims;
pub mod container;
pub mod junit;
pub mod record;
pub mod run_lock;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::exit;
use crate::gpu::lease::{Holder, Lease, LeaseDir};
use crate::gpu::pool::{self, PoolGpu};
use crate::gpu::probe;
use crate::gpu::{self, Want};
use crate::image_id::ImageId;
use crate::manifest::{Batch, Manifest};
use crate::report;
use crate::signals;
use crate::units::rfc3339;
use container::{ContainerPlan, LABEL_HOST, LABEL_OWNER, LABEL_PROJECT, LABEL_RUN, LABEL_SCOPE};
use junit::{Case, Totals};
use record::{GpuRef, RunRecord, SourceInfo, Status};

/// Grace between SIGTERM and SIGKILL when a batch times out.
const STOP_GRACE_S: i32 = 10;

/// Everything that is the same for every batch of one run.
pub struct RunSetup {
    pub manifest: Manifest,
    pub names: Vec<String>,
    pub fast: bool,
    pub image: ImageId,
    pub lockset: String,
    pub source: PathBuf,
    pub source_info: SourceInfo,
    pub reports: PathBuf,
    pub scope: String,
    pub run_id: String,
    /// This host's name, for the container's host label.
    pub host: String,
    pub wait: Duration,
    /// Run all batches at once; the lease queue decides which fit together.
    pub parallel: bool,
}

/// The source: the git toplevel (or `--source`), with its commit and dirtiness when it
/// is a checkout. Not being one is allowed and recorded.
pub fn source_info(dir: &Path) -> SourceInfo {
    let sha = crate::git::text(dir, &["rev-parse", "--verify", "HEAD"])
        .ok()
        .filter(|s| s.len() == 40);
    let dirty = sha
        .as_ref()
        .and_then(|_| {
            crate::git::text(dir, &["status", "--porcelain", "--untracked-files=normal"]).ok()
        })
        .map(|s| !s.is_empty());
    SourceInfo {
        sha,
        dirty,
        path: dir.display().to_string(),
    }
}

/// The git toplevel of the current folder.
pub fn git_toplevel() -> Option<PathBuf> {
    crate::git::text(Path::new("."), &["rev-parse", "--show-toplevel"])
        .ok()
        .map(PathBuf::from)
}

/// The default scope: per workflow run on GitHub Actions, per user elsewhere.
pub fn default_scope() -> String {
    if let (Ok(id), Ok(attempt)) = (
        std::env::var("GITHUB_RUN_ID"),
        std::env::var("GITHUB_RUN_ATTEMPT"),
    ) {
        return format!("gh-{id}-{attempt}");
    }
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| nix::unistd::getuid().to_string())
        });
    format!("local-{user}")
}

/// 16 hex digits from the kernel's random source.
pub fn new_run_id() -> String {
    let mut buf = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut buf))
        .is_err()
    {
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        buf = (t.as_nanos() as u64 ^ u64::from(std::process::id()) << 32).to_le_bytes();
    }
    crate::manifest::hex(&buf)
}

/// What a sweep did.
#[derive(Debug, Default)]
pub struct Swept {
    /// Containers of dead runs, removed.
    pub removed: usize,
    /// Containers of runs still alive on this host (another job sharing the scope).
    pub live: usize,
    /// Containers made from another host, which only that host can judge.
    pub elsewhere: Vec<(String, String)>,
}

/// Removes the containers of this project and scope whose run is gone (its cibox died):
/// exact owner/project/scope labels, the name prefix they imply, a run ID, made on this
/// host, and the run's lock in `runs` free ([`run_lock`]). A live run's containers are
/// left alone, as are those of another host. Then forgets the records of this scope's
/// dead runs.
pub async fn sweep(
    engine: &Engine,
    project: Option<&str>,
    scope: &str,
    runs: &LeaseDir,
    host: &str,
) -> Result<Swept> {
    let mut labels = vec![
        format!("{LABEL_OWNER}=cibox"),
        format!("{LABEL_SCOPE}={scope}"),
    ];
    if let Some(p) = project {
        labels.push(format!("{LABEL_PROJECT}={p}"));
    }
    let mut swept = Swept::default();
    for c in engine.containers_with_labels(&labels).await? {
        let label = |k: &str| c.labels.get(k).map(String::as_str);
        let prefix = format!(
            "cibox-{}-{}-",
            container::sanitize(label(LABEL_PROJECT).unwrap_or_default()),
            container::sanitize(scope)
        );
        if label(LABEL_OWNER) != Some("cibox")
            || label(LABEL_SCOPE) != Some(scope)
            || !c.name.starts_with(&prefix)
        {
            continue;
        }
        let Some(run) = label(LABEL_RUN).filter(|r| run_lock::is_run_id(r)) else {
            continue;
        };
        // Containers made before the host label existed count as this host's.
        if let Some(other) = label(LABEL_HOST).filter(|h| *h != host) {
            swept.elsewhere.push((c.name.clone(), other.to_string()));
            continue;
        }
        let alive = run_lock::is_alive(runs, run).map_err(|e| {
            Error::Infra(format!(
                "lock dir {}: cannot tell whether run {run} is alive: {e}",
                runs.path().display()
            ))
        })?;
        if alive {
            report::debug(format!("leaving {}: its run {run} is alive", c.name));
            swept.live += 1;
            continue;
        }
        report::info(format!(
            "removing leftover container {} ({})",
            c.name,
            &c.id[..12.min(c.id.len())]
        ));
        engine.remove_container(&c.id).await?;
        swept.removed += 1;
    }
    // Every container of this scope's (and project's) dead runs is gone now: their
    // records can go too, and with them the reason to ask the engine (see `claims`).
    let dead = run_lock::dead_runs(runs)
        .map_err(|e| Error::Infra(format!("lock dir {}: runs/: {e}", runs.path().display())))?;
    for (run, info) in dead {
        if let Some(info) = info
            && info.scope == scope
            && project.is_none_or(|p| p == info.project)
        {
            run_lock::forget(runs, &run);
        }
    }
    for (name, other) in &swept.elsewhere {
        report::warn(format!(
            "leaving {name}: made on host {other}; run `cibox cleanup` there"
        ));
    }
    Ok(swept)
}

/// The GPU side of a run, prepared once.
pub struct GpuSide {
    pub dir: LeaseDir,
    pub pool: Vec<PoolGpu>,
}

pub fn prepare_gpus(m: &Manifest, dir: LeaseDir) -> Result<GpuSide> {
    let snap = probe::probe(probe::timeout())?;
    let pool = pool::resolve(&m.gpu.pool, &snap).map_err(Error::Usage)?;
    Ok(GpuSide { dir, pool })
}

/// How one batch ended, before it is written down.
struct Ended {
    status: Status,
    message: Option<String>,
    container_exit: Option<i64>,
    signal: Option<nix::sys::signal::Signal>,
}

type BatchOutcome = (RunRecord, Vec<Case>, Option<nix::sys::signal::Signal>);

/// Runs the batches, one after another or (with `parallel`) all at once, each waiting
/// for its GPUs in the lease queue; returns the run's exit code.
pub fn run(
    setup: &RunSetup,
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    gpus: Option<&GpuSide>,
) -> Result<u8> {
    for name in &setup.names {
        check_batch_dir(&setup.reports, name)?;
    }
    let mut outcomes: Vec<BatchOutcome> = Vec::new();
    if setup.parallel {
        let joined: Vec<Result<BatchOutcome>> = std::thread::scope(|s| {
            let handles: Vec<_> = setup
                .names
                .iter()
                .map(|name| {
                    s.spawn(move || {
                        let rt = crate::engine::runtime()?;
                        let engine = rt.block_on(Engine::connect())?;
                        run_batch(
                            setup,
                            &rt,
                            &engine,
                            gpus,
                            name,
                            &setup.manifest.batches[name],
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Infra("a batch's thread panicked".into())))
                })
                .collect()
        });
        for o in joined {
            outcomes.push(o?);
        }
    } else {
        for name in &setup.names {
            if signals::received().is_some() {
                break; // a signal between two batches: start no more
            }
            let outcome = run_batch(setup, rt, engine, gpus, name, &setup.manifest.batches[name])?;
            let stop = outcome.2.is_some();
            outcomes.push(outcome);
            if stop {
                break; // signals end the run at once
            }
        }
    }
    let mut results: Vec<(RunRecord, Vec<Case>)> = Vec::new();
    let mut codes = Vec::new();
    let mut stopped_by = None;
    for (record, cases, signal) in outcomes {
        codes.push(record.exit_code);
        if record.status != Status::Passed {
            let result_path = setup.reports.join(&record.batch).join("result.json");
            report::info(format!(
                "batch {} {}; replay it locally: {}",
                record.batch,
                record.status.as_str(),
                record::reproduce_line(&result_path)
            ));
        }
        stopped_by = stopped_by.or(signal);
        results.push((record, cases));
    }
    let stopped_by = stopped_by.or_else(signals::received);
    let root = &setup.reports;
    let summary = record::summary_markdown(&results, root);
    let io = |e: std::io::Error| Error::Infra(format!("reports dir {}: {e}", root.display()));
    std::fs::write(root.join("summary.md"), &summary).map_err(io)?;
    std::fs::write(root.join("junit.xml"), record::merged_junit(&results)).map_err(io)?;
    crate::github::report_run(&results, &summary);
    if let Some(sig) = stopped_by {
        return Ok(exit::signal(sig as i32));
    }
    Ok(exit::most_severe(codes))
}

/// Marks a batch folder as cibox's from the moment it is made, so that the folder of a
/// run that was killed (no `result.json` yet) is still known to be ours.
const BATCH_DIR_MARKER: &str = ".cibox-batch";

/// Refuses a `<reports>/<batch>/` that holds files cibox did not write (it is replaced
/// by the run). Checked for every batch before the first starts.
fn check_batch_dir(reports: &Path, name: &str) -> Result<()> {
    let dir = reports.join(name);
    let ours = !dir.exists()
        || dir.join(BATCH_DIR_MARKER).exists()
        || dir.join("result.json").exists()
        || std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none());
    if !ours {
        return Err(Error::Usage(format!(
            "reports dir {} exists and holds files cibox did not write; choose another --reports",
            dir.display()
        )));
    }
    Ok(())
}

/// Prepares `<reports>/<batch>/`: a fresh folder, replacing one only if cibox wrote it.
fn batch_dir(reports: &Path, name: &str) -> Result<PathBuf> {
    check_batch_dir(reports, name)?;
    let dir = reports.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| Error::Usage(format!("cannot clear {}: {e}", dir.display())))?;
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::Usage(format!("cannot create {}: {e}", dir.display())))?;
    record::create_fresh(&dir.join(BATCH_DIR_MARKER))
        .map_err(|e| Error::Infra(format!("cannot write in {}: {e}", dir.display())))?;
    Ok(dir)
}

#[allow(clippy::type_complexity)]
fn run_batch(
    setup: &RunSetup,
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    gpus: Option<&GpuSide>,
    name: &str,
    batch: &Batch,
) -> Result<(RunRecord, Vec<Case>, Option<nix::sys::signal::Signal>)> {
    let dir = batch_dir(&setup.reports, name)?;
    let started = SystemTime::now();
    let clock = Instant::now();
    let plan = ContainerPlan::new(&setup.manifest, name, batch, setup, &dir);
    let mut holder = Holder::this_process();
    holder.batch = Some(name.to_string());
    holder.container = Some(plan.name.clone());
    holder.scope = Some(setup.scope.clone());
    holder.run = Some(setup.run_id.clone());

    // Lease the batch's GPUs for its whole life.
    let mut lease: Option<Lease> = None;
    let mut ended: Option<Ended> = None;
    if batch.gpus > 0 {
        let side = gpus.expect("GPU side prepared when a batch needs GPUs");
        let attempt = (|| -> Result<Lease> {
            if batch.gpus as usize > side.pool.len() {
                return Err(Error::Capacity(format!(
                    "batch {name} needs {} GPUs; the pool has {}",
                    batch.gpus,
                    side.pool.len()
                )));
            }
            let ticket = gpu::join_queue(&side.dir, &holder, batch.gpus as usize)?;
            let probe_with_containers = || {
                let mut snap = probe::probe(probe::timeout())?;
                claims::mark(&mut snap, engine, rt)?;
                Ok(snap)
            };
            let mut next_log = Instant::now();
            gpu::acquire(
                ticket,
                &side.dir,
                &side.pool,
                &Want::Count(batch.gpus as usize),
                &setup.manifest.gpu.idle,
                setup.wait,
                &holder,
                probe_with_containers,
                |r| {
                    if Instant::now() >= next_log {
                        next_log = Instant::now() + Duration::from_secs(30);
                        report::info(format!(
                            "batch {name}: waiting for {} GPU(s): {}",
                            batch.gpus,
                            r().describe()
                        ));
                    }
                },
            )
        })();
        match attempt {
            Ok(l) => lease = Some(l),
            Err(e) => {
                let (status, signal) = match &e {
                    Error::Capacity(_) => (Status::Capacity, None),
                    Error::Interrupted(sig) => (Status::Cancelled, Some(*sig)),
                    Error::Usage(_) | Error::LockDir(_) => return Err(e),
                    _ => (Status::InfraError, None),
                };
                report::error(&e);
                ended = Some(Ended {
                    status,
                    message: Some(e.to_string()),
                    container_exit: None,
                    signal,
                });
            }
        }
    }
    let leased: Vec<PoolGpu> = lease
        .as_ref()
        .map(|l| l.gpus().to_vec())
        .unwrap_or_default();
    let ended = match ended {
        Some(e) => e,
        None => rt
            .block_on(run_container(
                engine,
                &plan,
                &leased,
                batch,
                &dir,
                name,
                setup.names.len() > 1,
            ))
            .unwrap_or_else(|e| {
                // An engine failure ends this batch, not the run: the others still
                // run and the summary is still written.
                report::error(&e);
                Ended {
                    status: Status::InfraError,
                    message: Some(e.to_string()),
                    container_exit: None,
                    signal: None,
                }
            }),
    };
    // The container is gone (or, if the engine failed to remove it, still named
    // busy by its GPU label, see `claims`): only now may the GPUs go to someone else.
    drop(lease);

    let (cases, junit_problem) = read_reports(&dir);
    let totals = Totals::of(&cases);
    let (status, message) = judge(&ended, &totals, junit_problem, batch.allow_empty);
    let exit_code = match (status, ended.signal) {
        (Status::Cancelled, Some(sig)) => exit::signal(sig as i32),
        _ => status.exit_code(),
    };
    let finished = SystemTime::now();
    let record = RunRecord {
        schema: 1,
        batch: name.to_string(),
        status,
        exit_code,
        image: setup.image.to_string(),
        lockset: setup.lockset.clone(),
        source: setup.source_info.clone(),
        gpus: leased
            .iter()
            .map(|g| GpuRef {
                index: g.index,
                uuid: g.uuid.clone(),
            })
            .collect(),
        host: holder.host.clone(),
        scope: setup.scope.clone(),
        run: setup.run_id.clone(),
        container: plan.name.clone(),
        fast: setup.fast,
        started_at: rfc3339(started),
        finished_at: rfc3339(finished),
        duration_s: (clock.elapsed().as_millis() as f64) / 1000.0,
        tests: totals.clone(),
        cibox_version: env!("CARGO_PKG_VERSION").to_string(),
        manifest_digest: setup.manifest.digest.clone(),
        gpu_count: batch.gpus,
        env: plan.manifest_env.clone(),
        failed_tests: cases
            .iter()
            .filter(|c| matches!(c.outcome, junit::Outcome::Failed | junit::Outcome::Error))
            .map(Case::id)
            .collect(),
        message,
        container_exit_code: ended.container_exit,
    };
    record
        .write(&dir)
        .map_err(|e| Error::Infra(format!("writing {}/result.json: {e}", dir.display())))?;
    let why = record
        .message
        .as_deref()
        .map(|m| format!(": {m}"))
        .unwrap_or_default();
    report::info(format!(
        "batch {name}: {}{why} ({} tests: {} passed, {} failed, {} errors, {} skipped) in {:.1}s",
        status.as_str(),
        totals.total,
        totals.passed,
        totals.failed,
        totals.errors,
        totals.skipped,
        record.duration_s
    ));
    Ok((record, cases, ended.signal))
}

fn read_reports(dir: &Path) -> (Vec<Case>, Option<String>) {
    let mut cases = Vec::new();
    let mut problem = None;
    for f in junit::files(dir) {
        match junit::read(&f)
            .map_err(|e| e.to_string())
            .and_then(|t| junit::parse(&t))
        {
            Ok(c) => cases.extend(c),
            Err(e) => {
                problem.get_or_insert(format!("unreadable JUnit report {}: {e}", f.display()));
            }
        }
    }
    (cases, problem)
}

/// The batch's status from how the container ended and what its reports say.
fn judge(
    ended: &Ended,
    t: &Totals,
    junit_problem: Option<String>,
    allow_empty: bool,
) -> (Status, Option<String>) {
    if ended.status != Status::Passed {
        return (ended.status, ended.message.clone());
    }
    match ended.container_exit {
        Some(0) => {}
        Some(code) => {
            return (
                Status::Failed,
                Some(format!("a step exited with {code}; see log.txt")),
            );
        }
        None => {
            return (
                Status::InfraError,
                Some("the container's exit code is unknown".into()),
            );
        }
    }
    if let Some(p) = junit_problem {
        return (Status::Failed, Some(p));
    }
    if t.failed + t.errors > 0 {
        return (
            Status::Failed,
            Some(format!("{} failed, {} errors", t.failed, t.errors)),
        );
    }
    if t.total == 0 && !allow_empty {
        return (
            Status::Failed,
            Some("the batch ran no test (no JUnit test case under $CIBOX_REPORTS); set allow_empty to accept that".into()),
        );
    }
    (Status::Passed, None)
}

/// Creates, starts, follows and removes the container. Never leaves it behind.
async fn run_container(
    engine: &Engine,
    plan: &ContainerPlan,
    gpus: &[PoolGpu],
    batch: &Batch,
    dir: &Path,
    name: &str,
    prefixed: bool,
) -> Result<Ended> {
    // Created before the container exists, so it cannot be a link the batch planted.
    let log_path = dir.join("log.txt");
    let log = record::create_fresh(&log_path)
        .map_err(|e| Error::Infra(format!("cannot write {}: {e}", log_path.display())))?;
    let id = engine.create_container(&plan.name, plan.body(gpus)).await?;
    let outcome = follow(engine, &id, plan, batch, log, name, prefixed).await;
    // Remove by the ID we created, whatever happened (cancel, timeout, engine error).
    let removed = engine.remove_container(&id).await;
    let ended = outcome?;
    removed?;
    Ok(ended)
}

async fn follow(
    engine: &Engine,
    id: &str,
    plan: &ContainerPlan,
    batch: &Batch,
    mut log: std::fs::File,
    name: &str,
    prefixed: bool,
) -> Result<Ended> {
    if let Err(why) = engine.start_container(id).await {
        let gpu_hint = if plan.gpus > 0
            && (why.contains("device driver") || why.contains("nvidia") || why.contains("cdi"))
        {
            "; the engine has no GPU runtime for this device request: install the NVIDIA Container Toolkit (see `cibox doctor`)"
        } else {
            ""
        };
        return Ok(Ended {
            status: Status::InfraError,
            message: Some(format!(
                "the engine could not start the container: {why}{gpu_hint}"
            )),
            container_exit: None,
            signal: None,
        });
    }
    let github = crate::github::active();
    if github {
        println!("::group::batch {name}");
    }
    let mut logs = engine.logs(id);
    let deadline = tokio::time::Instant::now() + batch.timeout.0;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut status = Status::Passed;
    let mut message = None;
    let mut signal = None;
    let mut stdout = std::io::stdout();
    let mut logs_done = false;
    let mut at_line_start = true;
    // Follow the output until the container ends (its log stream closes), the deadline
    // passes, or a signal arrives.
    while !logs_done {
        tokio::select! {
            chunk = logs.next() => match chunk {
                Some(Ok(bytes)) => {
                    let _ = log.write_all(&bytes);
                    if prefixed {
                        // One write per chunk, each line prefixed, so parallel batches
                        // interleave whole lines.
                        let mut buf = Vec::with_capacity(bytes.len() + 64);
                        for piece in bytes.split_inclusive(|b| *b == b'\n') {
                            if at_line_start {
                                buf.extend_from_slice(format!("[{name}] ").as_bytes());
                            }
                            buf.extend_from_slice(piece);
                            at_line_start = piece.ends_with(b"\n");
                        }
                        let _ = stdout.lock().write_all(&buf);
                    } else {
                        let _ = stdout.lock().write_all(&bytes);
                    }
                }
                Some(Err(e)) => {
                    report::warn(format!("batch {name}: log stream broke: {e}"));
                    logs_done = true;
                }
                None => logs_done = true,
            },
            _ = tokio::time::sleep_until(deadline), if status == Status::Passed => {
                status = Status::Timeout;
                message = Some(format!("the batch hit its timeout of {}", batch.timeout));
                report::error(&Error::Infra(format!("batch {name}: timeout after {}; stopping its container", batch.timeout)));
                engine.stop_container(id, STOP_GRACE_S).await?;
            }
            _ = tick.tick() => {
                if let (Some(sig), None) = (signals::received(), signal) {
                    signal = Some(sig);
                    status = Status::Cancelled;
                    message = Some(format!("cancelled by {sig}"));
                    engine.kill_container(id).await?;
                }
            }
        }
    }
    let _ = stdout.flush();
    if github {
        println!("::endgroup::");
    }
    let exit = match tokio::time::timeout(Duration::from_secs(30), engine.wait_container(id)).await
    {
        Ok(r) => Some(r?.code),
        Err(_) => {
            engine.kill_container(id).await?;
            None
        }
    };
    Ok(Ended {
        status,
        message,
        container_exit: exit,
        signal,
    })
}

/// The manifest-defined environment of a batch (no host values), for the record.
pub fn manifest_env(m: &Manifest, batch: &Batch, fast: bool) -> BTreeMap<String, String> {
    let mut env = m.container.env.clone();
    env.extend(batch.env.clone());
    if fast {
        env.extend(batch.fast_env.clone());
    }
    env
}
