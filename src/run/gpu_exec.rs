//! `cibox gpu exec`: a host command run on GPUs leased as a batch leases them, confined
//! so that the lease outlives every process of it.

use std::time::Duration;

use crate::claims::ContainerClaims;
use crate::cli::GpuExecArgs;
use crate::console::{self, WaitLine};
use crate::error::{ErrorKind, Result};
use crate::exit::{self, Failure};
use crate::gpu::lease::{Holder, Lease};
use crate::gpu::pool::{self, PoolGpu};
use crate::gpu::probe::{HostInstant, Prober, Snapshot};
use crate::gpu::{self, LeaseRequest, Waiter, Want};
use crate::lockdir::LockDir;
use crate::manifest::GpuConfig;
use crate::process::Ending;
use crate::process::confine::{BadConfine, StartError, Supervisor, Wanted};
use crate::signals;

/// What `gpu exec` refuses or lacks, where no domain error says it.
#[derive(Debug, thiserror::Error)]
pub enum GpuExecError {
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

impl ErrorKind for GpuExecError {
    fn failure(&self) -> Failure {
        match self {
            GpuExecError::CountOverPool { .. } => Failure::Capacity,
            GpuExecError::NoCommand
            | GpuExecError::NoCount
            | GpuExecError::ZeroCount
            | GpuExecError::BadEnvName { .. }
            | GpuExecError::Confine(_)
            | GpuExecError::NotStarted(_) => Failure::Usage,
        }
    }
}

/// How long a group gets between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

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

fn valid_env_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Runs `args.command` on GPUs leased from the pool of the GPU settings `settings`
/// reads: its arguments checked first, a place in the queue taken, the lease waited
/// for (the wait shown on stderr), the command run confined, its GPUs released once no
/// process of it is left; its exit code. `arrived`: when the command arrived.
pub fn exec(
    args: &GpuExecArgs,
    arrived: Option<HostInstant>,
    settings: impl FnOnce() -> Result<GpuConfig>,
) -> Result<u8> {
    let (need, env_name) = check_exec_args(args)?;
    let confine = Wanted::from_env().map_err(GpuExecError::from)?;
    let cfg = &settings()?;
    let wait = match &args.wait {
        Some(w) => w.0,
        None => cfg.wait.0,
    };
    signals::install();
    let dir = LockDir::open(&cfg.lock_dir, cfg.allow_network_lock_dir)?;
    let lease = lease_for_exec(cfg, &dir, args, need, wait, arrived)?;
    run_leased(args, env_name, lease, confine)
}

/// How many GPUs `gpu exec` asks for (known before the probe: the queue place is taken
/// on arrival; `--devices` is checked against the host after it), and the variable
/// that names them.
fn check_exec_args(args: &GpuExecArgs) -> Result<(usize, String)> {
    if args.command.is_empty() {
        return Err(GpuExecError::NoCommand.into());
    }
    let Some(need) = (args.count.map(|n| n as usize))
        .or_else(|| args.devices.as_ref().map(|list| list.split(',').count()))
    else {
        return Err(GpuExecError::NoCount.into());
    };
    if args.count == Some(0) {
        return Err(GpuExecError::ZeroCount.into());
    }
    let env_name = args
        .env_name
        .clone()
        .unwrap_or_else(|| "CUDA_VISIBLE_DEVICES".into());
    if !valid_env_name(&env_name) {
        return Err(GpuExecError::BadEnvName { name: env_name }.into());
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
                return Err(GpuExecError::CountOverPool {
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
        .map_err(GpuExecError::NotStarted)?;
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
