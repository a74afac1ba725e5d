//! The GPUs CI may use, and whether each is idle right now.

use super::probe::{GpuState, Snapshot};
use crate::exit::Failure;
use crate::manifest::{GpuConfig, IdlePolicy, PoolSpec};

/// A unit of the pool, as the probe names it: a GPU, or a MIG slice of one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolGpu {
    /// The GPU's index (a slice has its GPU's).
    pub index: u32,
    pub uuid: String,
    /// For a MIG slice, its GPU's UUID: a lease of the slice keeps the GPU from being
    /// leased whole, and the reverse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

impl PoolGpu {
    /// The unit a probe shows.
    pub fn of(g: &GpuState) -> PoolGpu {
        PoolGpu {
            index: g.index,
            uuid: g.uuid.clone(),
            parent: g.parent.clone(),
        }
    }

    /// How messages name it: `GPU 3`, or `GPU 3 slice MIG-…` for a MIG slice.
    pub fn label(&self) -> String {
        match self.parent {
            None => format!("GPU {}", self.index),
            Some(_) => format!("GPU {} slice {}", self.index, self.uuid),
        }
    }
}

/// Why a pool (the project's, or the host policy's) cannot be resolved against a probe:
/// a configuration error.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(
        "GPU pool entry `{item}` is not a GPU on this host (the GPU probe shows {})",
        shown(.probed)
    )]
    NotOnHost {
        item: String,
        /// The indices of the GPUs the probe shows.
        probed: Vec<u32>,
    },
    #[error("GPU pool names {uuid} twice (as `{item}`)")]
    Twice { uuid: String, item: String },
    /// The host policy's own pool cannot be resolved.
    #[error("the host policy's gpu.pool: {0}")]
    HostPool(#[source] Box<PoolError>),
    #[error(
        "GPU {index} ({uuid}) is not in this host's pool (the host policy's gpu.pool: {host}); choose among those"
    )]
    OutsideHostPool {
        index: u32,
        uuid: String,
        host: PoolSpec,
    },
}

impl crate::error::ErrorKind for PoolError {
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}

/// Resolves the pool against a probe: `all`, or each index/UUID to the units the probe
/// shows (an index names a GPU, or, in MIG mode, all its slices; a UUID one GPU or one
/// slice). An entry the probe does not know is a configuration error.
pub fn resolve(spec: &PoolSpec, snapshot: &Snapshot) -> Result<Vec<PoolGpu>, PoolError> {
    let mut gpus: Vec<PoolGpu> = match spec {
        PoolSpec::All => snapshot.gpus.iter().map(PoolGpu::of).collect(),
        PoolSpec::Devices(items) => {
            let mut out = Vec::new();
            for item in items {
                let named: Vec<&GpuState> = snapshot
                    .gpus
                    .iter()
                    .filter(|g| {
                        g.uuid == *item
                            || g.parent.as_deref() == Some(item.as_str())
                            || g.index.to_string() == *item
                    })
                    .collect();
                if named.is_empty() {
                    let mut probed: Vec<u32> = snapshot.gpus.iter().map(|g| g.index).collect();
                    probed.dedup();
                    return Err(PoolError::NotOnHost {
                        item: item.clone(),
                        probed,
                    });
                }
                for g in named {
                    if out.iter().any(|p: &PoolGpu| p.uuid == g.uuid) {
                        return Err(PoolError::Twice {
                            uuid: g.uuid.clone(),
                            item: item.clone(),
                        });
                    }
                    out.push(PoolGpu::of(g));
                }
            }
            out
        }
    };
    // Stable: a GPU's slices keep the driver's order.
    gpus.sort_by_key(|g| g.index);
    Ok(gpus)
}

/// Resolves `cfg`'s pool as [`resolve`] does, and refuses a GPU outside the host's pool
/// (the host policy's `gpu.pool`) when it has one: a project may narrow the host's pool,
/// never widen it.
pub fn resolve_for(cfg: &GpuConfig, snapshot: &Snapshot) -> Result<Vec<PoolGpu>, PoolError> {
    let gpus = resolve(&cfg.pool, snapshot)?;
    if let Some(host) = &cfg.host_pool {
        let allowed = resolve(host, snapshot).map_err(|e| PoolError::HostPool(Box::new(e)))?;
        if let Some(g) = gpus
            .iter()
            .find(|g| !allowed.iter().any(|a| a.uuid == g.uuid))
        {
            return Err(PoolError::OutsideHostPool {
                index: g.index,
                uuid: g.uuid.clone(),
                host: host.clone(),
            });
        }
    }
    Ok(gpus)
}

/// The GPUs a probe shows, by index: `indices 0,1`, or `no GPU`.
fn shown(indices: &[u32]) -> String {
    if indices.is_empty() {
        return "no GPU".into();
    }
    let idx: Vec<String> = indices.iter().map(u32::to_string).collect();
    format!("indices {}", idx.join(","))
}

/// How a busy verdict of a unit the driver reports unhealthy begins.
pub const SICK: &str = "unhealthy";

/// The units of `units` the driver reports unhealthy, with why (`GPU 3: 2 uncorrected
/// ECC errors …`), for a refusal that names them.
pub fn sick_among(units: &[PoolGpu], snapshot: &Snapshot) -> Vec<String> {
    units
        .iter()
        .filter_map(|u| {
            let g = snapshot.gpus.iter().find(|g| g.uuid == u.uuid)?;
            g.sick
                .as_ref()
                .map(|why| format!("{} ({}): {why}", u.label(), u.uuid))
        })
        .collect()
}

/// Why a GPU is not idle, or `None` when it is: healthy, no compute process, memory
/// used and utilisation within the policy.
pub fn busy_reason(uuid: &str, snapshot: &Snapshot, policy: &IdlePolicy) -> Option<String> {
    let Some(g) = snapshot.gpus.iter().find(|g| g.uuid == uuid) else {
        return Some("not reported by the GPU probe".into());
    };
    if let Some(why) = &g.sick {
        return Some(format!("{SICK}: {why}"));
    }
    if let Some((_, by)) = snapshot.claimed.iter().find(|(u, _)| u == uuid) {
        return Some(format!("used by {by}"));
    }
    // A process named by a slice's GPU (nvidia-smi cannot tell which slice it runs
    // in) keeps every slice of it busy.
    let procs: Vec<String> = snapshot
        .apps
        .iter()
        .filter(|a| a.gpu_uuid == uuid || g.parent.as_ref() == Some(&a.gpu_uuid))
        .map(|a| a.pid.to_string())
        .collect();
    if !procs.is_empty() {
        return Some(format!("compute process {}", procs.join(",")));
    }
    if g.memory_used_mib > policy.max_memory_mib {
        return Some(format!(
            "{} MiB used > {} MiB",
            g.memory_used_mib, policy.max_memory_mib
        ));
    }
    match g.utilization {
        Some(u) if u > policy.max_utilization => {
            Some(format!("utilization {u}% > {}%", policy.max_utilization))
        }
        Some(_) => None,
        // Only a MIG slice has none: the driver reports none in MIG mode, and its
        // processes and memory judged it above. Anything else cannot be told idle.
        None if g.parent.is_some() => None,
        None => Some("utilization not reported".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::probe::reading::ComputeApp;

    fn snap() -> Snapshot {
        let g = |i: u32, used, util| GpuState {
            index: i,
            uuid: format!("GPU-00000000-0000-0000-0000-00000000000{i}"),
            parent: None,
            memory_used_mib: used,
            memory_total_mib: 81559,
            utilization: Some(util),
            sick: None,
        };
        Snapshot {
            gpus: vec![g(0, 0, 0), g(1, 1024, 0), g(2, 0, 40), g(3, 3, 0)],
            apps: vec![ComputeApp {
                gpu_uuid: "GPU-00000000-0000-0000-0000-000000000003".into(),
                pid: 77,
                used_memory_mib: 3,
            }],
            claimed: Vec::new(),
        }
    }

    #[test]
    fn idle_verdicts() {
        let s = snap();
        let p = IdlePolicy::default();
        let uuid = |i: usize| s.gpus[i].uuid.clone();
        assert_eq!(busy_reason(&uuid(0), &s, &p), None);
        assert!(busy_reason(&uuid(1), &s, &p).unwrap().contains("1024 MiB"));
        assert!(
            busy_reason(&uuid(2), &s, &p)
                .unwrap()
                .contains("utilization 40%")
        );
        assert!(
            busy_reason(&uuid(3), &s, &p)
                .unwrap()
                .contains("compute process 77")
        );
        // A sick unit is out, however idle it reads.
        let first = uuid(0);
        let mut s = s;
        s.gpus[0].sick = Some("2 uncorrected ECC errors since the driver loaded".into());
        assert_eq!(
            busy_reason(&first, &s, &p).unwrap(),
            "unhealthy: 2 uncorrected ECC errors since the driver loaded"
        );
        let units: Vec<PoolGpu> = s.gpus.iter().map(PoolGpu::of).collect();
        let said = sick_among(&units, &s);
        assert_eq!(said.len(), 1);
        assert!(said[0].starts_with("GPU 0 (GPU-"), "{said:?}");
    }

    #[test]
    fn pool_resolution() {
        let s = snap();
        assert_eq!(resolve(&PoolSpec::All, &s).unwrap().len(), 4);
        let spec = PoolSpec::Devices(vec![
            "2".into(),
            "GPU-00000000-0000-0000-0000-000000000000".into(),
        ]);
        let p = resolve(&spec, &s).unwrap();
        assert_eq!(p.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(
            resolve(&PoolSpec::Devices(vec!["9".into()]), &s)
                .unwrap_err()
                .to_string(),
            "GPU pool entry `9` is not a GPU on this host (the GPU probe shows indices 0,1,2,3)"
        );
        let dup = PoolSpec::Devices(vec![
            "0".into(),
            "GPU-00000000-0000-0000-0000-000000000000".into(),
        ]);
        assert!(matches!(
            resolve(&dup, &s),
            Err(PoolError::Twice { item, .. }) if item == "GPU-00000000-0000-0000-0000-000000000000"
        ));
    }
}
