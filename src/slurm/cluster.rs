//! The cluster as Slurm's controller sees it: each node's state and GPUs
//! (`scontrol show node -o`), each partition (`scontrol show partition -o`), and
//! whether a batch could ever run in a partition ([`Cluster::check`]).

use super::{SlurmError, key_values, query};

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Node {
    pub name: String,
    /// Where other nodes reach it (`NodeAddr`).
    pub addr: String,
    /// Slurm's state, as it writes it (`IDLE`, `MIXED`, `ALLOCATED`, `DOWN*`,
    /// `IDLE+DRAIN`, …).
    pub state: String,
    pub partitions: Vec<String>,
    /// GPUs by GRES (`Gres=gpu:4`, `gpu:a100:2,gpu:v100:2`).
    pub gpus: u32,
    /// GPUs allocated to jobs now (`GresUsed`).
    pub gpus_used: u32,
    /// Why it is down or drained, when Slurm says.
    pub reason: Option<String>,
}

impl Node {
    /// Whether it can take jobs now or later: not down, drained, failing or unanswering.
    pub fn usable(&self) -> bool {
        let s = self.state.to_ascii_uppercase();
        !s.ends_with('*')
            && ![
                "DOWN",
                "DRAIN",
                "FAIL",
                "NOT_RESPONDING",
                "FUTURE",
                "POWER",
                "UNKNOWN",
            ]
            .iter()
            .any(|bad| s.contains(bad))
    }

    /// GPUs no job holds, on a usable node.
    pub fn gpus_free(&self) -> u32 {
        if self.usable() {
            self.gpus.saturating_sub(self.gpus_used)
        } else {
            0
        }
    }
}

/// One partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    /// `UP`, `DOWN`, `DRAIN`, `INACTIVE`.
    pub state: String,
    pub default: bool,
    /// The most nodes a job may have; `None`: unlimited.
    pub max_nodes: Option<u32>,
}

/// The cluster's nodes and partitions, as read at one moment.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub partitions: Vec<Partition>,
}

/// What a batch asks of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub batch: &'a str,
    pub nodes: u32,
    pub gpus_per_node: u32,
}

impl Cluster {
    /// Asks the controller.
    pub fn query() -> Result<Cluster, SlurmError> {
        let partitions = parse_partitions(&query("scontrol", &["show", "partition", "-o"])?);
        // `-d`: with what jobs hold (`GresUsed`).
        let nodes = parse_nodes(&query("scontrol", &["show", "node", "-d", "-o"])?)?;
        Ok(Cluster { nodes, partitions })
    }

    /// The partition jobs go to: `name`, else the cluster's default one.
    pub fn partition(&self, name: Option<&str>) -> Result<&Partition, SlurmError> {
        let found = match name {
            Some(n) => self.partitions.iter().find(|p| p.name == n),
            None => self.partitions.iter().find(|p| p.default),
        };
        found.ok_or_else(|| {
            let known: Vec<&str> = self.partitions.iter().map(|p| p.name.as_str()).collect();
            SlurmError::Refused(match name {
                Some(n) => format!(
                    "the host policy's slurm.partition `{n}` is not a partition of this cluster (its partitions: {})",
                    known.join(", ")
                ),
                None => format!(
                    "this cluster has no default partition; set slurm.partition in the host policy (its partitions: {})",
                    known.join(", ")
                ),
            })
        })
    }

    /// The nodes of partition `name`.
    pub fn nodes_of<'c>(&'c self, partition: &'c str) -> impl Iterator<Item = &'c Node> + 'c {
        self.nodes
            .iter()
            .filter(move |n| n.partitions.iter().any(|p| p == partition))
    }

    /// Refuses, before anything is submitted, a batch that could never run in
    /// `partition`: more GPUs than any of its nodes has, more nodes than it has (or
    /// allows a job).
    pub fn check(&self, partition: &Partition, ask: Ask<'_>) -> Result<(), SlurmError> {
        if partition.state != "UP" {
            return Err(SlurmError::Refused(format!(
                "Slurm partition `{}` is {}: it takes no jobs",
                partition.name, partition.state
            )));
        }
        let nodes: Vec<&Node> = self.nodes_of(&partition.name).collect();
        let fitting = nodes.iter().filter(|n| n.gpus >= ask.gpus_per_node).count();
        if fitting == 0 {
            let most = nodes.iter().map(|n| n.gpus).max().unwrap_or(0);
            return Err(SlurmError::Lacks(format!(
                "batch {} needs {} GPU(s) on a node; no node of Slurm partition `{}` has that many (the most: {most})",
                ask.batch, ask.gpus_per_node, partition.name
            )));
        }
        let limit = partition
            .max_nodes
            .map_or(fitting, |m| fitting.min(m as usize));
        if ask.nodes as usize > limit {
            return Err(SlurmError::Lacks(format!(
                "batch {} needs {} node(s) with {} GPU(s) each; Slurm partition `{}` has {limit}",
                ask.batch, ask.nodes, ask.gpus_per_node, partition.name
            )));
        }
        Ok(())
    }
}

impl Cluster {
    /// Whether `ask` could start now in `partition`: enough usable nodes with that many
    /// GPUs free.
    pub fn fits_now(&self, partition: &str, ask: Ask<'_>) -> bool {
        self.nodes_of(partition)
            .filter(|n| n.usable() && n.gpus_free() >= ask.gpus_per_node)
            .count()
            >= ask.nodes as usize
    }

    /// `n1: 2 free, n2: 0 free (drained)`: each node of `partition`.
    pub fn free_by_node(&self, partition: &str) -> String {
        let nodes: Vec<String> = self
            .nodes_of(partition)
            .map(|n| {
                let why = if n.usable() {
                    String::new()
                } else {
                    format!(" ({})", n.state.to_ascii_lowercase())
                };
                format!("{}: {} free{why}", n.name, n.gpus_free())
            })
            .collect();
        nodes.join(", ")
    }
}

/// Parses `scontrol show partition -o`.
pub fn parse_partitions(text: &str) -> Vec<Partition> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|line| {
            let kv = key_values(line);
            let get = |k: &str| kv.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
            Some(Partition {
                name: get("PartitionName")?,
                state: get("State").unwrap_or_else(|| "UP".into()),
                default: get("Default").as_deref() == Some("YES"),
                max_nodes: get("MaxNodes").and_then(|v| v.parse().ok()),
            })
        })
        .collect()
}

/// Parses `scontrol show node -o`.
pub fn parse_nodes(text: &str) -> Result<Vec<Node>, SlurmError> {
    let mut nodes = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("NodeName=")) {
        let kv = key_values(line);
        let get = |k: &str| kv.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        let name = get("NodeName").unwrap_or_default();
        let unreadable = |why: String| SlurmError::Unreadable {
            command: "scontrol show node -o".into(),
            why: format!("node {name}: {why}"),
        };
        let gpus = gres_gpus(get("Gres").as_deref().unwrap_or("")).map_err(&unreadable)?;
        let gpus_used = gres_gpus(get("GresUsed").as_deref().unwrap_or("")).map_err(&unreadable)?;
        nodes.push(Node {
            addr: get("NodeAddr").unwrap_or_else(|| name.clone()),
            state: get("State").unwrap_or_default(),
            partitions: get("Partitions")
                .map(|p| p.split(',').map(str::to_string).collect())
                .unwrap_or_default(),
            gpus,
            gpus_used,
            reason: get("Reason").filter(|r| !r.is_empty() && r != "(null)"),
            name,
        });
    }
    Ok(nodes)
}

/// The GPUs of a GRES string: `gpu:4`, `gpu:a100:2(S:0-1),gpu:v100:2`,
/// `gpu:3(IDX:0-2)`, `(null)`.
pub fn gres_gpus(gres: &str) -> Result<u32, String> {
    let mut total = 0u32;
    for entry in split_outside_parens(gres) {
        let entry = entry.split('(').next().unwrap_or("").trim();
        let mut fields = entry.split(':');
        if fields.next() != Some("gpu") {
            continue;
        }
        let count = fields.next_back().unwrap_or("1");
        // `gpu` alone, or `gpu:TYPE` without a count, is one.
        let n = match count.parse::<u32>() {
            Ok(n) => n,
            Err(_) if entry.split(':').count() <= 2 => 1,
            Err(_) => return Err(format!("`{gres}` is not a GRES list Slurm writes")),
        };
        total = total.saturating_add(n);
    }
    Ok(total)
}

fn split_outside_parens(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 Gres=gpu:4 NodeAddr=127.0.0.1 NodeHostName=vm Port=17001 OS=Linux 6.1 #1 SMP State=MIXED Partitions=gpu,debug GresUsed=gpu:3(IDX:0-2)\nNodeName=n2 Gres=gpu:a100:2(S:0),gpu:v100:2 NodeAddr=10.0.0.2 State=IDLE+DRAIN Partitions=gpu Reason=maintenance [root@2024]\n";
    const PARTITIONS: &str = "PartitionName=gpu AllowGroups=ALL Default=YES MaxNodes=UNLIMITED State=UP TotalNodes=2\nPartitionName=debug Default=NO MaxNodes=1 State=UP\n";

    #[test]
    fn nodes_and_partitions_are_read_from_scontrol() {
        let nodes = parse_nodes(NODES).unwrap();
        assert_eq!(nodes[0].gpus, 4);
        assert_eq!(nodes[0].gpus_used, 3);
        assert_eq!(nodes[0].gpus_free(), 1);
        assert_eq!(nodes[0].partitions, ["gpu", "debug"]);
        assert_eq!(nodes[1].gpus, 4);
        assert!(!nodes[1].usable(), "drained");
        assert_eq!(nodes[1].gpus_free(), 0);
        assert_eq!(nodes[1].reason.as_deref(), Some("maintenance [root@2024]"));
        let parts = parse_partitions(PARTITIONS);
        assert_eq!(parts[1].max_nodes, Some(1));
        assert!(parts[0].default && parts[0].max_nodes.is_none());
    }

    #[test]
    fn what_a_partition_can_never_give_is_refused() {
        let c = Cluster {
            nodes: parse_nodes(NODES).unwrap(),
            partitions: parse_partitions(PARTITIONS),
        };
        let gpu = c.partition(None).unwrap();
        let ask = |nodes, gpus_per_node| Ask {
            batch: "b",
            nodes,
            gpus_per_node,
        };
        c.check(gpu, ask(2, 4)).unwrap();
        let e = c.check(gpu, ask(1, 8)).unwrap_err();
        assert!(e.to_string().contains("the most: 4"), "{e}");
        assert!(c.check(gpu, ask(3, 1)).is_err());
        let debug = c.partition(Some("debug")).unwrap();
        assert!(c.check(debug, ask(2, 1)).is_err(), "MaxNodes=1");
        let e = c.partition(Some("nope")).unwrap_err();
        assert!(e.to_string().contains("its partitions: gpu, debug"), "{e}");
        assert!(c.fits_now("gpu", ask(1, 1)), "n1 has one free");
        assert!(!c.fits_now("gpu", ask(1, 2)));
        assert!(!c.fits_now("gpu", ask(2, 1)), "n2 is drained");
        assert_eq!(c.free_by_node("gpu"), "n1: 1 free, n2: 0 free (idle+drain)");
        assert_eq!(gres_gpus("(null)"), Ok(0));
        assert_eq!(gres_gpus("gpu"), Ok(1));
    }
}
