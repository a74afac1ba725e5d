//! `cibox capacity`: which layers could be admitted right now. Never waits on a lock:
//! one probe, lease states read without blocking, and a verdict per layer.

use serde_json::json;

use super::context::Context;
use crate::claims::ContainerClaims;
use crate::console::{self, Table};
use crate::error::{ErrorKind, Result};
use crate::exit::{self, Failure};
use crate::gpu::lease::LeaseState;
use crate::gpu::model;
use crate::gpu::pool::{self, PoolGpu};
use crate::gpu::probe::{GpuHardware, Prober};
use crate::host::Scheduler;
use crate::lockdir::LockDir;

/// What `capacity` refuses, or finds short.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error("unknown layer `{layer}`; layers: {}", .known.join(", "))]
    UnknownLayer { layer: String, known: Vec<String> },
    /// `--require`: the layer's largest batch needs more GPUs than are free here.
    #[error(
        "layer {layer} cannot be admitted now: needs {}, {available} idle and unleased", crate::util::count(*needs as u64, "GPU")
    )]
    NotAdmitted {
        layer: String,
        needs: u32,
        available: u64,
    },
    /// `--require`: the layer cannot be admitted, for the reason its verdict gives.
    #[error("layer {layer} cannot be admitted now: {reason}")]
    NotAdmittedBecause { layer: String, reason: String },
}

impl ErrorKind for CapacityError {
    fn failure(&self) -> Failure {
        match self {
            CapacityError::UnknownLayer { .. } => Failure::Usage,
            CapacityError::NotAdmitted { .. } | CapacityError::NotAdmittedBecause { .. } => {
                Failure::Capacity
            }
        }
    }
}

pub fn run(
    ctx: &Context,
    layers: &[String],
    require: Option<&str>,
    github_output: bool,
) -> Result<u8> {
    let m = ctx.manifest()?;
    for l in layers.iter().map(String::as_str).chain(require) {
        if !m.layers.contains_key(l) {
            let known: Vec<String> = m.layers.keys().cloned().collect();
            return Err(CapacityError::UnknownLayer {
                layer: l.to_string(),
                known,
            }
            .into());
        }
    }
    let mut outputs = match github_output {
        true => Some(crate::github::Outputs::open()?),
        false => None,
    };
    let chosen: Vec<String> = if layers.is_empty() {
        m.layers.keys().cloned().collect()
    } else {
        layers.to_vec()
    };
    // On a login node, what the cluster has free, from Slurm; else this host's GPUs.
    let policy = ctx.host_policy()?;
    // The layer `--require` names is judged with the others.
    let mut judged = chosen.clone();
    judged.extend(require.map(str::to_string).filter(|r| !chosen.contains(r)));
    let (rows, mut summary) = match &policy.scheduler {
        Scheduler::Slurm(slurm) => {
            let (verdicts, summary) = super::cluster::capacity(&m, slurm, &judged)?;
            let rows = verdicts
                .into_iter()
                .map(|v| Row {
                    layer: v.layer,
                    ready: v.ready,
                    largest: v.largest,
                    reason: v.reason,
                    by_model: false,
                })
                .collect();
            (rows, summary)
        }
        Scheduler::Local => {
            let counts = PoolCounts::now(&m)?;
            let rows: Vec<Row> = judged.iter().map(|name| counts.judge(&m, name)).collect();
            let summary = json!({"pool": counts.pool, "available": counts.available, "leased": counts.leased, "busy": counts.busy, "sick": counts.sick});
            (rows, summary)
        }
    };
    let required = require.map(|req| {
        rows.iter()
            .find(|r| r.layer == req)
            .map(|r| (r.ready, r.largest, r.reason.clone(), r.by_model))
    });
    let rows: Vec<Row> = rows
        .into_iter()
        .filter(|r| chosen.contains(&r.layer))
        .collect();
    if let Some(out) = &mut outputs {
        write_outputs(out, &rows)?;
    }
    if ctx.json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| json!({"layer": r.layer, "ready": r.ready, "largest_batch_gpus": r.largest, "reason": r.reason}))
            .collect();
        summary["layers"] = json!(v);
        console::json(&summary);
    } else {
        let mut t = Table::new(&["LAYER", "READY", "NEEDS", "REASON"]);
        for r in &rows {
            t.row(vec![
                r.layer.clone(),
                if r.ready { "yes" } else { "no" }.into(),
                r.largest.to_string(),
                r.reason.clone().unwrap_or_default(),
            ]);
        }
        print!("{}", t.render());
    }
    // The required layer is judged whether or not --layer listed it.
    if let (Some(req), Some(Some((false, largest, reason, by_model)))) = (require, required) {
        let layer = req.to_string();
        return Err(match summary["available"].as_u64() {
            Some(available) if matches!(policy.scheduler, Scheduler::Local) && !by_model => {
                CapacityError::NotAdmitted {
                    layer,
                    needs: largest,
                    available,
                }
            }
            _ => CapacityError::NotAdmittedBecause {
                layer,
                reason: reason.unwrap_or_default(),
            },
        }
        .into());
    }
    Ok(exit::SUCCESS)
}

/// The pool's GPUs now: leased, busy outside cibox, or available.
struct PoolCounts {
    pool: usize,
    leased: usize,
    busy: usize,
    /// The units the driver reports unhealthy (counted in `busy` too), named with why.
    sick: Vec<String>,
    available: usize,
    /// Each GPU of the pool, and whether it is available.
    gpus: Vec<(PoolGpu, bool)>,
    /// What the GPUs are, read only when a batch asks for a model (or why it could not
    /// be read).
    hardware: std::result::Result<Vec<GpuHardware>, String>,
}

/// One layer's verdict.
struct Row {
    layer: String,
    ready: bool,
    largest: u32,
    reason: Option<String>,
    /// Judged model by model (its batches name GPU models): the pool's count of
    /// available GPUs does not say why.
    by_model: bool,
}

impl PoolCounts {
    /// One probe (a failure is exit 5, never "ready") and lease states read without
    /// blocking.
    fn now(m: &crate::manifest::Manifest) -> Result<PoolCounts> {
        let prober = Prober::new(m.gpu.probe);
        let snap =
            ContainerClaims::new(LockDir::existing(&m.gpu.lock_dir), prober.clone()).probe()?;
        let pool = pool::resolve_for(&m.gpu, &snap)?;
        let dir = LockDir::existing(&m.gpu.lock_dir);
        let models_asked = m.batches.values().any(|b| b.gpu_model.is_some());
        let mut counts = PoolCounts {
            pool: pool.len(),
            leased: 0,
            busy: 0,
            sick: Vec::new(),
            available: 0,
            gpus: Vec::new(),
            hardware: match models_asked {
                true => prober.hardware().map_err(|e| e.to_string()),
                false => Ok(Vec::new()),
            },
        };
        for g in &pool {
            let held = !matches!(dir.state_of(g), Ok(LeaseState::Free));
            let available = if held {
                counts.leased += 1;
                false
            } else if pool::busy_reason(&g.uuid, &snap, &m.gpu.idle).is_some() {
                counts.busy += 1;
                false
            } else {
                counts.available += 1;
                true
            };
            counts.gpus.push((g.clone(), available));
        }
        counts.sick = pool::sick_among(&pool, &snap);
        Ok(counts)
    }

    /// Whether layer `name` could be admitted now: its largest batch fits in what is
    /// available.
    fn judge(&self, m: &crate::manifest::Manifest, name: &str) -> Row {
        let largest = m.layers[name]
            .batches
            .iter()
            .map(|b| m.batches[b].gpus)
            .max()
            .unwrap_or(0);
        if let Some(row) = self.judge_models(m, name, largest) {
            return row;
        }
        let ready = largest as usize <= self.available;
        let reason = if ready {
            None
        } else if largest as usize > self.pool {
            Some(format!(
                "its largest batch needs {}; the pool has {}",
                crate::util::count(largest, "GPU"),
                self.pool
            ))
        } else {
            let sick = match self.sick.as_slice() {
                [] => String::new(),
                named => format!("; unhealthy: {}", named.join("; ")),
            };
            Some(format!(
                "its largest batch needs {}; {} of {} are idle and unleased ({} leased, {} busy){sick}",
                crate::util::count(largest, "GPU"),
                self.available,
                self.pool,
                self.leased,
                self.busy
            ))
        };
        Row {
            layer: name.to_string(),
            ready,
            largest,
            reason,
            by_model: false,
        }
    }
}

impl PoolCounts {
    /// A layer whose batches ask for GPU models: each such batch must fit in the
    /// available GPUs of its model (the others in the available GPUs of any). `None`
    /// when no batch of the layer names a model (the plain verdict then).
    fn judge_models(&self, m: &crate::manifest::Manifest, name: &str, largest: u32) -> Option<Row> {
        let batches = &m.layers[name].batches;
        if !batches
            .iter()
            .any(|b| m.batches[b].gpu_model.is_some() && m.batches[b].gpus > 0)
        {
            return None;
        }
        let pool: Vec<PoolGpu> = self.gpus.iter().map(|(g, _)| g.clone()).collect();
        let mut reason = None;
        for b in batches {
            let batch = &m.batches[b];
            let need = batch.gpus as usize;
            if need == 0 {
                continue;
            }
            let hardware = self.hardware.as_deref().map_err(String::as_str);
            let fits = match model::narrow(&pool, hardware, batch.gpu_model.as_deref(), need) {
                Err(e) => Err(format!("batch {b}: {e}")),
                Ok(of_model) => {
                    let free = self
                        .gpus
                        .iter()
                        .filter(|(g, avail)| *avail && of_model.contains(g))
                        .count();
                    let what = match &batch.gpu_model {
                        Some(glob) => format!(" of model `{}`", crate::util::escape(glob)),
                        None => String::new(),
                    };
                    (need <= free).then_some(()).ok_or_else(|| {
                        format!(
                            "batch {b} needs {}{what}; {free} of {} are idle and unleased",
                            crate::util::count(need as u64, "GPU"),
                            of_model.len()
                        )
                    })
                }
            };
            if let Err(why) = fits {
                reason = Some(why);
                break;
            }
        }
        Some(Row {
            layer: name.to_string(),
            ready: reason.is_none(),
            largest,
            reason,
            by_model: true,
        })
    }
}

/// `<layer>_ready` step outputs, the layer's name kept to what an output name allows.
fn write_outputs(out: &mut crate::github::Outputs, rows: &[Row]) -> Result<()> {
    let keys: Vec<(String, &str)> = rows
        .iter()
        .map(|r| {
            let key: String = r
                .layer
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            (
                format!("{key}_ready"),
                if r.ready { "true" } else { "false" },
            )
        })
        .collect();
    let pairs: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    Ok(out.write(&pairs)?)
}
