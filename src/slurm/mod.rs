//! Slurm, as cibox uses it (docs/interface.md §14): its commands (`srun`, `squeue`,
//! `scontrol`, `scancel`) run with a time limit, and what they print parsed into types.
//!
//! - [`cluster`]: the cluster's nodes and partitions (`scontrol show … -o`), and
//!   whether a job could ever run there;
//! - [`job`]: the `srun` command line of a batch, its state in the queue, cancelling it;
//! - [`alloc`]: on a node, what Slurm allocated to this job step (its GPUs, its rank,
//!   the rendezvous of a job on several nodes);
//! - [`wire`]: messages from the nodes to the submitter through `srun --label`, framed
//!   so that Slurm's line splitting cannot break them.
//!
//! A leaf of the domain: it imports only cibox's leaves.

pub mod alloc;
pub mod cluster;
pub mod job;
pub mod wire;

use std::process::Command;
use std::time::{Duration, Instant};

use crate::exit::Failure;
use crate::process::bounded::{self, BoundedError, Bounds};

/// The most a Slurm query's answer may hold (a cluster's nodes, `-o`, one line each).
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// How long one Slurm query may take: the controller answers in milliseconds, or
/// after its own `MessageTimeout` (10 s by default) when it is down.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why Slurm could not do what cibox asked.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// A Slurm command is missing, hangs or says the controller cannot be reached.
    #[error("Slurm does not answer: `{command}` {why}")]
    Unreachable { command: String, why: String },
    /// The cluster cannot take the request as the host's policy or manifest shapes
    /// it (a partition that does not exist).
    #[error("{0}")]
    Refused(String),
    /// The cluster has never enough of what a batch asks (GPUs on a node, nodes).
    #[error("{0}")]
    Lacks(String),
    /// A job's rendezvous cannot be held on its node (another process listens on its
    /// port).
    #[error("{0}")]
    Rendezvous(String),
    /// A Slurm command answered something cibox cannot read.
    #[error("cannot read what `{command}` printed: {why}")]
    Unreadable { command: String, why: String },
}

impl crate::error::ErrorKind for SlurmError {
    fn failure(&self) -> Failure {
        match self {
            SlurmError::Unreachable { .. }
            | SlurmError::Unreadable { .. }
            | SlurmError::Rendezvous(_) => Failure::Infra,
            SlurmError::Refused(_) => Failure::Usage,
            SlurmError::Lacks(_) => Failure::Capacity,
        }
    }
}

/// Runs a Slurm command to its end (at most [`QUERY_TIMEOUT`]) and returns what it
/// printed; a command that fails is [`SlurmError::Unreachable`] with its last words.
pub fn query(program: &str, args: &[&str]) -> Result<String, SlurmError> {
    let shown = || format!("{program} {}", args.join(" "));
    let unreachable = |why: String| SlurmError::Unreachable {
        command: shown(),
        why,
    };
    let mut cmd = Command::new(program);
    cmd.args(args);
    // Its answer read whole by the deadline, whatever a process it leaves holds.
    let bounds = Bounds {
        deadline: Instant::now() + QUERY_TIMEOUT,
        max_stdout: MAX_ANSWER_BYTES,
        max_stderr: 64 << 10,
    };
    let answer = bounded::run(cmd, b"", bounds).map_err(|e| {
        unreachable(match e {
            BoundedError::Spawn(e) if e.kind() == std::io::ErrorKind::NotFound => {
                "is not installed here (no such program on PATH)".to_string()
            }
            BoundedError::Spawn(e) => format!("could not start: {e}"),
            BoundedError::Timeout | BoundedError::Held => {
                format!("did not answer within {} s", QUERY_TIMEOUT.as_secs())
            }
            BoundedError::TooLarge { max } => format!("answered over {} MiB", max >> 20),
            BoundedError::Io(e) => format!("could not be waited for: {e}"),
        })
    })?;
    let (status, out, err) = (answer.status, answer.stdout, answer.stderr);
    if !status.success() {
        let last = String::from_utf8_lossy(&err)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| format!("exited with {status}"));
        return Err(unreachable(format!(
            "failed: {}",
            crate::util::escape(&last)
        )));
    }
    String::from_utf8(out).map_err(|_| SlurmError::Unreadable {
        command: shown(),
        why: "not UTF-8".into(),
    })
}

/// The job ID in one of `srun`'s own lines (`srun: job 12 queued and waiting for
/// resources`, `srun: job 12 has been allocated resources`).
pub fn job_id_in(line: &str) -> Option<String> {
    let rest = line.strip_prefix("srun: ")?;
    let rest = rest
        .strip_prefix("job ")
        .or_else(|| rest.strip_prefix("Job allocation "))?;
    let id: String = rest.chars().take_while(char::is_ascii_digit).collect();
    (!id.is_empty() && rest[id.len()..].starts_with(' ')).then_some(id)
}

/// `Key=Value` pairs of one line of `scontrol show … -o`. A value may hold spaces (a
/// node's `OS=` or `Reason=`): a word without `=` belongs to the value before it.
pub(crate) fn key_values(line: &str) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for word in line.split_whitespace() {
        match word.split_once('=') {
            Some((k, v))
                if !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
            {
                pairs.push((k.to_string(), v.to_string()));
            }
            _ => {
                if let Some((_, v)) = pairs.last_mut() {
                    v.push(' ');
                    v.push_str(word);
                }
            }
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind as _;

    #[test]
    fn values_may_hold_spaces() {
        let kv =
            key_values("NodeName=n1 OS=Linux 6.1 #1 SMP State=IDLE Reason=not responding [root@x]");
        let get = |k: &str| kv.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("OS"), Some("Linux 6.1 #1 SMP"));
        assert_eq!(get("State"), Some("IDLE"));
        assert_eq!(get("Reason"), Some("not responding [root@x]"));
    }

    #[test]
    fn srun_names_its_job() {
        let id = |l: &str| job_id_in(l);
        assert_eq!(
            id("srun: job 12 queued and waiting for resources").as_deref(),
            Some("12")
        );
        assert_eq!(
            id("srun: job 7 has been allocated resources").as_deref(),
            Some("7")
        );
        assert_eq!(
            id("srun: Job allocation 9 has been revoked").as_deref(),
            Some("9")
        );
        assert_eq!(id("srun: error: x"), None);
        assert_eq!(id("0: srun: job 1 queued"), None);
    }

    #[test]
    fn a_missing_command_is_unreachable() {
        let e = query("/nonexistent/sinfo", &[]).unwrap_err();
        assert_eq!(e.failure(), Failure::Infra);
        assert!(e.to_string().contains("not installed"), "{e}");
    }
}
