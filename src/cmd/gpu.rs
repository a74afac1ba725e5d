//! `cibox gpu status` and `cibox gpu exec`.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use super::context::Context;
use crate::claims::ContainerClaims;
use crate::cli::GpuExecArgs;
use crate::console::{self, Table, WaitLine};
use crate::error::{ErrorKind, Result};
use crate::exit::{self, Failure};
use crate::gpu::lease::{Holder, Lease, LeaseState};
use crate::gpu::pool::{self, PoolGpu};
use crate::gpu::probe::{HostInstant, Prober, Snapshot};
use crate::gpu::{self, LeaseRequest, Waiter, Want};
use crate::lockdir::LockDir;
use crate::manifest::GpuConfig;
use crate::process::Ending;
use crate::process::confine::{BadConfine, StartError, Supervisor, Wanted};
use crate::signals;

/// What `gpu status` and `gpu exec` refuse or lack, where no domain error says it.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A GPU's lock file could not be read.
    #[error("lock dir {}: {source}", .dir.display())]
    LockDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("gpu exec: no command given; write it after `--`")]
    NoCommand,
    #[error("gpu exec: say how many GPUs (--count N) or which (--devices LIST)")]
    NoCount,
    #[error("gpu exec: --count must be at least 1")]
    ZeroCount,
    #[error("gpu exec: --env-name `{name}` is not a variable name")]
    BadEnvName { name: String },
    /// More GPUs than the pool has: capacity, as for a batch asking for more than the
    /// pool (docs §2).
    #[error("gpu exec: --count {count} needs {}; the pool has {pool}", crate::util::count(*count as u64, "GPU"))]
    CountOverPool { count: usize, pool: usize },
    /// `CIBOX_CONFINE` names no confinement.
    #[error(transparent)]
    Confine(#[from] BadConfine),
    #[error("gpu exec: {0}")]
    NotStarted(#[source] StartError),
}

impl ErrorKind for GpuError {
    fn failure(&self) -> Failure {
        match self {
            GpuError::LockDir { .. } => Failure::Infra,
            GpuError::CountOverPool { .. } => Failure::Capacity,
            GpuError::NoCommand
            | GpuError::NoCount
            | GpuError::ZeroCount
            | GpuError::BadEnvName { .. }
            | GpuError::Confine(_)
            | GpuError::NotStarted(_) => Failure::Usage,
        }
    }
}

/// How long a group gets between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

/// The GPU settings: the manifest's when there is one, else defaults; `CIBOX_*`
/// variables override either. `gpu` commands also serve hosts without a manifest.
pub(crate) fn settings(ctx: &Context) -> Result<GpuConfig> {
    match ctx.manifest() {
        Ok(m) => Ok(m.gpu),
        Err(e) if super::context::no_manifest(&e) && ctx.manifest_path.is_none() => {
            ctx.gpu_without_manifest()
        }
        Err(e) => Err(e),
    }
}

/// Probes (with the GPUs of running cibox containers, see [`ContainerClaims`]) and
/// resolves the pool; an unknown pool entry is a configuration error.
/// `since`: a probe that started then or later will do (one shared with the waiters
/// that arrived with us; see [`Prober::probe_since`]).
fn probe_pool(
    cfg: &GpuConfig,
    claims: &mut ContainerClaims,
    since: Option<HostInstant>,
) -> Result<(Snapshot, Vec<PoolGpu>)> {
    let snap = claims.probe_since(since)?;
    let pool = pool::resolve_for(cfg, &snap)?;
    Ok((snap, pool))
}

/// `cibox gpu fake`: writes a fake host and prints the variables that turn it on.
pub fn fake(args: &crate::cli::GpuFakeArgs) -> Result<u8> {
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::var_os("XDG_STATE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
            .unwrap_or_else(std::env::temp_dir)
            .join("cibox/fake-gpus"),
    };
    let host = gpu::fake::create(&dir, &args.vendor, args.model.as_deref(), args.count)?;
    let quote = |p: &std::path::Path| format!("'{}'", p.to_string_lossy().replace('\'', "'\\''"));
    println!("export {}={}", gpu::fake::VARIABLE, quote(&host.dir));
    println!(
        "export CIBOX_GPU_LOCK_DIR={}",
        quote(&host.dir.join("locks"))
    );
    eprintln!("cibox: {}", host.describe());
    eprintln!(
        "cibox: `unset {} CIBOX_GPU_LOCK_DIR` turns them off",
        gpu::fake::VARIABLE
    );
    Ok(exit::SUCCESS)
}

/// `cibox gpu status`: one row per GPU, without waiting on any lock.
pub fn status(ctx: &Context) -> Result<u8> {
    // On a login node: the cluster's nodes, from Slurm.
    if let crate::host::Scheduler::Slurm(slurm) = &ctx.host_policy()?.scheduler {
        return super::cluster::gpu_status(ctx, slurm);
    }
    let cfg = settings(ctx)?;
    let prober = Prober::new(cfg.probe);
    let mut claims = ContainerClaims::new(LockDir::existing(&cfg.lock_dir), prober.clone());
    let (snap, pool) = probe_pool(&cfg, &mut claims, None)?;
    // Decided by the probe above: this only names it.
    let backend = prober.backend()?;
    // What each GPU is, for the MODEL column: this only describes (a request for a
    // model reads it afresh), so a probe that cannot say leaves it blank.
    let hardware = prober.hardware().unwrap_or_default();
    let model = |uuid: &str| gpu::model::model_of(&hardware, uuid).map(str::to_string);
    let dir = LockDir::existing(&cfg.lock_dir);
    let mut rows = Vec::new();
    for g in &snap.gpus {
        let in_pool = pool.iter().any(|p| p.uuid == g.uuid);
        // A slice of a GPU leased whole reads as leased by the GPU's holder.
        let lease = dir
            .state_of(&PoolGpu::of(g))
            .map_err(|source| GpuError::LockDir {
                dir: cfg.lock_dir.clone(),
                source,
            })?;
        let holder = match &lease {
            LeaseState::Free => None,
            LeaseState::Held(h) => Some(h.as_ref().map(|h| h.describe()).unwrap_or_else(|| {
                dir.kernel_holder(&g.uuid)
                    .unwrap_or_else(|| "unknown holder".into())
            })),
        };
        let busy = pool::busy_reason(&g.uuid, &snap, &cfg.idle);
        let verdict = if !in_pool {
            "not in pool".to_string()
        } else if let Some(why) = &g.sick {
            format!("{}: {why}", pool::SICK)
        } else if holder.is_some() {
            "leased".to_string()
        } else if let Some(r) = &busy {
            format!("busy: {r}")
        } else {
            "idle".to_string()
        };
        let procs: Vec<u32> = snap
            .apps
            .iter()
            .filter(|a| a.gpu_uuid == g.uuid)
            .map(|a| a.pid)
            .collect();
        rows.push((g, in_pool, holder, busy, verdict, procs));
    }
    if ctx.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(g, in_pool, holder, busy, verdict, procs)| {
                json!({
                    "index": g.index, "uuid": g.uuid, "model": model(&g.uuid),
                    "memory_used_mib": g.memory_used_mib, "memory_total_mib": g.memory_total_mib,
                    "utilization": g.utilization, "processes": procs, "in_pool": in_pool,
                    "sick": g.sick,
                    "lease_holder": holder, "idle": busy.is_none(), "verdict": verdict,
                    "available": *in_pool && holder.is_none() && busy.is_none(),
                })
            })
            .collect();
        let fake = gpu::fake::active()
            .and_then(|h| h.ok())
            .map(|h| h.describe());
        console::json(
            &json!({"gpus": v, "lock_dir": cfg.lock_dir, "probe": backend, "fake_gpus": fake}),
        );
        return Ok(exit::SUCCESS);
    }
    let mut t = Table::new(&[
        "INDEX",
        "UUID",
        "MODEL",
        "MEMORY",
        "UTIL",
        "PROCESSES",
        "POOL",
        "LEASE",
        "VERDICT",
    ]);
    for (g, in_pool, holder, _, verdict, procs) in &rows {
        let procs: Vec<String> = procs.iter().map(u32::to_string).collect();
        t.row(vec![
            g.index.to_string(),
            g.uuid.clone(),
            model(&g.uuid).map_or_else(|| "-".into(), |m| crate::util::escape(&m).into_owned()),
            format!("{}/{} MiB", g.memory_used_mib, g.memory_total_mib),
            g.utilization
                .map_or_else(|| "-".into(), |u| format!("{u}%")),
            if procs.is_empty() {
                "-".into()
            } else {
                procs.join(",")
            },
            if *in_pool { "yes" } else { "no" }.into(),
            holder.clone().unwrap_or_else(|| "-".into()),
            verdict.clone(),
        ]);
    }
    if let Some(Ok(host)) = gpu::fake::active() {
        println!("{}", host.describe());
    }
    println!("probe: {backend}");
    print!("{}", t.render());
    Ok(exit::SUCCESS)
}

fn valid_env_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// `cibox gpu exec`.
pub fn exec(ctx: &Context, args: GpuExecArgs) -> Result<u8> {
    // The pool is resolved by a probe that started after we arrived: the jobs of a CI
    // fan-out that arrive together share one.
    let arrived = HostInstant::now();
    let (need, env_name) = check_exec_args(&args)?;
    let confine = Wanted::from_env().map_err(GpuError::from)?;
    let cfg = settings(ctx)?;
    let wait = match &args.wait {
        Some(w) => w.0,
        None => cfg.wait.0,
    };
    signals::install();
    let dir = LockDir::open(&cfg.lock_dir, cfg.allow_network_lock_dir)?;
    let lease = lease_for_exec(&cfg, &dir, &args, need, wait, arrived)?;
    run_leased(&args, env_name, lease, confine)
}

/// How many GPUs `gpu exec` asks for (known before the probe: the queue place is taken
/// on arrival; `--devices` is checked against the host after it), and the variable
/// that names them.
fn check_exec_args(args: &GpuExecArgs) -> Result<(usize, String)> {
    if args.command.is_empty() {
        return Err(GpuError::NoCommand.into());
    }
    let Some(need) = (args.count.map(|n| n as usize))
        .or_else(|| args.devices.as_ref().map(|list| list.split(',').count()))
    else {
        return Err(GpuError::NoCount.into());
    };
    if args.count == Some(0) {
        return Err(GpuError::ZeroCount.into());
    }
    let env_name = args
        .env_name
        .clone()
        .unwrap_or_else(|| "CUDA_VISIBLE_DEVICES".into());
    if !valid_env_name(&env_name) {
        return Err(GpuError::BadEnvName { name: env_name }.into());
    }
    Ok((need, env_name))
}

/// Joins the queue, resolves the pool and what `--count` or `--devices` wants from it,
/// and waits for the lease, showing the wait on stderr.
fn lease_for_exec(
    cfg: &GpuConfig,
    dir: &LockDir,
    args: &GpuExecArgs,
    need: usize,
    wait: Duration,
    arrived: Option<HostInstant>,
) -> Result<Lease> {
    let mut holder = Holder::this_process();
    holder.command = Some(args.command.join(" "));
    let waiter = Waiter::arrive(dir, &holder, need, std::time::Instant::now() + wait)?;
    let prober = Prober::shared_through(cfg.probe, dir.path());
    let mut claims = ContainerClaims::new(dir.clone(), prober.clone());
    let (snap, pool) = probe_pool(cfg, &mut claims, arrived)?;
    // A model narrows the pool to its units, and no model to its whole GPUs (MIG slices
    // go only to a request for their model); what the GPUs are is read only when asked,
    // or to say what a pool of slices has. `--devices` names its units itself (a slice
    // by its UUID), so it is not narrowed (issue 48).
    let pool = match &args.model {
        None if args.devices.is_some() => pool,
        None if pool.iter().all(|g| g.parent.is_none()) => pool,
        glob => {
            let hardware = prober.hardware().map_err(|e| e.to_string());
            let hardware = hardware.as_deref().map_err(String::as_str);
            let need = args.count.map_or(1, |n| n as usize);
            gpu::model::narrow(&pool, hardware, glob.as_deref(), need)?
        }
    };
    let want = match (&args.count, &args.devices) {
        (Some(n), _) => {
            let n = *n as usize;
            if n > pool.len() {
                return Err(GpuError::CountOverPool {
                    count: n,
                    pool: pool.len(),
                }
                .into());
            }
            Want::Count(n)
        }
        (None, Some(list)) => Want::Devices(gpu::parse_devices(list, &snap, &pool)?),
        (None, None) => unreachable!("checked above"),
    };
    let want_count = want.count();
    let mut progress = WaitLine::on_stderr();
    let request = LeaseRequest {
        want,
        pool: &pool,
        policy: &cfg.idle,
        holder: &holder,
        wait,
        give_up: None,
    };
    let lease = waiter.lease(
        &request,
        |since| claims.probe_since(since).map_err(Into::into),
        |r| {
            progress.tick(r, |r| {
                format!(
                    "waiting {} for {want_count} GPU(s): {}",
                    crate::units::human(r.waited),
                    r.progress()
                )
            })
        },
    );
    progress.finish();
    Ok(lease?)
}

/// Runs the command, confined, with its GPUs named in `env_name`; releases them once no
/// process of it is left.
fn run_leased(args: &GpuExecArgs, env_name: String, lease: Lease, confine: Wanted) -> Result<u8> {
    let visible: Vec<String> = if args.index {
        lease.gpus().iter().map(|g| g.index.to_string()).collect()
    } else {
        lease.uuids()
    };
    console::debug(format!(
        "leased {} for `{}`",
        visible.join(","),
        args.command.join(" ")
    ));
    // By default the variables the units' vendor reads (CUDA_VISIBLE_DEVICES for
    // NVIDIA's, ROCR_/HIP_VISIBLE_DEVICES for AMD's); `--env-name` or `--index` asks for
    // one variable of the caller's choosing instead.
    let mut env = if args.env_name.is_some() || args.index {
        vec![(env_name, visible.join(","))]
    } else {
        gpu::vendor::host_env(lease.gpus())?
    };
    env.push(("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()));
    let supervisor = Supervisor::start(&args.command, &env, &lease.fds(), GRACE, confine)
        .map_err(GpuError::NotStarted)?;
    console::debug(format!(
        "`{}` runs confined by {}{}",
        args.command.join(" "),
        supervisor.started.confinement.name(),
        if supervisor.started.own_proc {
            ""
        } else {
            " (with the host's /proc)"
        }
    ));
    let ending = supervisor.wait();
    // No process of the workload is left: only now may the GPUs go to someone else.
    lease.release();
    Ok(match ending {
        Ending::Exited(code) => code.clamp(0, 255) as u8,
        Ending::Killed(sig) => exit::signal(sig),
        Ending::Interrupted(sig) => exit::signal(sig as i32),
    })
}
