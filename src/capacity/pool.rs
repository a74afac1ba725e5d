//! This host's pool now (one probe, lease states read without blocking), and each
//! layer's verdict on it.

use crate::claims::ContainerClaims;
use crate::error::Result;
use crate::gpu::lease::LeaseState;
use crate::gpu::model;
use crate::gpu::pool::{self, PoolGpu};
use crate::gpu::probe::{GpuHardware, Prober};
use crate::lockdir::LockDir;

/// The pool's GPUs now: leased, busy outside cibox, or available.
pub struct PoolCounts {
    pub pool: usize,
    pub leased: usize,
    pub busy: usize,
    /// The units the driver reports unhealthy (counted in `busy` too), named with why.
    pub sick: Vec<String>,
    pub available: usize,
    /// Each GPU of the pool, and whether it is available.
    gpus: Vec<(PoolGpu, bool)>,
    /// What the GPUs are, read only when a batch asks for a model (or why it could not
    /// be read).
    hardware: std::result::Result<Vec<GpuHardware>, String>,
}

/// One layer's verdict.
#[derive(Debug, Clone)]
pub struct Row {
    pub layer: String,
    pub ready: bool,
    pub largest: u32,
    pub reason: Option<String>,
    /// Judged model by model (its batches name GPU models): the pool's count of
    /// available GPUs does not say why.
    pub by_model: bool,
}

impl PoolCounts {
    /// One probe (a failure is exit 5, never "ready") and lease states read without
    /// blocking.
    pub fn now(m: &crate::manifest::Manifest) -> Result<PoolCounts> {
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
    pub fn judge(&self, m: &crate::manifest::Manifest, name: &str) -> Row {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> crate::manifest::Manifest {
        let text = "version: 1\nproject: demo\nimage: {locks: []}\ndefaults: {timeout: 5m}\nbatches:\n  unit: {gpus: 0, run: ['true']}\n  two: {gpus: 2, run: ['true']}\n  eight: {gpus: 8, run: ['true']}\nlayers:\n  \"1\": {batches: [unit]}\n  \"2\": {batches: [unit, two]}\n  \"3\": {batches: [eight]}\n";
        crate::manifest::Manifest::parse(text, std::path::Path::new("cibox.yaml")).unwrap()
    }

    fn counts(available: usize, leased: usize, busy: usize, sick: &[&str]) -> PoolCounts {
        PoolCounts {
            pool: 4,
            leased,
            busy,
            sick: sick.iter().map(|s| s.to_string()).collect(),
            available,
            gpus: Vec::new(),
            hardware: Ok(Vec::new()),
        }
    }

    #[test]
    fn a_layer_is_ready_when_its_largest_batch_fits_in_what_is_available() {
        let m = manifest();
        let c = counts(2, 1, 1, &[]);
        let cpu = c.judge(&m, "1");
        assert!(cpu.ready && cpu.reason.is_none());
        let two = c.judge(&m, "2");
        assert!(two.ready, "{:?}", two.reason);
        assert_eq!(two.largest, 2);
        let short = counts(1, 2, 1, &["GPU-3: XID 79"]).judge(&m, "2");
        assert!(!short.ready);
        assert_eq!(
            short.reason.unwrap(),
            "its largest batch needs 2 GPUs; 1 of 4 are idle and unleased (2 leased, 1 busy); unhealthy: GPU-3: XID 79"
        );
        let never = c.judge(&m, "3");
        assert_eq!(
            never.reason.unwrap(),
            "its largest batch needs 8 GPUs; the pool has 4"
        );
    }
}
