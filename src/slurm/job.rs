//! One batch as a Slurm job: its `srun` command line ([`JobSpec::srun_args`]), its
//! state in the queue ([`queue_state`]), and cancelling it ([`cancel`]).
//!
//! The submitter runs `srun` itself (no batch script): the job's allocation lives as
//! long as that `srun`, its output comes back on `srun`'s standard output as it is
//! printed, and a job on several nodes is one step with one task per node
//! (`--kill-on-bad-exit`: a rank that fails ends the others).

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::{SlurmError, query};

/// Everything `srun` is told about a batch's job.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// The job's name (see [`job_name`]).
    pub name: String,
    pub nodes: u32,
    /// GPUs on each node (`--gres=gpu:N`; none when 0).
    pub gpus_per_node: u32,
    /// Their GRES type, for a batch that asks for a GPU model (`--gres=gpu:TYPE:N`).
    pub gpu_type: Option<String>,
    /// The time limit: the batch's timeout plus the policy's grace.
    pub time_limit: Duration,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    /// The policy's further options, as written.
    pub options: Vec<String>,
    /// What each task runs: the cibox of the nodes and its arguments.
    pub command: Vec<String>,
    /// The job's working folder on the nodes.
    pub chdir: PathBuf,
}

impl JobSpec {
    /// `srun`'s arguments (the program name not included).
    pub fn srun_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--job-name={}", self.name),
            format!("--nodes={}", self.nodes),
            "--ntasks-per-node=1".to_string(),
            format!("--time={}", minutes_up(self.time_limit)),
            format!("--chdir={}", self.chdir.display()),
            // One line per message, each labelled with its task: see `wire`.
            "--label".to_string(),
            "--kill-on-bad-exit=1".to_string(),
        ];
        match (&self.gpu_type, self.gpus_per_node) {
            (_, 0) => {}
            (Some(t), n) => args.push(format!("--gres=gpu:{t}:{n}")),
            (None, n) => args.push(format!("--gres=gpu:{n}")),
        }
        for (flag, value) in [
            ("--partition", &self.partition),
            ("--account", &self.account),
            ("--qos", &self.qos),
        ] {
            if let Some(v) = value {
                args.push(format!("{flag}={v}"));
            }
        }
        args.extend(self.options.iter().cloned());
        args.push("--".to_string());
        args.extend(self.command.iter().cloned());
        args
    }
}

/// A time limit in whole minutes, rounded up (Slurm keeps time limits in minutes).
fn minutes_up(d: Duration) -> u64 {
    d.as_secs().div_ceil(60).max(1)
}

/// The job name of a batch: `cibox:<project>:<batch>:<run>`, what `squeue` and the
/// accounting show; characters Slurm tools would mangle are `_`.
pub fn job_name(project: &str, batch: &str, run_id: &str) -> String {
    let clean = crate::util::sanitize;
    format!(
        "cibox:{}:{}:{}",
        clean(project),
        clean(batch),
        clean(run_id)
    )
}

/// A job's state in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueState {
    pub id: String,
    /// `PENDING`, `CONFIGURING`, `RUNNING`, `COMPLETING`, `COMPLETED`, `CANCELLED`,
    /// `TIMEOUT`, `FAILED`, `NODE_FAIL`, …
    pub state: String,
    /// Why it waits (`Resources`, `Priority`, `QOSMaxGRESPerUser`, …); `None` while
    /// it runs.
    pub reason: Option<String>,
    /// The nodes it runs on, as Slurm writes the list.
    pub nodes: String,
}

impl QueueState {
    pub fn pending(&self) -> bool {
        self.state == "PENDING"
    }

    /// `PENDING (Resources)`, `RUNNING on n1`.
    pub fn describe(&self) -> String {
        match (&self.reason, self.nodes.is_empty()) {
            (Some(r), _) => format!("{} ({r})", self.state),
            (None, false) => format!("{} on {}", self.state, self.nodes),
            (None, true) => self.state.clone(),
        }
    }
}

/// The state of the job named `name` (this user's), or `None` when Slurm knows no
/// such job (not yet submitted, or long gone).
pub fn queue_state(name: &str) -> Result<Option<QueueState>, SlurmError> {
    let user = nix::unistd::getuid().to_string();
    let text = query(
        "squeue",
        &[
            "--noheader",
            "--states=all",
            &format!("--name={name}"),
            &format!("--user={user}"),
            "--format=%i|%T|%r|%N",
        ],
    )?;
    Ok(parse_queue(&text).into_iter().next())
}

/// Parses `squeue --noheader --format=%i|%T|%r|%N`.
pub fn parse_queue(text: &str) -> Vec<QueueState> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.trim().splitn(4, '|');
            let id = f.next()?.to_string();
            let state = f.next()?.to_string();
            let reason = f
                .next()
                .map(str::to_string)
                .filter(|r| !r.is_empty() && r != "None" && r != "(null)");
            let nodes = f.next().unwrap_or("").trim().to_string();
            (!id.is_empty()).then_some(QueueState {
                id,
                state,
                reason,
                nodes,
            })
        })
        .collect()
}

/// Sends `signal` to every step of the job named `name` (this user's), or, with
/// `None`, cancels the job (Slurm sends SIGTERM, then SIGKILL after its `KillWait`).
pub fn cancel(name: &str, signal: Option<Signal>) -> Result<(), SlurmError> {
    let user = nix::unistd::getuid().to_string();
    let mut args = vec![
        format!("--name={name}"),
        format!("--user={user}"),
        "--quiet".to_string(),
    ];
    if let Some(sig) = signal {
        args.push(format!(
            "--signal={}",
            sig.as_str().trim_start_matches("SIG")
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    query("scancel", &args).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_srun_line_says_what_the_batch_asks_and_the_policy_adds() {
        let spec = JobSpec {
            name: job_name("my proj", "train", "0123abcd"),
            nodes: 2,
            gpus_per_node: 4,
            gpu_type: None,
            time_limit: Duration::from_secs(61),
            partition: Some("gpu".into()),
            account: None,
            qos: Some("ci".into()),
            options: vec!["--exclusive".into()],
            command: vec!["/opt/cibox".into(), "__slurm-node".into()],
            chdir: "/".into(),
        };
        let args = spec.srun_args();
        assert_eq!(args[0], "--job-name=cibox:my_proj:train:0123abcd");
        for want in [
            "--nodes=2",
            "--time=2",
            "--gres=gpu:4",
            "--partition=gpu",
            "--qos=ci",
            "--exclusive",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        assert!(!args.iter().any(|a| a.starts_with("--account")));
        assert_eq!(
            &args[args.len() - 3..],
            ["--", "/opt/cibox", "__slurm-node"]
        );
        // A batch of a GPU model asks for its GRES type.
        let typed = JobSpec {
            gpu_type: Some("h100".into()),
            ..spec.clone()
        };
        let args = typed.srun_args();
        assert!(args.iter().any(|a| a == "--gres=gpu:h100:4"), "{args:?}");
        assert!(!args.iter().any(|a| a == "--gres=gpu:4"), "{args:?}");
        let cpu = JobSpec {
            gpus_per_node: 0,
            ..typed
        };
        assert!(!cpu.srun_args().iter().any(|a| a.starts_with("--gres")));
    }

    #[test]
    fn queue_lines_are_read() {
        let q = parse_queue("12|PENDING|Resources|\n13|RUNNING|None|n[1-2]\n");
        assert_eq!(q[0].describe(), "PENDING (Resources)");
        assert!(q[0].pending());
        assert_eq!(q[1].describe(), "RUNNING on n[1-2]");
    }
}
