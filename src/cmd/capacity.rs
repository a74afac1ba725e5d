//! `cibox capacity`: which layers could be admitted right now. Never waits on a lock:
//! one probe, lease states read without blocking, and a verdict per layer.

use serde_json::json;

use super::Context;
use crate::claims::ContainerClaims;
use crate::error::{Error, Result};
use crate::exit;
use crate::gpu::lease::LeaseState;
use crate::gpu::pool;
use crate::gpu::probe::Prober;
use crate::lockdir::LockDir;
use crate::report::{self, Table};

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
            return Err(Error::Usage(format!(
                "unknown layer `{l}`; layers: {}",
                known.join(", ")
            )));
        }
    }
    let mut outputs = match github_output {
        true => Some(crate::github::Outputs::open().map_err(Error::Usage)?),
        false => None,
    };
    let chosen: Vec<String> = if layers.is_empty() {
        m.layers.keys().cloned().collect()
    } else {
        layers.to_vec()
    };
    // A probe failure is exit 5, never "ready".
    let prober = Prober::new(m.gpu.probe);
    let snap = ContainerClaims::new(LockDir::existing(&m.gpu.lock_dir), prober).probe()?;
    let pool = pool::resolve(&m.gpu.pool, &snap).map_err(Error::Usage)?;
    let dir = LockDir::existing(&m.gpu.lock_dir);
    let mut leased = 0;
    let mut busy = 0;
    let mut available = 0;
    for g in &pool {
        let held = !matches!(dir.state(&g.uuid), Ok(LeaseState::Free));
        if held {
            leased += 1;
        } else if pool::busy_reason(&g.uuid, &snap, &m.gpu.idle).is_some() {
            busy += 1;
        } else {
            available += 1;
        }
    }
    let mut rows = Vec::new();
    for name in &chosen {
        let layer = &m.layers[name];
        let largest = layer
            .batches
            .iter()
            .map(|b| m.batches[b].gpus)
            .max()
            .unwrap_or(0);
        let ready = largest as usize <= available;
        let reason = if ready {
            None
        } else if largest as usize > pool.len() {
            Some(format!(
                "its largest batch needs {largest} GPUs; the pool has {}",
                pool.len()
            ))
        } else {
            Some(format!(
                "its largest batch needs {largest} GPUs; {available} of {} are idle and unleased ({leased} leased, {busy} busy)",
                pool.len()
            ))
        };
        rows.push((name.clone(), ready, largest, reason));
    }
    if let Some(out) = &mut outputs {
        let keys: Vec<(String, &str)> = rows
            .iter()
            .map(|(name, ready, _, _)| {
                let key: String = name
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
                    if *ready { "true" } else { "false" },
                )
            })
            .collect();
        let pairs: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        out.write(&pairs).map_err(Error::Infra)?;
    }
    if ctx.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(n, r, l, why)| json!({"layer": n, "ready": r, "largest_batch_gpus": l, "reason": why}))
            .collect();
        report::json(
            &json!({"pool": pool.len(), "available": available, "leased": leased, "busy": busy, "layers": v}),
        );
    } else {
        let mut t = Table::new(&["LAYER", "READY", "NEEDS", "REASON"]);
        for (n, r, l, why) in &rows {
            t.row(vec![
                n.clone(),
                if *r { "yes" } else { "no" }.into(),
                l.to_string(),
                why.clone().unwrap_or_default(),
            ]);
        }
        print!("{}", t.render());
    }
    // The required layer is judged whether or not --layer listed it.
    if let Some(req) = require {
        let largest = m.layers[req]
            .batches
            .iter()
            .map(|b| m.batches[b].gpus)
            .max()
            .unwrap_or(0);
        if largest as usize > available {
            return Err(Error::Capacity(format!(
                "layer {req} cannot be admitted now: needs {largest} GPUs, {available} idle and unleased"
            )));
        }
    }
    Ok(exit::SUCCESS)
}
