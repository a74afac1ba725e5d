//! `cibox doctor`: everything a GPU batch needs from the host, checked and explained
//! (docs/interface.md): the host policy, the manifest, the engine and its GPU runtime,
//! the GPU probe and the units' health, the lock dir, the pool, the models the batches
//! ask for, how `gpu exec` confines a command. Each check is a [`Finding`]; the
//! [`Report`] says whether GPU batches can run, and its exit code.
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - [`finding`]: a check's verdict, and what the checks read;
//! - [`checks`]: one function per check.

mod checks;
mod finding;

use crate::console::Table;
use crate::exit;
use crate::lockdir;
use crate::manifest::GpuDriver;
use checks::*;
use finding::finding;
pub use finding::{Finding, Sources, Status};

/// Every finding, how many of them block GPU batches, and the exit code.
#[derive(Debug)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub blocking: usize,
    pub exit_code: u8,
    /// Whether the GPUs are fake (`cibox gpu fake`).
    pub fake: bool,
}

/// Every check, in the order `cibox doctor` shows them, and the exit code they come to.
pub fn examine(ctx: &dyn Sources) -> Report {
    let mut findings = Vec::new();
    let (policy_broken, login_node) = match policy_finding(ctx, &mut findings) {
        Some(login_node) => (false, login_node),
        None => (true, false),
    };
    let (manifest, manifest_broken) = manifest_finding(ctx, policy_broken, &mut findings);
    let manifest_broken = manifest_broken || policy_broken;
    let driver = manifest
        .as_ref()
        .map_or(GpuDriver::Nvidia, |m| m.container.gpu_driver);
    let models_asked = manifest.as_ref().map(models_asked).unwrap_or_default();
    let gpu_cfg = match manifest {
        Some(m) => Ok(m.gpu),
        None => ctx.gpu_without_manifest(),
    };
    engine_findings(driver, &mut findings);
    let (snapshot, hardware) = probe_finding(gpu_cfg.as_ref().ok(), &mut findings);
    if !fake_findings(&mut findings)
        && let Some(s) = &snapshot
    {
        amd_findings(s, driver, &mut findings);
    }
    match gpu_cfg {
        Ok(g) => {
            findings.push(
                match lockdir::check(&g.lock_dir, g.allow_network_lock_dir) {
                    // Allowed, but leases there are only as sound as its flock.
                    Ok(c) if c.network.is_some() => {
                        finding("lock dir", Status::Warn, c.detail, true)
                    }
                    Ok(c) => finding("lock dir", Status::Ok, c.detail, true),
                    Err(e) => finding("lock dir", Status::Fail, e.to_string(), true),
                },
            );
            findings.push(pool_finding(&g.pool, snapshot.as_ref()));
            if let Some(s) = &snapshot
                && !models_asked.is_empty()
            {
                findings.push(models_finding(&models_asked, s, &hardware));
            }
        }
        Err(e) => findings.push(finding("gpu settings", Status::Fail, e.to_string(), true)),
    }
    findings.push(confinement_finding());
    if login_node {
        for f in &mut findings {
            nodes_run_the_batches(f);
        }
    }
    let blocking = findings
        .iter()
        .filter(|f| f.status == Status::Fail && f.blocks_gpu_batches)
        .count();
    let code = if manifest_broken {
        exit::USAGE
    } else if blocking > 0 {
        exit::INFRA
    } else {
        exit::SUCCESS
    };
    Report {
        findings,
        blocking,
        exit_code: code,
        fake: crate::gpu::fake::is_on(),
    }
}

impl Report {
    /// What `--json` prints.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "findings": self.findings,
            "ready_for_gpu_batches": self.blocking == 0,
            "fake_gpus": self.fake,
            "exit_code": self.exit_code,
        })
    }

    /// The findings as a table, and whether GPU batches can run: on fake GPUs, said so
    /// in the same line (a last line read alone must not pass them for real ones).
    pub fn render(&self) -> String {
        render(&self.findings, self.blocking, self.fake)
    }
}

fn render(findings: &[Finding], blocking: usize, fake: bool) -> String {
    let mut t = Table::new(&["CHECK", "STATUS", "DETAIL"]);
    for f in findings {
        let status = match f.status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Info => "info",
        };
        t.row(vec![f.check.into(), status.into(), f.detail.clone()]);
    }
    let mut out = t.render();
    if blocking == 0 && fake {
        out.push_str("ready for GPU batches on FAKE GPUs (cibox gpu fake): no real GPU is used\n");
    } else if blocking == 0 {
        out.push_str("ready for GPU batches\n");
    } else {
        out.push_str(&format!(
            "not ready for GPU batches: {blocking} check(s) failed\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::probe::Snapshot;
    use crate::gpu::probe::reading::GpuState;
    use crate::manifest::PoolSpec;

    #[test]
    fn on_a_slurm_login_node_local_gpu_checks_only_inform() {
        let mut runtime = finding("gpu runtime", Status::Fail, "no NVIDIA runtime", true);
        nodes_run_the_batches(&mut runtime);
        assert_eq!(runtime.status, Status::Info);
        assert!(!runtime.blocks_gpu_batches);
        assert!(
            runtime
                .detail
                .starts_with("not needed here: the Slurm nodes run the batches")
                && runtime
                    .detail
                    .ends_with("this host: would fail: no NVIDIA runtime"),
            "{}",
            runtime.detail
        );
        // What the submitter itself needs still counts.
        let mut engine = finding("engine", Status::Fail, "unreachable", true);
        nodes_run_the_batches(&mut engine);
        assert_eq!(engine.status, Status::Fail);
        assert!(engine.blocks_gpu_batches);
    }

    fn snap(sick: Option<&str>) -> Snapshot {
        let g = |i: u32| GpuState {
            index: i,
            uuid: format!("GPU-00000000-0000-0000-0000-00000000000{i}"),
            parent: None,
            memory_used_mib: 0,
            memory_total_mib: 81559,
            utilization: Some(0),
            sick: None,
        };
        let mut gpus = vec![g(0), g(1)];
        gpus[1].sick = sick.map(str::to_string);
        Snapshot {
            gpus,
            apps: Vec::new(),
            claimed: Vec::new(),
        }
    }

    #[test]
    fn a_pool_entry_no_gpu_here_answers_to_fails() {
        let s = snap(None);
        let ok = PoolSpec::Devices(vec!["0".into(), s.gpus[1].uuid.clone()]);
        let f = pool_finding(&ok, Some(&s));
        assert_eq!(
            (f.status, f.detail.as_str()),
            (Status::Ok, "0,GPU-00000000-0000-0000-0000-000000000001")
        );
        let bad = PoolSpec::Devices(vec!["0".into(), "7".into()]);
        let f = pool_finding(&bad, Some(&s));
        assert_eq!(f.status, Status::Fail);
        assert!(f.blocks_gpu_batches);
        assert_eq!(
            f.detail,
            "not on this host: 7; fix gpu.pool or CIBOX_GPU_POOL"
        );
        // Without a probe nothing is matched, and nothing fails.
        assert_eq!(pool_finding(&bad, None).status, Status::Ok);
    }

    #[test]
    fn an_unhealthy_unit_is_a_warning_naming_it() {
        assert_eq!(health_finding(&snap(None)).status, Status::Ok);
        let f = health_finding(&snap(Some("XID 79")));
        assert_eq!(f.status, Status::Warn);
        assert!(
            f.detail.starts_with("1 of 2 units unhealthy"),
            "{}",
            f.detail
        );
        assert!(f.detail.contains("XID 79"), "{}", f.detail);
    }

    #[test]
    fn the_report_renders_as_a_table_and_a_verdict() {
        let findings = vec![
            finding(
                "engine",
                Status::Ok,
                "28.0.1 at unix:///run/docker.sock, API 1.41",
                true,
            ),
            finding("gpu runtime", Status::Fail, "no NVIDIA runtime", true),
            finding(
                "gpu models",
                Status::Warn,
                "no GPU here of model `H100*`",
                false,
            ),
            finding("slurm", Status::Info, "told", false),
        ];
        let report = Report {
            findings,
            blocking: 1,
            exit_code: exit::INFRA,
            fake: false,
        };
        insta::assert_snapshot!("report_text", report.render());
        insta::assert_snapshot!(
            "report_json",
            serde_json::to_string_pretty(&report.to_json()).unwrap()
        );
        let mut ready = Report {
            findings: vec![finding("engine", Status::Ok, "up", true)],
            blocking: 0,
            exit_code: exit::SUCCESS,
            fake: false,
        };
        assert!(ready.render().ends_with("\nready for GPU batches\n"));
        ready.fake = true;
        assert!(ready.render().ends_with(
            "\nready for GPU batches on FAKE GPUs (cibox gpu fake): no real GPU is used\n"
        ));
    }
}
