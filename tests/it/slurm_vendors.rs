//! Ascend NPUs, Intel GPUs and Moore Threads GPUs through Slurm (issue 45), on the
//! emulated cluster of `.ci/setup-host.sh`: its `gres/gpu` (four per node) stands for
//! each vendor's units as docs/reference/containers-and-leases.md documents them
//! (`Name=gpu File=/dev/davinci[0-7]`, `/dev/dri/renderD…`, `/dev/mtgpu.…`, in the
//! tool's order), the vendor's double answering on each node (`nodes/<node>/` of its
//! state folder). The batch takes exactly the units the real slurmctld allocated, by
//! identity, and a sick unit it allocates is refused, not leased. These share the
//! cluster's GPUs with `slurm::` and run one at a time with them (`.config/nextest.toml`).

use crate::common::*;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Ascend,
    Intel,
    MooreThreads,
}

/// A login node's setup for `kind`: the vendor's host of doubles (its device files,
/// sysfs, driver), each node's own units in its state folder, and a Slurm policy that
/// probes with the vendor's tool.
struct VendorCluster {
    kind: Kind,
    slurm: SlurmHost,
    ascend: Option<AscendHost>,
    other: Option<OtherHost>,
}

impl VendorCluster {
    fn new(kind: Kind) -> VendorCluster {
        let slurm = SlurmHost::new();
        let (ascend, other) = match kind {
            Kind::Ascend => (Some(AscendHost::new(GPUS_PER_NODE)), None),
            Kind::Intel => (None, Some(OtherHost::new(Other::Intel, GPUS_PER_NODE))),
            Kind::MooreThreads => (
                None,
                Some(OtherHost::new(Other::MooreThreads, GPUS_PER_NODE)),
            ),
        };
        let c = VendorCluster {
            kind,
            slurm,
            ascend,
            other,
        };
        for node in NODES {
            c.set_units(node, &[]);
        }
        c
    }

    fn state(&self) -> &std::path::Path {
        match (&self.ascend, &self.other) {
            (Some(a), _) => a.state.path(),
            (_, Some(o)) => o.state.path(),
            _ => unreachable!(),
        }
    }

    /// Unit `i` of `node`'s identity: n1's are the host's own (its device files and
    /// sysfs are theirs), n2's others.
    fn id(&self, node: &str, i: usize) -> String {
        let n2 = node == "n2";
        match self.kind {
            Kind::Ascend if !n2 => AscendHost::id(i),
            Kind::Ascend => format!("NPU-0000:{:02x}:00.0", 0x41 + i * 0x10),
            Kind::Intel if !n2 => self.other.as_ref().unwrap().id(i),
            Kind::Intel => format!("XPU-0000:{:02x}:00.0", 0xa9 + i * 0x10),
            Kind::MooreThreads if !n2 => self.other.as_ref().unwrap().id(i),
            Kind::MooreThreads => format!("MTT-2b1a0c3d-6f5e-4a7b-8c9d-{:012x}", 0x200 + i),
        }
    }

    /// `node`'s units, idle; those in `sick` read unhealthy.
    fn set_units(&self, node: &str, sick: &[usize]) {
        let dir = self.state().join("nodes").join(node);
        std::fs::create_dir_all(&dir).unwrap();
        let mut health = String::new();
        let lines: String = (0..GPUS_PER_NODE)
            .map(|i| {
                let id = self.id(node, i);
                match self.kind {
                    Kind::Ascend => {
                        let h = if sick.contains(&i) { "Alarm" } else { "OK" };
                        format!("{i}, {}, 0, 65536, 0, {h}\n", id[4..].to_ascii_uppercase())
                    }
                    Kind::Intel => {
                        if sick.contains(&i) {
                            health.push_str(&format!("{i}, Critical\n"));
                        }
                        format!("{i}, {}, 0, 0\n", &id[4..])
                    }
                    Kind::MooreThreads => format!("{i}, GPU-{}, 0, 81920, 0\n", &id[4..]),
                }
            })
            .collect();
        let file = match self.kind {
            Kind::Ascend => "npus.csv",
            _ => "gpus.csv",
        };
        std::fs::write(dir.join(file), lines).unwrap();
        std::fs::write(dir.join("apps.csv"), "").unwrap();
        std::fs::write(dir.join("health.csv"), health).unwrap();
    }

    fn probe(&self) -> &'static str {
        match self.kind {
            Kind::Ascend => "npu-smi",
            Kind::Intel => "xpu-smi",
            Kind::MooreThreads => "mthreads-gmi",
        }
    }

    fn project(&self, batch: &str) -> BusyboxProject {
        let policy = self
            .slurm
            .policy("  options: [--nodelist=n1]\n", "")
            .replace("probe: nvidia-smi", &format!("probe: {}", self.probe()));
        busybox_project(batch, "").with_policy(&policy)
    }

    fn run(&self, p: &BusyboxProject, args: &[&str]) -> Run {
        let mut c = p.batch_cmd(args);
        match (&self.ascend, &self.other) {
            (Some(a), _) => a.apply(&mut c),
            (_, Some(o)) => o.apply(&mut c),
            _ => unreachable!(),
        }
        // The policy pins the lock dir (the Slurm host's).
        c.env_remove("CIBOX_GPU_LOCK_DIR");
        run(&mut c)
    }
}

fn one_batch(name: &str, gpus: u32) -> String {
    format!(
        "  {name}:\n    gpus: {gpus}\n    timeout: 1m\n    run: [{}]\n",
        serde_json::to_string(JUNIT_OK).unwrap()
    )
}

fn leased(v: &serde_json::Value) -> Vec<(String, String)> {
    v["gpus"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|g| {
            (
                g["uuid"].as_str().unwrap().to_string(),
                g["node"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn each_vendors_node_takes_exactly_the_units_slurm_allocated() {
    for kind in [Kind::Ascend, Kind::Intel, Kind::MooreThreads] {
        let c = VendorCluster::new(kind);
        let p = c.project(&one_batch("exact", 2));
        // Units 0 and 1 of n1 go to another job: Slurm allocates 2 and 3.
        let holder = Holder::new("n1", 2);
        let r = c.run(&p, &["batch", "run", "exact", "--wait", "120s"]);
        drop(holder);
        assert!(
            p.reports().join("exact/result.json").exists(),
            "{kind:?}: no record; stderr:\n{}",
            r.stderr
        );
        let v = p.result("exact");
        assert_eq!(
            leased(&v),
            [
                (c.id("n1", 2), "n1".to_string()),
                (c.id("n1", 3), "n1".to_string())
            ],
            "{kind:?}: {v}\n{}",
            r.stderr
        );
        // The hand-over found the units' device files (made with mknod): the batch ran.
        assert_eq!(r.code, 0, "{kind:?}: {}", r.stderr);
        assert_eq!(v["status"], "passed", "{kind:?}: {v}");
        assert!(p.containers().is_empty());
    }
}

#[test]
fn a_sick_unit_slurm_allocates_is_refused_not_leased() {
    // Moore Threads publishes no health reading cibox could trust (none documented).
    for kind in [Kind::Ascend, Kind::Intel] {
        let c = VendorCluster::new(kind);
        // Unit 0 of n1, the one Slurm gives first, reads sick.
        c.set_units("n1", &[0]);
        let p = c.project(&one_batch("sick", 1));
        let r = c.run(&p, &["batch", "run", "sick", "--wait", "120s"]);
        assert!(
            p.reports().join("sick/result.json").exists(),
            "{kind:?}: no record; stderr:\n{}",
            r.stderr
        );
        let v = p.result("sick");
        assert_eq!(
            v["gpus"],
            serde_json::json!([]),
            "{kind:?}: nothing leased: {v}"
        );
        let message = v["message"].as_str().unwrap_or("");
        for said in [
            "Slurm allocated job".to_string(),
            "on node n1 a GPU the driver there reads unhealthy".to_string(),
            format!("GPU 0 ({})", c.id("n1", 0)),
            "drain node n1".to_string(),
        ] {
            assert!(message.contains(&said), "{kind:?}: {said}: {message}");
        }
        assert_eq!(v["status"], "infra_error", "{kind:?}: {v}");
        assert_eq!(r.code, 5, "{kind:?}: {}", r.stderr);
        assert!(p.containers().is_empty());
    }
}
