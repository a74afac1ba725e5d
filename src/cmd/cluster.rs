//! `gpu status` on a Slurm login node: what Slurm says of the nodes of the partition
//! cibox submits to.

use serde_json::json;

use super::context::Context;
use crate::console::{self, Table};
use crate::error::Result;
use crate::exit;
use crate::host::SlurmPolicy;
use crate::capacity::cluster::node_json;
use crate::slurm::cluster::{Cluster, Node};

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
