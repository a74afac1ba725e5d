//! `gpu status`'s rows: each GPU the probe shows, whether it is in the pool, who leases
//! it, whether it is busy outside cibox, and the verdict; read without waiting on any
//! lock.

use std::path::PathBuf;

use serde_json::json;

use super::CapacityError;
use crate::claims::ContainerClaims;
use crate::console::Table;
use crate::error::Result;
use crate::gpu::lease::LeaseState;
use crate::gpu::pool::{self, PoolGpu};
use crate::gpu::probe::Prober;
use crate::gpu::probe::reading::GpuState;
use crate::lockdir::LockDir;
use crate::manifest::GpuConfig;

/// One GPU now.
pub struct GpuRow {
    pub gpu: GpuState,
    /// Its model, when the probe can say.
    pub model: Option<String>,
    pub in_pool: bool,
    /// Who leases it.
    pub holder: Option<String>,
    /// Why it is busy outside cibox.
    pub busy: Option<String>,
    pub verdict: String,
    /// The compute processes on it.
    pub procs: Vec<u32>,
}

/// Every GPU the probe shows, and what read them.
pub struct GpuStatus {
    pub rows: Vec<GpuRow>,
    pub lock_dir: PathBuf,
    /// The probe's backend.
    pub probe: String,
    /// Fake GPUs (`cibox gpu fake`), described, when they are on.
    pub fake: Option<String>,
}

/// One probe (with the GPUs of running cibox containers), the pool resolved, and each
/// GPU's lease read without blocking.
pub fn gpu_status(cfg: &GpuConfig) -> Result<GpuStatus> {
    let prober = Prober::new(cfg.probe);
    let mut claims = ContainerClaims::new(LockDir::existing(&cfg.lock_dir), prober.clone());
    let snap = claims.probe_since(None)?;
    let pool = pool::resolve_for(cfg, &snap)?;
    // Decided by the probe above: this only names it.
    let backend = prober.backend()?;
    // What each GPU is, for the MODEL column: this only describes (a request for a
    // model reads it afresh), so a probe that cannot say leaves it blank.
    let hardware = prober.hardware().unwrap_or_default();
    let dir = LockDir::existing(&cfg.lock_dir);
    let mut rows = Vec::new();
    for g in &snap.gpus {
        let in_pool = pool.iter().any(|p| p.uuid == g.uuid);
        // A slice of a GPU leased whole reads as leased by the GPU's holder.
        let lease = dir
            .state_of(&PoolGpu::of(g))
            .map_err(|source| CapacityError::LockDir {
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
        let verdict = verdict(
            in_pool,
            g.sick.as_deref(),
            holder.is_some(),
            busy.as_deref(),
        );
        let procs: Vec<u32> = snap
            .apps
            .iter()
            .filter(|a| a.gpu_uuid == g.uuid)
            .map(|a| a.pid)
            .collect();
        rows.push(GpuRow {
            gpu: g.clone(),
            model: crate::gpu::model::model_of(&hardware, &g.uuid).map(str::to_string),
            in_pool,
            holder,
            busy,
            verdict,
            procs,
        });
    }
    let fake = crate::gpu::fake::active()
        .and_then(|h| h.ok())
        .map(|h| h.describe());
    Ok(GpuStatus {
        rows,
        lock_dir: cfg.lock_dir.clone(),
        probe: backend,
        fake,
    })
}

/// A GPU's verdict: out of the pool, unhealthy, leased, busy or idle, the first that
/// holds.
fn verdict(in_pool: bool, sick: Option<&str>, leased: bool, busy: Option<&str>) -> String {
    if !in_pool {
        "not in pool".to_string()
    } else if let Some(why) = sick {
        format!("{}: {why}", pool::SICK)
    } else if leased {
        "leased".to_string()
    } else if let Some(r) = busy {
        format!("busy: {r}")
    } else {
        "idle".to_string()
    }
}

impl GpuStatus {
    /// What `--json` prints.
    pub fn to_json(&self) -> serde_json::Value {
        let v: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                let g = &r.gpu;
                json!({
                    "index": g.index, "uuid": g.uuid, "model": r.model,
                    "memory_used_mib": g.memory_used_mib, "memory_total_mib": g.memory_total_mib,
                    "utilization": g.utilization, "processes": r.procs, "in_pool": r.in_pool,
                    "sick": g.sick,
                    "lease_holder": r.holder, "idle": r.busy.is_none(), "verdict": r.verdict,
                    "available": r.in_pool && r.holder.is_none() && r.busy.is_none(),
                })
            })
            .collect();
        json!({"gpus": v, "lock_dir": self.lock_dir, "probe": self.probe, "fake_gpus": self.fake})
    }

    /// The fake GPUs when on, the probe, and one row per GPU.
    pub fn render(&self) -> String {
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
        for r in &self.rows {
            let g = &r.gpu;
            let procs: Vec<String> = r.procs.iter().map(u32::to_string).collect();
            t.row(vec![
                g.index.to_string(),
                g.uuid.clone(),
                r.model
                    .as_deref()
                    .map_or_else(|| "-".into(), |m| crate::util::escape(m).into_owned()),
                format!("{}/{} MiB", g.memory_used_mib, g.memory_total_mib),
                g.utilization
                    .map_or_else(|| "-".into(), |u| format!("{u}%")),
                if procs.is_empty() {
                    "-".into()
                } else {
                    procs.join(",")
                },
                if r.in_pool { "yes" } else { "no" }.into(),
                r.holder.clone().unwrap_or_else(|| "-".into()),
                r.verdict.clone(),
            ]);
        }
        let mut out = String::new();
        if let Some(fake) = &self.fake {
            out.push_str(&format!("{fake}\n"));
        }
        out.push_str(&format!("probe: {}\n", self.probe));
        out.push_str(&t.render());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: u32, verdict: &str, holder: Option<&str>, procs: Vec<u32>) -> GpuRow {
        GpuRow {
            gpu: GpuState {
                index: i,
                uuid: format!("GPU-00000000-0000-0000-0000-00000000000{i}"),
                parent: None,
                memory_used_mib: 512 * i as u64,
                memory_total_mib: 81559,
                utilization: (i != 2).then_some(7 * i),
                sick: None,
            },
            model: (i != 3).then(|| "NVIDIA H100 80GB HBM3".to_string()),
            in_pool: i != 3,
            holder: holder.map(str::to_string),
            busy: None,
            verdict: verdict.into(),
            procs,
        }
    }

    #[test]
    fn a_verdict_takes_the_first_that_holds() {
        assert_eq!(verdict(false, Some("XID 79"), true, None), "not in pool");
        assert!(verdict(true, Some("XID 79"), true, None).ends_with(": XID 79"));
        assert_eq!(verdict(true, None, true, Some("1024 MiB used")), "leased");
        assert_eq!(
            verdict(true, None, false, Some("1024 MiB used")),
            "busy: 1024 MiB used"
        );
        assert_eq!(verdict(true, None, false, None), "idle");
    }

    #[test]
    fn status_renders_one_row_per_gpu() {
        let status = GpuStatus {
            rows: vec![
                row(0, "idle", None, vec![]),
                row(1, "leased", Some("pid 4242 (batch unit)"), vec![4242, 4243]),
                row(2, "busy: 1024 MiB used", None, vec![99]),
                row(3, "not in pool", None, vec![]),
            ],
            lock_dir: PathBuf::from("/run/cibox/locks"),
            probe: "nvidia-smi".into(),
            fake: Some("4 fake NVIDIA GPUs".into()),
        };
        insta::assert_snapshot!("gpu_status_text", status.render());
        insta::assert_snapshot!(
            "gpu_status_json",
            serde_json::to_string_pretty(&status.to_json()).unwrap()
        );
    }
}
