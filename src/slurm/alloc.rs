//! On a node, inside a job step: what Slurm allocated to this task, from the `SLURM_*`
//! variables it sets, and the rendezvous of a job on several nodes.
//!
//! GPUs: Slurm gives a step the GPUs of its node by their index in the node's GRES
//! list (`SLURM_STEP_GPUS`; `CUDA_VISIBLE_DEVICES` holds the same indices while no
//! device cgroup renumbers them). With the node's GPUs listed in NVML order (what
//! `AutoDetect=nvml` does, and `/dev/nvidia[0-N]` files do), the index is the GPU's
//! NVML index, which is how cibox names them.

use std::collections::BTreeMap;

use super::{SlurmError, query};

/// The lowest rendezvous port; each job takes its own above it (by job ID), so jobs
/// that share a node do not meet on one port.
const PORT_BASE: u32 = 20000;
const PORT_SPAN: u32 = 20000;

/// What Slurm gave this task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub job_id: String,
    /// This node's name (`SLURMD_NODENAME`).
    pub node: String,
    /// This task's rank among the job's nodes (`SLURM_NODEID`).
    pub rank: u32,
    /// How many nodes the job has (`SLURM_NNODES`).
    pub nodes: u32,
    /// The job's node list, as Slurm writes it (`SLURM_JOB_NODELIST`).
    pub node_list: String,
    /// This node's GPUs, by index in its GRES list.
    pub gpus: Vec<u32>,
}

impl Allocation {
    /// Reads the allocation from `var` (the process environment, or a test's).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Allocation, SlurmError> {
        let need = |name: &str| {
            var(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                SlurmError::Refused(format!(
                    "{name} is not set: this runs only as a task of a Slurm job step (cibox starts it there)"
                ))
            })
        };
        let number = |name: &str| -> Result<u32, SlurmError> {
            need(name)?.parse().map_err(|_| {
                SlurmError::Refused(format!("{name} is not a number as Slurm sets it"))
            })
        };
        let gpus = match var("SLURM_STEP_GPUS")
            .or_else(|| var("SLURM_JOB_GPUS"))
            .or_else(|| var("CUDA_VISIBLE_DEVICES"))
            .filter(|v| !v.is_empty())
        {
            None => Vec::new(),
            Some(list) => parse_indices(&list).ok_or_else(|| {
                SlurmError::Refused(format!(
                    "the GPUs Slurm allocated (`{}`) are not a list of indices",
                    crate::util::escape(&list)
                ))
            })?,
        };
        Ok(Allocation {
            job_id: need("SLURM_JOB_ID")?,
            node: need("SLURMD_NODENAME")?,
            rank: number("SLURM_NODEID")?,
            nodes: number("SLURM_NNODES")?,
            node_list: need("SLURM_JOB_NODELIST")?,
            gpus,
        })
    }

    /// The allocation of this process's job step.
    pub fn current() -> Result<Allocation, SlurmError> {
        Allocation::from_vars(|n| std::env::var(n).ok())
    }

    /// The rendezvous variables of a job on several nodes, as PyTorch's launchers read
    /// them: `MASTER_ADDR` (the first node's address), `MASTER_PORT` (the job's own),
    /// `NODE_RANK`, `NNODES` and `WORLD_SIZE` (one process per GPU).
    pub fn rendezvous(&self, gpus_per_node: u32) -> Result<BTreeMap<String, String>, SlurmError> {
        let hosts = query("scontrol", &["show", "hostnames", &self.node_list])?;
        let first = hosts
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .ok_or_else(|| SlurmError::Unreadable {
                command: format!("scontrol show hostnames {}", self.node_list),
                why: "no node".into(),
            })?;
        let nodes =
            super::cluster::parse_nodes(&query("scontrol", &["show", "node", first, "-o"])?)?;
        let addr = nodes
            .first()
            .map(|n| n.addr.clone())
            .unwrap_or_else(|| first.to_string());
        Ok(rendezvous_vars(&addr, self, gpus_per_node))
    }
}

/// The rendezvous variables, given the first node's address.
pub fn rendezvous_vars(
    master: &str,
    a: &Allocation,
    gpus_per_node: u32,
) -> BTreeMap<String, String> {
    let job: u64 = a.job_id.parse().unwrap_or(0);
    let port = PORT_BASE + (job % u64::from(PORT_SPAN)) as u32;
    BTreeMap::from([
        ("MASTER_ADDR".to_string(), master.to_string()),
        ("MASTER_PORT".to_string(), port.to_string()),
        ("NODE_RANK".to_string(), a.rank.to_string()),
        ("NNODES".to_string(), a.nodes.to_string()),
        (
            "WORLD_SIZE".to_string(),
            (a.nodes * gpus_per_node.max(1)).to_string(),
        ),
    ])
}

/// `0,1,3`: GPU indices. Ranges (`0-3`) are read too.
fn parse_indices(list: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim) {
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1024 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(item.parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(extra: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let mut all: BTreeMap<String, String> = [
            ("SLURM_JOB_ID", "41"),
            ("SLURMD_NODENAME", "n2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_NNODES", "2"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, v) in extra {
            all.insert(k.to_string(), v.to_string());
        }
        move |n| all.get(n).cloned()
    }

    #[test]
    fn the_allocation_comes_from_slurms_variables() {
        let a = Allocation::from_vars(vars(&[
            ("SLURM_STEP_GPUS", "2,3"),
            ("CUDA_VISIBLE_DEVICES", "0,1"),
        ]))
        .unwrap();
        assert_eq!(
            a.gpus,
            [2, 3],
            "the node's indices, not the renumbered ones"
        );
        assert_eq!((a.rank, a.nodes, a.node.as_str()), (1, 2, "n2"));
        let env = rendezvous_vars("10.0.0.1", &a, 4);
        assert_eq!(env["MASTER_ADDR"], "10.0.0.1");
        assert_eq!(env["MASTER_PORT"], "20041");
        assert_eq!(env["WORLD_SIZE"], "8");
        assert_eq!(env["NODE_RANK"], "1");
        let none = Allocation::from_vars(vars(&[])).unwrap();
        assert!(none.gpus.is_empty());
        assert!(Allocation::from_vars(vars(&[("SLURM_STEP_GPUS", "0,x")])).is_err());
        assert!(Allocation::from_vars(|_| None).is_err());
        assert_eq!(parse_indices("0-2,5"), Some(vec![0, 1, 2, 5]));
    }
}
