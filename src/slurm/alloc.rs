//! On a node, inside a job step: what Slurm allocated to this task, from the `SLURM_*`
//! variables it sets, and the rendezvous of a job on several nodes.
//!
//! GPUs: Slurm gives a step the GPUs of its node by their index in the node's GRES
//! list (`SLURM_STEP_GPUS`; `CUDA_VISIBLE_DEVICES` holds the same indices while no
//! device cgroup renumbers them). With the node's GPUs listed in NVML order (what
//! `AutoDetect=nvml` does, and `/dev/nvidia[0-N]` files do), the index is the GPU's
//! NVML index, which is how cibox names them.
//!
//! MIG slices: a node whose `gres.conf` names each slice (`AutoDetect=nvml`, one GRES
//! type per profile) has Slurm set `CUDA_VISIBLE_DEVICES` to the slices' `MIG-…` UUIDs
//! (their `UniqueId`); a list of UUIDs there names the units by identity, which is
//! what cibox leases. A slice is never taken from an index alone.

use std::collections::BTreeMap;

use super::{SlurmError, query};

/// The rendezvous ports: drawn at random for each job by its submitter, below Linux's
/// default range of ephemeral ports (32768-60999), so no outgoing connection holds one
/// by chance. Another user cannot tell a job's port from its ID (the IDs are
/// sequential), nor listen on all of them without rank 0 seeing it.
pub const PORT_RANGE: std::ops::Range<u16> = 20000..32768;

/// The variables the submitter gives `srun` for a job on several nodes (and so each
/// rank's cibox, through Slurm's `--export=ALL`; never on a command line, which every
/// user of the node and `squeue` can read).
pub const PORT_VAR: &str = "CIBOX_RENDEZVOUS_PORT";
pub const TOKEN_VAR: &str = "CIBOX_RENDEZVOUS_TOKEN";

/// A job's rendezvous secret: its port, and a token each rank has and nobody else.
#[derive(Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub port: u16,
    /// 64 hex digits from the kernel's random source.
    pub token: String,
}

impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token: debug output reaches logs.
        write!(f, "Rendezvous {{ port: {}, token: <hidden> }}", self.port)
    }
}

impl Rendezvous {
    /// A fresh one, for one job: its port and token from the kernel's random source.
    pub fn random() -> std::io::Result<Rendezvous> {
        let mut buf = [0u8; 4];
        getrandom::fill(&mut buf)?;
        let span = u32::from(PORT_RANGE.end - PORT_RANGE.start);
        let port = PORT_RANGE.start + (u32::from_le_bytes(buf) % span) as u16;
        Ok(Rendezvous {
            port,
            token: crate::util::random_hex(32)?,
        })
    }

    /// The submitter's, from `var` (the process environment, or a test's).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Rendezvous, SlurmError> {
        let missing = |name: &str| {
            SlurmError::Refused(format!(
                "{name} is not set as a submitting cibox sets it for a batch on several nodes: submit the batch with a cibox that does (the nodes' cibox is newer than the submitter's?)"
            ))
        };
        let port = var(PORT_VAR).ok_or_else(|| missing(PORT_VAR))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| PORT_RANGE.contains(p))
            .ok_or_else(|| missing(PORT_VAR))?;
        let token = var(TOKEN_VAR)
            .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| missing(TOKEN_VAR))?;
        Ok(Rendezvous { port, token })
    }

    /// Refuses a port something on this node listens on already: rank 0 must be the
    /// one that binds it, or the other ranks would meet whoever got there first.
    /// Checked on every address (IPv4 and IPv6) as the rendezvous would bind it.
    pub fn check_free(&self, node: &str) -> Result<(), SlurmError> {
        use std::net::{Ipv4Addr, Ipv6Addr, TcpListener};
        let taken = |e: std::io::Error| {
            SlurmError::Rendezvous(format!(
                "the job's rendezvous port {} on node {node} cannot be bound by its rank 0 ({e}): another process listens there, and the other ranks would meet it; run the batch again (its next job draws another port)",
                self.port
            ))
        };
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, self.port)).map_err(taken)?;
        match TcpListener::bind((Ipv6Addr::UNSPECIFIED, self.port)) {
            Ok(_) => Ok(()),
            // No IPv6 on this node: nobody can listen there either.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(nix::libc::EAFNOSUPPORT | nix::libc::EADDRNOTAVAIL)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(taken(e)),
        }
    }
}

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
    /// The same units by identity, when `CUDA_VISIBLE_DEVICES` names them so (MIG
    /// slices' UUIDs, as Slurm sets them); empty otherwise.
    pub gpu_ids: Vec<String>,
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
        // Identities, when Slurm gives them (every entry a GPU's or a slice's UUID).
        let gpu_ids: Vec<String> = var("CUDA_VISIBLE_DEVICES")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .filter(|ids: &Vec<String>| ids.iter().all(|u| is_unit_uuid(u)))
            .unwrap_or_default();
        let cuda_indices = var("CUDA_VISIBLE_DEVICES").filter(|_| gpu_ids.is_empty());
        let gpus = match var("SLURM_STEP_GPUS")
            .or_else(|| var("SLURM_JOB_GPUS"))
            .or(cuda_indices)
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
            gpu_ids,
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
    /// them: `MASTER_ADDR` (the first node's address), `MASTER_PORT` (the job's own,
    /// `secret`'s), `NODE_RANK`, `NNODES` and `WORLD_SIZE` (one process per GPU), and
    /// `CIBOX_RENDEZVOUS_TOKEN`, the job's shared secret. Rank 0 first makes sure the
    /// port is free on its node.
    pub fn rendezvous(
        &self,
        gpus_per_node: u32,
        secret: &Rendezvous,
    ) -> Result<BTreeMap<String, String>, SlurmError> {
        if self.rank == 0 {
            secret.check_free(&self.node)?;
        }
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
        Ok(rendezvous_vars(&addr, self, gpus_per_node, secret))
    }
}

/// The rendezvous variables, given the first node's address.
pub fn rendezvous_vars(
    master: &str,
    a: &Allocation,
    gpus_per_node: u32,
    secret: &Rendezvous,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("MASTER_ADDR".to_string(), master.to_string()),
        ("MASTER_PORT".to_string(), secret.port.to_string()),
        (TOKEN_VAR.to_string(), secret.token.clone()),
        ("NODE_RANK".to_string(), a.rank.to_string()),
        ("NNODES".to_string(), a.nodes.to_string()),
        (
            "WORLD_SIZE".to_string(),
            (a.nodes * gpus_per_node.max(1)).to_string(),
        ),
    ])
}

/// `0,1,3`: GPU indices. Ranges (`0-3`) are read too.
/// `GPU-` or `MIG-` and the 8-4-4-4-12 hex groups: a GPU's or a MIG slice's UUID.
fn is_unit_uuid(s: &str) -> bool {
    s.strip_prefix("GPU-")
        .or_else(|| s.strip_prefix("MIG-"))
        .is_some_and(crate::util::is_uuid_groups)
}

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
        let secret = Rendezvous {
            port: 23456,
            token: "ab".repeat(32),
        };
        let env = rendezvous_vars("10.0.0.1", &a, 4, &secret);
        assert_eq!(env["MASTER_ADDR"], "10.0.0.1");
        assert_eq!(env["MASTER_PORT"], "23456");
        assert_eq!(env["CIBOX_RENDEZVOUS_TOKEN"], "ab".repeat(32));
        assert_eq!(env["WORLD_SIZE"], "8");
        assert_eq!(env["NODE_RANK"], "1");
        let none = Allocation::from_vars(vars(&[])).unwrap();
        assert!(none.gpus.is_empty());
        assert!(Allocation::from_vars(vars(&[("SLURM_STEP_GPUS", "0,x")])).is_err());
        assert!(Allocation::from_vars(|_| None).is_err());
        assert_eq!(parse_indices("0-2,5"), Some(vec![0, 1, 2, 5]));
    }

    #[test]
    fn mig_slices_slurm_names_by_uuid_are_taken_by_uuid() {
        let m = "MIG-5a5a5a5a-0000-4444-8888-000000000003";
        let a = Allocation::from_vars(vars(&[
            ("SLURM_STEP_GPUS", "3"),
            ("CUDA_VISIBLE_DEVICES", m),
        ]))
        .unwrap();
        assert_eq!(
            (a.gpus.as_slice(), a.gpu_ids.as_slice()),
            ([3].as_slice(), [m.to_string()].as_slice())
        );
        // Without Slurm's own list, the UUIDs alone.
        let a = Allocation::from_vars(vars(&[("CUDA_VISIBLE_DEVICES", m)])).unwrap();
        assert!(a.gpus.is_empty() && a.gpu_ids == [m]);
        // Indices are no identities.
        let a = Allocation::from_vars(vars(&[("CUDA_VISIBLE_DEVICES", "0,1")])).unwrap();
        assert!(a.gpu_ids.is_empty() && a.gpus == [0, 1]);
    }

    #[test]
    fn a_rendezvous_is_drawn_per_job_and_read_back_as_sent() {
        let a = Rendezvous::random().unwrap();
        let b = Rendezvous::random().unwrap();
        assert!(PORT_RANGE.contains(&a.port) && PORT_RANGE.contains(&b.port));
        assert_ne!(a.token, b.token);
        assert_eq!(a.token.len(), 64);
        assert!(
            !format!("{a:?}").contains(&a.token),
            "never in debug output"
        );
        let sent = [(PORT_VAR, a.port.to_string()), (TOKEN_VAR, a.token.clone())];
        let var = |n: &str| sent.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
        assert_eq!(Rendezvous::from_vars(var).unwrap(), a);
        let e = Rendezvous::from_vars(|n| (n == PORT_VAR).then(|| "20001".into())).unwrap_err();
        assert!(e.to_string().contains(TOKEN_VAR), "{e}");
        assert!(
            Rendezvous::from_vars(|n| match n {
                PORT_VAR => Some("80".into()),
                _ => Some("ab".repeat(32)),
            })
            .is_err()
        );
        assert!(
            Rendezvous::from_vars(|n| match n {
                PORT_VAR => Some("20001".into()),
                _ => Some("short".into()),
            })
            .is_err()
        );
    }

    #[test]
    fn a_port_someone_listens_on_is_refused() {
        let squatter = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
        let port = squatter.local_addr().unwrap().port();
        let r = Rendezvous {
            port,
            token: "0".repeat(64),
        };
        let e = r.check_free("n1").unwrap_err().to_string();
        assert!(
            e.contains(&format!("rendezvous port {port} on node n1")),
            "{e}"
        );
        drop(squatter);
        r.check_free("n1").unwrap();
    }
}
