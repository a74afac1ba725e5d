//! Sick AMD and Intel GPUs kept out (issue 45), on hosts of doubles: rocm-smi's RAS
//! table (an uncorrectable ECC error counted since the driver loaded, a block in an
//! error state) and xpu-smi's memory health (`Warning`, `Critical`) make a GPU sick;
//! a card without RAS, or memory health `Unknown`, is not sick; a sick GPU is leased to
//! nobody, named by `gpu status` and by a refusal (exit 4); a batch through the real
//! engine gets exactly the healthy units' device files; under contention only healthy
//! units are handed out; a reading that cannot be told fails the probe closed. Intel's
//! process list (`xpu-smi ps`) keeps a GPU with a process off, though it holds no
//! memory yet, and xpu-smi's own entries do not.

use std::process::Stdio;

use crate::amd::{looking_batch, said};
use crate::common::*;

fn verdicts(v: &serde_json::Value) -> Vec<String> {
    v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["verdict"].as_str().unwrap().to_string())
        .collect()
}

fn amd_exec(h: &AmdHost, count: usize, wait: &str) -> Run {
    h.run(&[
        "gpu",
        "exec",
        "--count",
        &count.to_string(),
        "--wait",
        wait,
        "--",
        "sh",
        "-c",
        "echo \"$ROCR_VISIBLE_DEVICES\"",
    ])
}

/// GPU 1: 2 uncorrectable errors in UMC; GPU 2: GFX poisoned; GPU 3: correctable
/// errors only (healthy).
const AMD_MIXED: &str = "1, UMC, ENABLED, 0, 2\n2, GFX, POSITION, , \n3, UMC, ENABLED, 7, 0\n";

#[test]
fn amd_sick_gpus_are_leased_to_nobody_and_a_batch_gets_only_healthy_ones() {
    let h = AmdHost::new(4);
    h.set("ras.csv", AMD_MIXED);
    let v = h.status();
    assert_eq!(
        verdicts(&v),
        [
            "idle",
            "unhealthy: 2 uncorrectable ECC errors in UMC since the driver loaded",
            "unhealthy: RAS reports poison: the firmware isolated a page in GFX",
            "idle",
        ],
        "{v}"
    );
    let r = amd_exec(&h, 2, "0s");
    r.ok();
    assert_eq!(
        r.stdout.trim(),
        format!("{},{}", AmdHost::id(0), AmdHost::id(3))
    );
    let r = amd_exec(&h, 3, "10m");
    r.fails_with(4, "cannot lease 3 GPU(s): 2 of 4 read healthy");
    for said in [
        format!(
            "GPU 1 ({}): 2 uncorrectable ECC errors in UMC",
            AmdHost::id(1)
        ),
        format!("GPU 2 ({}): RAS reports poison", AmdHost::id(2)),
    ] {
        assert!(r.stderr.contains(&said), "{}", r.stderr);
    }
    // Through the real engine: exactly the healthy GPUs' nodes.
    let p = busybox_project(&looking_batch("two", 2), "");
    let mut c = p.batch_cmd(&["batch", "run", "two", "--wait", "30s"]);
    h.apply(&mut c);
    let r = run(&mut c);
    r.ok();
    let mut want: Vec<String> = h.nodes(0).into_iter().chain(h.nodes(3)).collect();
    want.sort();
    assert_eq!(said(&r.stdout, "DRI"), want.join(" "), "{}", r.stdout);
    assert!(p.containers().is_empty());
    // A card without RAS: nothing to tell, nothing sick.
    h.set("ras.csv", "");
    h.set("ras", "unsupported");
    amd_exec(&h, 4, "0s").ok();
    // rocm-smi 5.6's heading (its count columns named right): read alike.
    h.set("ras", "newheading");
    h.set("ras.csv", AMD_MIXED);
    assert_eq!(verdicts(&h.status())[1], verdicts(&v)[1]);
    // No RAS table, or a count that is not one: the probe fails closed.
    h.set("ras", "missing");
    amd_exec(&h, 1, "0s").fails_with(5, "no RAS Info section");
    // rocm-smi exits 2 on every call of the double (as on real cards: the blocks the
    // driver does not count); an error it logs makes the answer untrusted.
    h.set("ras", "loud");
    amd_exec(&h, 1, "0s").fails_with(5, "ecc err count: RSMI_STATUS_NOT_SUPPORTED");
    h.set("ras", "ok");
    h.set("ras.csv", "0, UMC, ENABLED, 0, many\n");
    amd_exec(&h, 1, "0s").fails_with(5, "uncorrectable count `many` is not a number");
}

fn intel_exec(h: &OtherHost, count: usize, wait: &str) -> Run {
    h.run(&[
        "gpu",
        "exec",
        "--count",
        &count.to_string(),
        "--wait",
        wait,
        "--",
        "sh",
        "-c",
        "echo \"$ZE_AFFINITY_MASK\"",
    ])
}

#[test]
fn intel_sick_and_busy_gpus_are_passed_over_and_a_batch_gets_only_healthy_ones() {
    let h = OtherHost::new(Other::Intel, 5);
    // GPU 0: a process (no memory in use yet); 1: memory Critical; 2: memory Warning;
    // 3: memory health Unknown (not sickness); 4: healthy.
    h.set("apps.csv", "4242, 0, 0\n");
    h.set("health.csv", "1, Critical\n2, Warning\n3, Unknown\n");
    let r = h.run(&["gpu", "status", "--json"]);
    r.ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let got = verdicts(&v);
    assert!(got[0].contains("4242"), "{v}");
    assert_eq!(
        got[1],
        "unhealthy: xpu-smi reports its memory health as Critical: Device should be replaced due to excessive uncorrectable errors."
    );
    assert!(got[2].starts_with("unhealthy: xpu-smi reports its memory health as Warning"));
    assert_eq!((got[3].as_str(), got[4].as_str()), ("idle", "idle"), "{v}");
    let r = intel_exec(&h, 2, "0s");
    r.ok();
    assert_eq!(r.stdout.trim(), "3,4");
    let r = intel_exec(&h, 4, "10m");
    r.fails_with(4, "cannot lease 4 GPU(s): 3 of 5 read healthy");
    assert!(
        r.stderr
            .contains(&format!("GPU 1 ({}): xpu-smi reports", h.id(1))),
        "{}",
        r.stderr
    );
    // Through the real engine: exactly the healthy, idle GPUs' nodes.
    let script = "echo \"NODES=$(ls /dev/dri | sort | tr '\\n' ' ')\"";
    let batch = format!(
        "  two:\n    gpus: 2\n    timeout: 1m\n    run: [{}, {}]\n",
        serde_json::to_string(script).unwrap(),
        serde_json::to_string(JUNIT_OK).unwrap()
    );
    let p = busybox_project(&batch, "");
    let mut c = p.batch_cmd(&["batch", "run", "two", "--wait", "30s"]);
    h.apply(&mut c);
    let r = run(&mut c);
    r.ok();
    let mut want: Vec<String> = h.nodes(3).into_iter().chain(h.nodes(4)).collect();
    want.sort();
    assert_eq!(said(&r.stdout, "NODES"), want.join(" "), "{}", r.stdout);
    assert!(p.containers().is_empty());
    // The process gone and the memory replaced: all five again.
    h.set("apps.csv", "");
    h.set("health.csv", "");
    intel_exec(&h, 5, "0s").ok();
    // A health that cannot be told fails closed.
    h.set("health.csv", "0, Fine\n");
    intel_exec(&h, 1, "0s").fails_with(5, "memory health `Fine`");
}

#[test]
fn under_contention_only_healthy_amd_and_intel_gpus_are_handed_out() {
    let amd = AmdHost::new(6);
    amd.set(
        "ras.csv",
        "0, UMC, ENABLED, 0, 1\n3, SDMA, MULT, 0, 0\n4, HDP, ENABLED, 0, 9\n",
    );
    let intel = OtherHost::new(Other::Intel, 6);
    intel.set("health.csv", "0, Critical\n3, Warning\n4, Critical\n");
    let seen = tempfile::tempdir().unwrap();
    let log = seen.path().join("ids");
    for (who, var) in [
        ("amd", "ROCR_VISIBLE_DEVICES"),
        ("intel", "ZE_AFFINITY_MASK"),
    ] {
        let children: Vec<_> = (0..8)
            .map(|i| {
                let script = format!(
                    "echo \"${var}\" >> {}; sleep 0.{}",
                    log.display(),
                    i % 3 + 1
                );
                let args = [
                    "gpu", "exec", "--count", "1", "--wait", "2m", "--", "sh", "-c", &script,
                ];
                let mut c = if who == "amd" {
                    amd.cmd(&args)
                } else {
                    let mut c = cibox(intel.work.path());
                    intel.apply(&mut c);
                    c.args(args);
                    c
                };
                c.stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{who}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let got = std::fs::read_to_string(&log).unwrap();
        std::fs::remove_file(&log).unwrap();
        let healthy: Vec<String> = if who == "amd" {
            [1, 2, 5].iter().map(|i| AmdHost::id(*i)).collect()
        } else {
            ["1", "2", "5"].iter().map(|s| s.to_string()).collect()
        };
        assert_eq!(got.lines().count(), 8, "{who}: {got}");
        for l in got.lines() {
            assert!(healthy.contains(&l.to_string()), "{who}: {l} leased");
        }
    }
}
