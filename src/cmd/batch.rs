//! `cibox batch …`.

use serde_json::json;

use super::Context;
use crate::error::Result;
use crate::exit;
use crate::report::{self, Table};

/// `cibox batch list`: batches (name, GPUs, timeout, description) and layers.
pub fn list(ctx: &Context) -> Result<u8> {
    let m = ctx.manifest()?;
    if ctx.json {
        let batches: Vec<_> = m
            .batches
            .iter()
            .map(|(name, b)| {
                json!({
                    "name": name,
                    "gpus": b.gpus,
                    "timeout": b.timeout.to_string(),
                    "timeout_s": b.timeout.0.as_secs(),
                    "description": b.description,
                    "allow_empty": b.allow_empty,
                })
            })
            .collect();
        let layers: Vec<_> = m
            .layers
            .iter()
            .map(|(name, l)| {
                json!({"name": name, "fast": l.fast, "batches": l.batches, "description": l.description})
            })
            .collect();
        report::json(&json!({"project": m.project, "batches": batches, "layers": layers}));
        return Ok(exit::SUCCESS);
    }
    let mut t = Table::new(&["BATCH", "GPUS", "TIMEOUT", "DESCRIPTION"]);
    for (name, b) in &m.batches {
        t.row(vec![
            name.clone(),
            b.gpus.to_string(),
            b.timeout.to_string(),
            b.description.clone().unwrap_or_default(),
        ]);
    }
    print!("{}", t.render());
    if !m.layers.is_empty() {
        println!();
        let mut t = Table::new(&["LAYER", "FAST", "BATCHES"]);
        for (name, l) in &m.layers {
            let batches = if l.all {
                format!("all ({})", l.batches.join(", "))
            } else {
                l.batches.join(", ")
            };
            t.row(vec![
                name.clone(),
                if l.fast { "yes" } else { "no" }.into(),
                batches,
            ]);
        }
        print!("{}", t.render());
    }
    Ok(exit::SUCCESS)
}
