//! The emulated Slurm cluster (`.ci/slurm-cluster.sh`: nodes `n1` and `n2` on this
//! machine, 4 fake GPUs each): [`require_slurm`] fails with what to do when it does not
//! answer; [`SlurmHost`] is a login node's setup for a [`BusyboxProject`]: a host
//! policy with `scheduler: slurm`, a lock dir, and a fake-GPU state folder with each
//! node's own GPUs (`nodes/n1`, `nodes/n2`: see the fixture and the NVML double), whose
//! UUIDs [`node_uuid`] gives.

use std::process::Command;

use super::cli::{Run, run};
use super::gpus::FakeSmi;
use super::projects::BusyboxProject;

/// The emulated nodes, and their GPUs each.
pub const NODES: [&str; 2] = ["n1", "n2"];
pub const GPUS_PER_NODE: usize = 4;

/// The UUID of GPU `index` of emulated node `node` (`n1`, `n2`).
pub fn node_uuid(node: &str, index: usize) -> String {
    let n: usize = node.trim_start_matches('n').parse().unwrap();
    format!("GPU-5a0e0000-0000-0000-000{n}-{index:012}")
}

/// Fails with what to do unless the emulated cluster answers with both nodes.
pub fn require_slurm() {
    let out = Command::new("sinfo")
        .args(["-h", "-N", "-o", "%N %t"])
        .output();
    let text = out
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    assert!(
        out.is_ok_and(|o| o.status.success()) && NODES.iter().all(|n| text.contains(n)),
        "this test needs the emulated Slurm cluster (nodes n1 and n2): run `bash .ci/setup-host.sh` as root (sinfo says: {text:?})"
    );
}

/// A login node's setup: the policy, locks and fake GPUs of a Slurm test.
pub struct SlurmHost {
    pub smi: FakeSmi,
    pub locks: tempfile::TempDir,
}

impl SlurmHost {
    pub fn new() -> SlurmHost {
        require_slurm();
        let smi = FakeSmi::with_gpus(0);
        for node in NODES {
            let dir = smi.state.path().join("nodes").join(node);
            std::fs::create_dir_all(&dir).unwrap();
            let gpus: String = (0..GPUS_PER_NODE)
                .map(|i| format!("{i}, {}, 0, 81559, 0\n", node_uuid(node, i)))
                .collect();
            std::fs::write(dir.join("gpus.csv"), gpus).unwrap();
            std::fs::write(dir.join("apps.csv"), "").unwrap();
        }
        SlurmHost {
            smi,
            locks: tempfile::tempdir().unwrap(),
        }
    }

    /// A policy that submits to Slurm with `slurm` (the keys under `slurm:`, indented
    /// two spaces) and grants `grants` (the keys under `grants:`).
    pub fn policy(&self, slurm: &str, grants: &str) -> String {
        format!(
            "version: 1\ngpu:\n  lock_dir: {}\n  probe: nvidia-smi\nscheduler: slurm\nslurm:\n  partition: gpu\n{slurm}grants:\n  network: [host]\n{grants}",
            self.locks.path().display()
        )
    }

    /// Writes node `node`'s compute processes (`apps.csv`).
    pub fn set_apps(&self, node: &str, apps: &str) {
        std::fs::write(
            self.smi
                .state
                .path()
                .join("nodes")
                .join(node)
                .join("apps.csv"),
            apps,
        )
        .unwrap();
    }

    /// `cibox ARGS` of project `p` under its policy, on the fake GPUs.
    pub fn cmd(&self, p: &BusyboxProject, args: &[&str]) -> Command {
        let mut c = p.batch_cmd(args);
        self.smi.apply(&mut c);
        c
    }

    pub fn run(&self, p: &BusyboxProject, args: &[&str]) -> Run {
        run(&mut self.cmd(p, args))
    }
}

/// The jobs Slurm knows by `name` (any state it still shows), as `ID STATE`.
pub fn jobs_named(name: &str) -> Vec<String> {
    let out = Command::new("squeue")
        .args(["-h", "-t", "all", "-o", "%i %T %j"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.ends_with(name))
        .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
        .collect()
}

/// Jobs named `name` that still hold their nodes (pending, running or completing).
pub fn live_jobs(name: &str) -> Vec<String> {
    jobs_named(name)
        .into_iter()
        .filter(|j| {
            [
                "PENDING",
                "RUNNING",
                "COMPLETING",
                "CONFIGURING",
                "SUSPENDED",
            ]
            .iter()
            .any(|s| j.ends_with(s))
        })
        .collect()
}

/// A job of plain `srun` holding `gpus` GPUs of `node` until it is dropped.
pub struct Holder {
    name: String,
    srun: std::process::Child,
}

impl Holder {
    pub fn new(node: &str, gpus: u32) -> Holder {
        let name = format!("cibox-test-holder-{}", super::cli::nonce());
        let child = Command::new("srun")
            .args([
                &format!("--job-name={name}"),
                &format!("--nodelist={node}"),
                &format!("--gres=gpu:{gpus}"),
                "--time=5",
                "sleep",
                "300",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            super::processes::wait_until(60, || live_jobs(&name)
                .iter()
                .any(|j| j.ends_with("RUNNING"))),
            "the holding job {name} did not start"
        );
        Holder { name, srun: child }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // Cancelled by name: an srun killed alone would leave its job holding the GPUs.
        let _ = Command::new("scancel")
            .arg(format!("--name={}", self.name))
            .status();
        let _ = self.srun.wait();
    }
}
