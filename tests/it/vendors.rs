//! Intel GPUs (xpu-smi) and Moore Threads GPUs (mthreads-gmi), issue 45, on hosts of
//! doubles: leased by identity (PCI address, UUID), a busy one passed over, each
//! batch's container given exactly its units' device files through the real engine,
//! and a probe that cannot tell fails closed.

use crate::common::*;

const KINDS: [Other; 2] = [Other::Intel, Other::MooreThreads];

fn exec_visible(h: &OtherHost, count: usize) -> Run {
    let script = format!(
        "echo \"${}|${{CUDA_VISIBLE_DEVICES-unset}}\"",
        h.visibility()
    );
    h.run(&[
        "gpu",
        "exec",
        "--count",
        &count.to_string(),
        "--wait",
        "0s",
        "--",
        "sh",
        "-c",
        &script,
    ])
}

#[test]
fn gpu_exec_leases_by_identity_and_passes_a_busy_one_over() {
    for kind in KINDS {
        let h = OtherHost::new(kind, 4);
        let r = h.run(&["gpu", "status", "--json"]);
        r.ok();
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        assert_eq!(v["gpus"].as_array().unwrap().len(), 4, "{kind:?}: {v}");
        assert_eq!(v["gpus"][2]["uuid"], h.id(2), "{kind:?}");
        exec_visible(&h, 2).ok();
        h.set_busy(&[0]);
        let r = exec_visible(&h, 2);
        r.ok();
        assert_eq!(r.stdout.trim(), "1,2|unset", "{kind:?}");
        exec_visible(&h, 4).fails_with(4, "could not lease 4 GPU(s)");
        h.set("mode", "fail");
        exec_visible(&h, 1).fails_with(5, "exited with");
    }
}

#[test]
fn a_batch_gets_exactly_its_units_device_files() {
    for kind in KINDS {
        let h = OtherHost::new(kind, 4);
        h.set_busy(&[0]);
        let var = h.visibility();
        let script = format!(
            "echo \"NODES=$(ls /dev/dri /dev | grep -E '^(card|renderD|mtgpu)' | sort | tr '\\n' ' ')\"; \
             echo \"ENV=${var}|${{CUDA_VISIBLE_DEVICES-unset}}\"; \
             echo \"OPEN=$(for d in /dev/dri/* /dev/mtgpu*; do test -e $d || continue; test -r $d -a -w $d || echo $d; done)\""
        );
        let batch = format!(
            "  two:\n    gpus: 2\n    timeout: 1m\n    run: [{}, {}]\n",
            serde_json::to_string(&script).unwrap(),
            serde_json::to_string(JUNIT_OK).unwrap()
        );
        let p = busybox_project(&batch, "");
        let mut c = p.batch_cmd(&["batch", "run", "two", "--wait", "30s"]);
        h.apply(&mut c);
        let r = run(&mut c);
        r.ok();
        let mut want: Vec<String> = h.nodes(1).into_iter().chain(h.nodes(2)).collect();
        want.sort();
        let line = |key: &str| {
            r.stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{kind:?}: no {key}= in {}", r.stdout))
                .trim()
                .to_string()
        };
        assert_eq!(line("NODES"), want.join(" "), "{kind:?}: {}", r.stdout);
        assert_eq!(line("ENV"), "0,1|unset", "{kind:?}");
        assert_eq!(line("OPEN"), "", "{kind:?}: the group is given");
        let rec = p.result("two");
        assert_eq!(rec["gpus"][0]["uuid"], h.id(1), "{kind:?}: {rec}");
        assert!(p.containers().is_empty());
    }
}
