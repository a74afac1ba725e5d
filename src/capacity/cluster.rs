//! A Slurm partition's nodes, from Slurm, and each layer's verdict on them: on a login
//! node the cluster's nodes run the batches.

use serde_json::json;

use super::pool::Row;
use crate::console::Table;
use crate::error::Result;
use crate::host::SlurmPolicy;
use crate::manifest::Manifest;
use crate::slurm::cluster::{Ask, Cluster, Node};

/// A node, as `--json` shows it.
pub fn node_json(n: &Node) -> serde_json::Value {
    json!({
        "node": n.name, "state": n.state, "usable": n.usable(), "gpus": n.gpus,
        "allocated": n.gpus_used, "free": n.gpus_free(), "reason": n.reason,
        "partitions": n.partitions,
    })
}

/// On a login node: whether each layer's batches could each start
/// now on the partition's nodes, from Slurm; the nodes' free GPUs.
pub fn capacity(
    m: &Manifest,
    slurm: &SlurmPolicy,
    layers: &[String],
) -> Result<(Vec<Row>, serde_json::Value)> {
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
            Row {
                layer: l.clone(),
                by_model: false,
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

/// `gpu status` on a login node: each node of the partition cibox submits to, with its
/// GPUs and how many jobs hold, from Slurm.
pub struct Nodes {
    pub partition: String,
    pub nodes: Vec<Node>,
}

impl Nodes {
    /// What Slurm says now.
    pub fn query(slurm: &SlurmPolicy) -> Result<Nodes> {
        let cluster = Cluster::query()?;
        let partition = cluster.partition(slurm.partition.as_deref())?.name.clone();
        let nodes = cluster.nodes_of(&partition).cloned().collect();
        Ok(Nodes { partition, nodes })
    }

    /// What `--json` prints.
    pub fn to_json(&self) -> serde_json::Value {
        let v: Vec<_> = self.nodes.iter().map(node_json).collect();
        json!({"scheduler": "slurm", "partition": self.partition, "nodes": v})
    }

    /// The partition, and one row per node.
    pub fn render(&self) -> String {
        let mut t = Table::new(&["NODE", "STATE", "GPUS", "ALLOCATED", "FREE", "REASON"]);
        for n in &self.nodes {
            t.row(vec![
                n.name.clone(),
                n.state.to_ascii_lowercase(),
                n.gpus.to_string(),
                n.gpus_used.to_string(),
                n.gpus_free().to_string(),
                n.reason.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        format!(
            "scheduler: slurm, partition {}\n{}",
            self.partition,
            t.render()
        )
    }
}
