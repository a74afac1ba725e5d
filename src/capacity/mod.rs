//! What this host's GPUs, or the Slurm partition cibox submits to, can take now
//! (`cibox capacity`): which layers could be admitted, never waiting on a lock: one
//! probe, lease states read without blocking, and a verdict per layer.
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - [`pool`]: this host's pool now, and each layer's verdict on it;
//! - [`cluster`]: a Slurm partition's nodes, and each layer's verdict on them;
//! - [`status`]: each GPU now (`gpu status`).

pub mod cluster;
pub mod pool;
pub mod status;

use serde_json::json;

use crate::console::Table;
use crate::error::{ErrorKind, Result};
use crate::exit::Failure;
use crate::host::{HostPolicy, Scheduler};
use crate::manifest::Manifest;
use pool::{PoolCounts, Row};

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
    /// A GPU's lock file could not be read.
    #[error("lock dir {}: {source}", .dir.display())]
    LockDir {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ErrorKind for CapacityError {
    fn failure(&self) -> Failure {
        match self {
            CapacityError::UnknownLayer { .. } => Failure::Usage,
            CapacityError::LockDir { .. } => Failure::Infra,
            CapacityError::NotAdmitted { .. } | CapacityError::NotAdmittedBecause { .. } => {
                Failure::Capacity
            }
        }
    }
}

/// The layers `cibox capacity` judges: `layers` (all of the manifest's when empty), and
/// the one `--require` names; an unknown one is refused.
pub struct Asked<'a> {
    pub layers: &'a [String],
    pub require: Option<&'a str>,
}

impl Asked<'_> {
    /// Refuses a layer the manifest does not have.
    pub fn check(&self, m: &Manifest) -> Result<()> {
        for l in self.layers.iter().map(String::as_str).chain(self.require) {
            if !m.layers.contains_key(l) {
                let known: Vec<String> = m.layers.keys().cloned().collect();
                return Err(CapacityError::UnknownLayer {
                    layer: l.to_string(),
                    known,
                }
                .into());
            }
        }
        Ok(())
    }
}

/// The verdicts: one row per layer asked for, what the pool (or partition) holds, and
/// the verdict on the layer `--require` names.
pub struct Capacity {
    pub rows: Vec<Row>,
    summary: serde_json::Value,
    required: Option<Row>,
    local: bool,
}

/// Judges each layer asked for: on a login node against what the cluster has free,
/// from Slurm; else against this host's GPUs.
pub fn judge(m: &Manifest, policy: &HostPolicy, asked: &Asked) -> Result<Capacity> {
    let chosen: Vec<String> = if asked.layers.is_empty() {
        m.layers.keys().cloned().collect()
    } else {
        asked.layers.to_vec()
    };
    // The layer `--require` names is judged with the others.
    let mut judged = chosen.clone();
    judged.extend(
        asked
            .require
            .map(str::to_string)
            .filter(|r| !chosen.contains(r)),
    );
    let (rows, summary) = match &policy.scheduler {
        Scheduler::Slurm(slurm) => cluster::capacity(m, slurm, &judged)?,
        Scheduler::Local => {
            let counts = PoolCounts::now(m)?;
            let rows: Vec<Row> = judged.iter().map(|name| counts.judge(m, name)).collect();
            let summary = json!({"pool": counts.pool, "available": counts.available, "leased": counts.leased, "busy": counts.busy, "sick": counts.sick});
            (rows, summary)
        }
    };
    let required = asked
        .require
        .and_then(|req| rows.iter().find(|r| r.layer == req).cloned());
    let rows = rows
        .into_iter()
        .filter(|r| chosen.contains(&r.layer))
        .collect();
    Ok(Capacity {
        rows,
        summary,
        required,
        local: matches!(policy.scheduler, Scheduler::Local),
    })
}

impl Capacity {
    /// What `--json` prints.
    pub fn to_json(&self) -> serde_json::Value {
        let v: Vec<_> = self
            .rows
            .iter()
            .map(|r| json!({"layer": r.layer, "ready": r.ready, "largest_batch_gpus": r.largest, "reason": r.reason}))
            .collect();
        let mut summary = self.summary.clone();
        summary["layers"] = json!(v);
        summary
    }

    /// One row per layer: ready or not, the GPUs its largest batch needs, and why not.
    pub fn render(&self) -> String {
        let mut t = Table::new(&["LAYER", "READY", "NEEDS", "REASON"]);
        for r in &self.rows {
            t.row(vec![
                r.layer.clone(),
                if r.ready { "yes" } else { "no" }.into(),
                r.largest.to_string(),
                r.reason.clone().unwrap_or_default(),
            ]);
        }
        t.render()
    }

    /// The `<layer>_ready` step outputs.
    pub fn outputs(&self) -> Vec<(String, &'static str)> {
        outputs(&self.rows)
    }

    /// The layer `--require` names, refused (exit 4) unless it could be admitted now.
    pub fn required_admitted(&self) -> Result<()> {
        let Some(r) = self.required.as_ref().filter(|r| !r.ready) else {
            return Ok(());
        };
        let layer = r.layer.clone();
        Err(match self.summary["available"].as_u64() {
            Some(available) if self.local && !r.by_model => CapacityError::NotAdmitted {
                layer,
                needs: r.largest,
                available,
            },
            _ => CapacityError::NotAdmittedBecause {
                layer,
                reason: r.reason.clone().unwrap_or_default(),
            },
        }
        .into())
    }
}

/// `<layer>_ready` step outputs, the layer's name kept to what an output name allows.
fn outputs(rows: &[Row]) -> Vec<(String, &'static str)> {
    rows.iter()
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
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(layer: &str, ready: bool) -> Row {
        Row {
            layer: layer.into(),
            ready,
            largest: 4,
            reason: (!ready).then(|| "its largest batch needs 4 GPUs; the pool has 2".into()),
            by_model: false,
        }
    }

    #[test]
    fn outputs_keep_a_layers_name_to_what_an_output_name_allows() {
        let rows = [row("gpu.h100 x", true), row("nightly", false)];
        assert_eq!(
            outputs(&rows),
            [
                ("gpu_h100_x_ready".to_string(), "true"),
                ("nightly_ready".to_string(), "false")
            ]
        );
    }

    #[test]
    fn a_required_layer_that_cannot_be_admitted_is_capacity() {
        let verdicts = Capacity {
            rows: vec![row("1", true), row("3", false)],
            summary: json!({"pool": 2, "available": 2, "leased": 0, "busy": 0, "sick": []}),
            required: Some(row("3", false)),
            local: true,
        };
        let e = verdicts.required_admitted().unwrap_err();
        assert_eq!(e.exit_code(), crate::exit::CAPACITY);
        assert_eq!(
            e.to_string(),
            "layer 3 cannot be admitted now: needs 4 GPUs, 2 idle and unleased"
        );
        insta::assert_snapshot!("capacity_text", verdicts.render());
        insta::assert_snapshot!(
            "capacity_json",
            serde_json::to_string_pretty(&verdicts.to_json()).unwrap()
        );
        let ready = Capacity {
            required: Some(row("1", true)),
            ..verdicts
        };
        assert!(ready.required_admitted().is_ok());
    }
}
