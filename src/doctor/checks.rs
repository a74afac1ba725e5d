//! The doctor's checks, one function per finding (or per group of findings).

use std::time::Duration;

use super::finding::{Finding, Sources, Status, finding};
use crate::engine::{Engine, EngineInfo};
use crate::error::Result;
use crate::gpu::model;
use crate::gpu::pool::PoolGpu;
use crate::gpu::probe::{self, Snapshot};
use crate::manifest::{GpuConfig, GpuDriver, Manifest, PoolSpec};

/// Default folders where CDI specs live when the engine does not say.
const CDI_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// CDI spec files that describe NVIDIA GPUs.
pub(super) fn nvidia_cdi_specs(dirs: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let is_spec = p
                .extension()
                .is_some_and(|x| x == "yaml" || x == "yml" || x == "json");
            if is_spec && std::fs::read_to_string(&p).is_ok_and(|t| t.contains("nvidia.com/gpu")) {
                found.push(p.display().to_string());
            }
        }
    }
    found
}

pub(super) fn gpu_runtime(info: &EngineInfo, driver: GpuDriver) -> Finding {
    let cdi_dirs: Vec<String> = if info.cdi_spec_dirs.is_empty() {
        CDI_DIRS.iter().map(|s| s.to_string()).collect()
    } else {
        info.cdi_spec_dirs.clone()
    };
    let specs = nvidia_cdi_specs(&cdi_dirs);
    let has_runtime = info.runtimes.iter().any(|r| r.contains("nvidia"));
    // dockerd enables `--gpus` device requests when this hook is on its PATH.
    let hook = crate::util::which("nvidia-container-runtime-hook");
    match driver {
        GpuDriver::Cdi if !specs.is_empty() => finding(
            "gpu runtime",
            Status::Ok,
            format!("CDI specs for nvidia.com/gpu: {}", specs.join(", ")),
            true,
        ),
        GpuDriver::Cdi => finding(
            "gpu runtime",
            Status::Fail,
            format!(
                "container.gpu_driver is cdi but no CDI spec names nvidia.com/gpu in {}; run `nvidia-ctk cdi generate`",
                cdi_dirs.join(", ")
            ),
            true,
        ),
        GpuDriver::Nvidia if has_runtime || hook.is_some() => {
            let what = if has_runtime {
                format!("engine runtimes: {}", info.runtimes.join(", "))
            } else {
                format!(
                    "nvidia-container-runtime-hook at {}",
                    hook.unwrap_or_default().display()
                )
            };
            finding("gpu runtime", Status::Ok, what, true)
        }
        GpuDriver::Nvidia => finding(
            "gpu runtime",
            Status::Fail,
            format!(
                "the engine has no NVIDIA runtime (runtimes: {}) and nvidia-container-runtime-hook is not on PATH; install the NVIDIA Container Toolkit",
                info.runtimes.join(", ")
            ),
            true,
        ),
    }
}

pub(super) fn pool_finding(pool: &PoolSpec, snapshot: Option<&probe::Snapshot>) -> Finding {
    let PoolSpec::Devices(items) = pool else {
        let detail = match snapshot {
            Some(s) => format!("all ({} GPUs)", s.gpus.len()),
            None => "all".to_string(),
        };
        return finding("gpu pool", Status::Ok, detail, false);
    };
    let Some(s) = snapshot else {
        return finding(
            "gpu pool",
            Status::Ok,
            format!("{} (not matched: no probe)", items.join(",")),
            false,
        );
    };
    let unknown: Vec<&String> = items
        .iter()
        .filter(|i| {
            !s.gpus
                .iter()
                .any(|g| &g.uuid == *i || &g.index.to_string() == *i)
        })
        .collect();
    if unknown.is_empty() {
        finding("gpu pool", Status::Ok, items.join(","), true)
    } else {
        let list: Vec<&str> = unknown.iter().map(|s| s.as_str()).collect();
        finding(
            "gpu pool",
            Status::Fail,
            format!(
                "not on this host: {}; fix gpu.pool or CIBOX_GPU_POOL",
                list.join(", ")
            ),
            true,
        )
    }
}

/// How `gpu exec` confines a command on this host, found by confining `true`.
pub(super) fn confinement_finding() -> Finding {
    use crate::process::confine::{Confinement, Supervisor, Wanted};
    const CHECK: &str = "gpu exec confinement";
    let wanted = match Wanted::from_env() {
        Ok(w) => w,
        Err(e) => return finding(CHECK, Status::Fail, e.to_string(), false),
    };
    let argv = ["true".to_string()];
    let supervisor = match Supervisor::start(&argv, &[], &[], Duration::from_secs(5), wanted) {
        Ok(s) => s,
        Err(why) => return finding(CHECK, Status::Fail, why.to_string(), false),
    };
    let started = supervisor.started.clone();
    supervisor.wait();
    let name = started.confinement.name();
    let proc_note = " but /proc could not be mounted in it: commands see the host's /proc, \
                     where their own PIDs name other processes";
    match started.confinement {
        Confinement::PidNamespace | Confinement::UserNamespace if !started.own_proc => {
            finding(CHECK, Status::Warn, format!("{name}{proc_note}"), false)
        }
        Confinement::PidNamespace => finding(
            CHECK,
            Status::Ok,
            format!(
                "{name}: when cibox dies, by any signal, the kernel kills every process of the command"
            ),
            false,
        ),
        Confinement::UserNamespace => finding(
            CHECK,
            Status::Ok,
            format!(
                "{name}: a PID namespace in a user namespace that maps only uid {}; setuid \
                 programs (sudo) do not work inside (CIBOX_CONFINE=subreaper if a command needs them)",
                nix::unistd::getuid()
            ),
            false,
        ),
        Confinement::Subreaper => {
            let why = if wanted == Wanted::Subreaper {
                "asked for by CIBOX_CONFINE"
            } else {
                "no PID namespace here (not root, and unprivileged user namespaces are off)"
            };
            finding(
                CHECK,
                Status::Warn,
                format!(
                    "{name}, {why}: a supervisor reaps every descendant and kills them all when \
                     cibox dies; only a SIGKILL of that supervisor itself would leave processes behind"
                ),
                false,
            )
        }
    }
}

/// The checks of this host's own GPUs.
const LOCAL_GPU_CHECKS: [&str; 5] = [
    "gpu runtime",
    "gpu probe",
    "gpu health",
    "gpu pool",
    "gpu devices",
];

/// Whether this host is one of the cluster's nodes: inside a job, or named as a node by
/// the controller (by its short host name).
pub(super) fn this_host_is_a_slurm_node(cluster: Option<&crate::slurm::cluster::Cluster>) -> bool {
    if ["SLURM_JOB_ID", "SLURMD_NODENAME"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return true;
    }
    let host = crate::util::host_name();
    let short = host.split('.').next().unwrap_or(&host);
    cluster.is_some_and(|c| c.nodes.iter().any(|n| n.name == short))
}

/// On a Slurm login node the nodes run the batches, each checking its own GPUs when
/// it runs one: what this host's GPUs would need is told, and fails nothing.
pub(super) fn nodes_run_the_batches(f: &mut Finding) {
    if !LOCAL_GPU_CHECKS.contains(&f.check) {
        return;
    }
    let word = match f.status {
        Status::Ok | Status::Info => "ok",
        Status::Warn => "warn",
        Status::Fail => "would fail",
    };
    f.detail = format!(
        "not needed here: the Slurm nodes run the batches (run `cibox doctor` on a node to check its GPUs); this host: {word}: {}",
        f.detail
    );
    f.status = Status::Info;
    f.blocks_gpu_batches = false;
}

/// The host policy in force and what it grants: `None` when it cannot be used, else
/// whether this host is a Slurm login node (the policy sends batches to Slurm, and
/// this host is none of the cluster's nodes).
pub(super) fn policy_finding(ctx: &dyn Sources, findings: &mut Vec<Finding>) -> Option<bool> {
    match ctx.host_policy() {
        Ok(p) => {
            findings.push(finding(
                "host policy",
                Status::Ok,
                format!("{}: {}", p.describe(), p.grants_summary()),
                false,
            ));
            if let crate::host::Scheduler::Slurm(slurm) = &p.scheduler {
                let cluster = crate::slurm::cluster::Cluster::query();
                findings.push(slurm_finding(slurm, &cluster));
                // A node of the cluster (the policy is shared) runs batches on its own
                // GPUs: there they are checked for real.
                return Some(!this_host_is_a_slurm_node(cluster.as_ref().ok()));
            }
            Some(false)
        }
        Err(e) => {
            findings.push(finding("host policy", Status::Fail, e.to_string(), false));
            None
        }
    }
}

/// On a login node: whether the Slurm controller answers, and what the partition has.
pub(super) fn slurm_finding(
    slurm: &crate::host::SlurmPolicy,
    cluster: &Result<crate::slurm::cluster::Cluster, crate::slurm::SlurmError>,
) -> Finding {
    let found = cluster.as_ref().map_err(ToString::to_string).and_then(|c| {
        let name = c
            .partition(slurm.partition.as_deref())
            .map_err(|e| e.to_string())?
            .name
            .clone();
        let nodes: Vec<_> = c.nodes_of(&name).collect();
        Ok(format!(
            "partition {name}: {} node(s), {} GPU(s), {} free ({})",
            nodes.len(),
            nodes.iter().map(|n| n.gpus).sum::<u32>(),
            nodes.iter().map(|n| n.gpus_free()).sum::<u32>(),
            c.free_by_node(&name)
        ))
    });
    match found {
        Ok(detail) => finding("slurm", Status::Ok, detail, true),
        Err(e) => finding("slurm", Status::Fail, e, true),
    }
}

/// The manifest, if one is found and reads; and whether one was found broken. With a
/// broken policy it is read as written (the policy's own finding says what is wrong).
pub(super) fn manifest_finding(
    ctx: &dyn Sources,
    policy_broken: bool,
    findings: &mut Vec<Finding>,
) -> (Option<Manifest>, bool) {
    let loaded = if policy_broken {
        ctx.manifest_as_written()
    } else {
        ctx.manifest()
    };
    match loaded {
        Ok(m) => {
            findings.push(finding(
                "manifest",
                Status::Ok,
                m.path.display().to_string(),
                false,
            ));
            (Some(m), false)
        }
        Err(e) => {
            let broken = !crate::manifest::no_manifest(&e);
            let status = if broken { Status::Fail } else { Status::Warn };
            findings.push(finding(
                "manifest",
                status,
                format!("{e} (using defaults)"),
                false,
            ));
            (None, broken)
        }
    }
}

/// The engine: reachable, its storage driver and what its image IDs mean, its GPU
/// runtime.
pub(super) fn engine_findings(driver: GpuDriver, findings: &mut Vec<Finding>) {
    let engine_info = Engine::connect().and_then(|engine| engine.info());
    match &engine_info {
        Ok(info) => {
            findings.push(finding(
                "engine",
                Status::Ok,
                format!(
                    "{} at {}, API {}",
                    info.server_version, info.host, info.api_version
                ),
                true,
            ));
            findings.push(finding(
                "storage",
                Status::Ok,
                format!("{}: {}", info.storage_driver, info.id_semantics.describe()),
                false,
            ));
            findings.push(gpu_runtime(info, driver));
        }
        Err(e) => findings.push(finding("engine", Status::Fail, e.to_string(), true)),
    }
}

/// Fake GPUs (`cibox gpu fake`): said first, as a warning, so nobody reads this host's
/// GPUs as hardware; the engine needs no runtime for them. Whether they are on.
pub(super) fn fake_findings(findings: &mut Vec<Finding>) -> bool {
    let Some(host) = crate::gpu::fake::active() else {
        return false;
    };
    let f = match host {
        Ok(h) => finding("fake gpus", Status::Warn, h.describe(), false),
        Err(e) => finding("fake gpus", Status::Fail, e.to_string(), true),
    };
    findings.insert(0, f);
    if let Some(f) = findings.iter_mut().find(|f| f.check == "gpu runtime") {
        *f = finding(
            "gpu runtime",
            Status::Ok,
            "fake GPUs need none: a lease gives the container the variables naming them, no device",
            true,
        );
    }
    true
}

/// On a host of AMD, Intel or Moore Threads GPUs or Ascend NPUs: no engine runtime is needed (the "gpu
/// runtime" finding says so instead of asking for NVIDIA's), and each unit's device
/// files must be found as a lease's hand-over finds them ("gpu devices").
pub(super) fn amd_findings(s: &Snapshot, driver: GpuDriver, findings: &mut Vec<Finding>) {
    use crate::manifest::{is_amd_gpu_id, is_mtt_id, is_npu_id, is_xpu_id};
    let all = |f: fn(&str) -> bool| !s.gpus.is_empty() && s.gpus.iter().all(|g| f(&g.uuid));
    let why = if all(is_amd_gpu_id) {
        "AMD GPUs need no engine runtime: a lease maps /dev/kfd and each GPU's own /dev/dri nodes"
    } else if all(is_npu_id) {
        "Ascend NPUs need no engine runtime: a lease maps each chip's own /dev/davinciN, the driver's shared nodes and its user space read-only"
    } else if all(is_xpu_id) {
        "Intel GPUs need no engine runtime: a lease maps each GPU's own /dev/dri nodes"
    } else if all(is_mtt_id) {
        "Moore Threads GPUs need no engine runtime: a lease maps each GPU's own /dev/mtgpu.N"
    } else {
        return;
    };
    if let Some(f) = findings.iter_mut().find(|f| f.check == "gpu runtime") {
        *f = finding("gpu runtime", Status::Ok, why, true);
    }
    findings.push(match crate::gpu::vendor::handover(&all_gpus(s), driver) {
        Ok(h) => finding(
            "gpu devices",
            Status::Ok,
            format!(
                "{} device files of {} GPUs found and checked{}",
                h.devices.len(),
                s.gpus.len(),
                match h.mounts.len() {
                    0 => String::new(),
                    n => format!(", {n} driver paths to bind read-only"),
                }
            ),
            true,
        ),
        Err(e) => finding("gpu devices", Status::Fail, e.to_string(), true),
    });
}

/// The GPU probe, and what it saw.
/// The probe's finding, with the models of the GPUs (what the GPUs are, when the
/// probe can say: an empty list when not).
pub(super) fn probe_finding(
    gpu_cfg: Option<&GpuConfig>,
    findings: &mut Vec<Finding>,
) -> (Option<Snapshot>, Vec<probe::GpuHardware>) {
    let prober = probe::Prober::new(gpu_cfg.map_or(probe::ProbeChoice::Auto, |g| g.probe));
    match prober.probe() {
        Ok(s) => {
            let busy = s.apps.len();
            // Decided by the probe above: this only names it.
            let backend = prober.backend().unwrap_or_else(|e| e.to_string());
            let hardware = prober.hardware().unwrap_or_default();
            let models = match s.gpus.len() {
                0 => String::new(),
                _ => format!(" ({})", model::describe(&all_gpus(&s), &hardware)),
            };
            findings.push(finding(
                "gpu probe",
                Status::Ok,
                format!(
                    "{backend}: {} GPUs{models}, {busy} compute processes",
                    s.gpus.len()
                ),
                true,
            ));
            findings.push(health_finding(&s));
            (Some(s), hardware)
        }
        Err(e) => {
            findings.push(finding("gpu probe", Status::Fail, e.to_string(), true));
            (None, Vec::new())
        }
    }
}

/// The units the driver reports unhealthy, each named with why: leased to nobody
/// until they read healthy again. A warning: the others still serve.
pub(super) fn health_finding(s: &Snapshot) -> Finding {
    let sick = crate::gpu::pool::sick_among(&all_gpus(s), s);
    if sick.is_empty() {
        return finding(
            "gpu health",
            Status::Ok,
            format!("{} units read healthy", s.gpus.len()),
            true,
        );
    }
    finding(
        "gpu health",
        Status::Warn,
        format!(
            "{} of {} units unhealthy, leased to nobody until they read healthy again: {}",
            sick.len(),
            s.gpus.len(),
            sick.join("; ")
        ),
        true,
    )
}

/// Every GPU the probe shows, as pool entries.
pub(super) fn all_gpus(s: &Snapshot) -> Vec<PoolGpu> {
    s.gpus.iter().map(PoolGpu::of).collect()
}

/// The GPU models the manifest's batches ask for (`gpu_model`), each with the batches
/// that ask it.
pub(super) fn models_asked(m: &Manifest) -> Vec<(String, Vec<String>)> {
    let mut asked: Vec<(String, Vec<String>)> = Vec::new();
    for (name, b) in &m.batches {
        let Some(glob) = b.gpu_model.as_ref().filter(|_| b.gpus > 0) else {
            continue;
        };
        match asked.iter_mut().find(|(g, _)| g == glob) {
            Some((_, batches)) => batches.push(name.clone()),
            None => asked.push((glob.clone(), vec![name.clone()])),
        }
    }
    asked
}

/// Whether this host has GPUs of each model the batches ask for: one it lacks is a
/// warning (those batches are capacity here, exit 4; another host may serve them).
pub(super) fn models_finding(
    asked: &[(String, Vec<String>)],
    s: &Snapshot,
    hw: &[probe::GpuHardware],
) -> Finding {
    let gpus = all_gpus(s);
    let mut lacking = Vec::new();
    let mut have = Vec::new();
    for (glob, batches) in asked {
        let n = gpus
            .iter()
            .filter(|g| model::model_of(hw, &g.uuid).is_some_and(|m| model::matches(glob, m)))
            .count();
        let glob = crate::util::escape(glob);
        if n == 0 {
            lacking.push(format!("`{glob}` (batches {})", batches.join(", ")));
        } else {
            have.push(format!("`{glob}`: {n}"));
        }
    }
    if lacking.is_empty() {
        finding("gpu models", Status::Ok, have.join(", "), false)
    } else {
        finding(
            "gpu models",
            Status::Warn,
            format!(
                "no GPU here of model {}: those batches are exit 4 on this host; it has {}",
                lacking.join("; "),
                model::describe(&gpus, hw)
            ),
            false,
        )
    }
}
