//! `gpu status` and `capacity` on a Slurm login node: what Slurm says of the nodes of
//! the partition cibox submits to.

use serde_json::json;

use super::context::Context;
use crate::console::{self, Table};
use crate::error::Result;
use crate::exit;
use crate::host::SlurmPolicy;
use crate::manifest::Manifest;
use crate::slurm::cluster::{Ask, Cluster, Node};

/// `cibox gpu status` on a login node: each node of the partition cibox submits to,
/// with its GPUs and how many jobs hold, from Slurm.
pub fn gpu_status(ctx: &Context, slurm: &SlurmPolicy) -> Result<u8> {
    let cluster = Cluster::query()?;
    let partition = cluster.partition(slurm.partition.as_deref())?.name.clone();
    let nodes: Vec<&Node> = cluster.nodes_of(&partition).collect();
    if ctx.json {
        let v: Vec<_> = nodes.iter().map(|n| node_json(n)).collect();
        console::json(&json!({"scheduler": "slurm", "partition": partition, "nodes": v}));
        return Ok(exit::SUCCESS);
    }
    let mut t = Table::new(&["NODE", "STATE", "GPUS", "ALLOCATED", "FREE", "REASON"]);
    for n in &nodes {
        t.row(vec![
            n.name.clone(),
            n.state.to_ascii_lowercase(),
            n.gpus.to_string(),
            n.gpus_used.to_string(),
            n.gpus_free().to_string(),
            n.reason.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    println!("scheduler: slurm, partition {partition}");
    print!("{}", t.render());
    Ok(exit::SUCCESS)
}

fn node_json(n: &Node) -> serde_json::Value {
    json!({
        "node": n.name, "state": n.state, "usable": n.usable(), "gpus": n.gpus,
        "allocated": n.gpus_used, "free": n.gpus_free(), "reason": n.reason,
        "partitions": n.partitions,
    })
}

/// One layer's verdict on a Slurm cluster.
pub struct LayerVerdict {
    pub layer: String,
    pub ready: bool,
    pub largest: u32,
    pub reason: Option<String>,
}

/// `cibox capacity` on a login node: whether each layer's batches could each start
/// now on the partition's nodes, from Slurm; the nodes' free GPUs.
pub fn capacity(
    m: &Manifest,
    slurm: &SlurmPolicy,
    layers: &[String],
) -> Result<(Vec<LayerVerdict>, serde_json::Value)> {
    let cluster = Cluster::query()?;
    let partition = cluster.partition(slurm.partition.as_deref())?.name.clone();
    let free = cluster.free_by_node(&partition);
    let verdicts = layers
        .iter()
        .map(|l| {
            let batches = &m.layers[l].batches;
            let waiting: Vec<&String> = batches
                .iter()
                .filter(|b| {
                    let batch = &m.batches[*b];
                    let ask = Ask {
                        batch: b,
                        nodes: batch.nodes,
                        gpus_per_node: batch.gpus,
                    };
                    !cluster.fits_now(&partition, ask)
                })
                .collect();
            let largest = batches.iter().map(|b| m.batches[b].gpus).max().unwrap_or(0);
            LayerVerdict {
                layer: l.clone(),
                ready: waiting.is_empty(),
                largest,
                reason: waiting.first().map(|b| {
                    let batch = &m.batches[*b];
                    format!(
                        "batch {b} needs {} node(s) with {} GPU(s) free; partition {partition} has {free}",
                        batch.nodes, batch.gpus
                    )
                }),
            }
        })
        .collect();
    let nodes: Vec<_> = cluster.nodes_of(&partition).map(node_json).collect();
    let total = |f: fn(&Node) -> u32| cluster.nodes_of(&partition).map(f).sum::<u32>();
    let summary = json!({
        "scheduler": "slurm", "partition": partition, "nodes": nodes,
        "pool": total(|n| n.gpus), "available": total(Node::gpus_free),
        "leased": total(|n| n.gpus_used),
        "busy": total(|n| if n.usable() { 0 } else { n.gpus.saturating_sub(n.gpus_used) }),
    });
    Ok((verdicts, summary))
}
