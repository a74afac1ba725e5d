//! Sick GPUs kept out (issue 45): a unit the driver reports unhealthy (an uncorrected
//! ECC error since the driver loaded, retired pages or remapped rows pending, a
//! remapping failed) is leased to nobody, through either backend (the nvidia-smi
//! fixture's `health.csv`, the NVML double's field values), until it reads healthy;
//! `[N/A]` is not sickness; a request too few healthy units can meet fails at once
//! with exit 4 naming each; `gpu status`, `doctor` and `capacity` name them; under
//! contention only healthy units are handed out.

use std::process::{Command, Stdio};

use crate::common::*;

/// GPU 1 has 2 uncorrected ECC errors, GPU 2 a failed row remapping, GPU 3 supports
/// none of the fields (a GeForce), GPU 0 is a healthy H100.
const MIXED: &str = "1, 2, [N/A], No, No\n2, 0, [N/A], No, Yes\n3, [N/A], [N/A], [N/A], [N/A]\n";

fn cmd(h: &GpuHost, backend: Backend, args: &[&str]) -> Command {
    let mut c = h.cmd(args);
    backend.apply(&mut c);
    c
}

fn visible(h: &GpuHost, backend: Backend, count: usize, wait: &str) -> Run {
    let n = count.to_string();
    run(&mut cmd(
        h,
        backend,
        &[
            "gpu",
            "exec",
            "--count",
            &n,
            "--wait",
            wait,
            "--",
            "sh",
            "-c",
            "echo \"$CUDA_VISIBLE_DEVICES\"",
        ],
    ))
}

#[test]
fn sick_gpus_are_leased_to_nobody_named_and_back_once_healthy() {
    for backend in Backend::BOTH {
        let h = GpuHost::new(4);
        h.smi.set("health.csv", MIXED);
        let r = run(&mut cmd(&h, backend, &["gpu", "status", "--json"]));
        r.ok();
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        let verdict = |i: usize| v["gpus"][i]["verdict"].as_str().unwrap().to_string();
        assert_eq!(verdict(0), "idle", "{backend:?}: {v}");
        assert_eq!(
            verdict(1),
            "unhealthy: 2 uncorrected ECC errors since the driver loaded",
            "{backend:?}"
        );
        assert_eq!(
            verdict(2),
            "unhealthy: a memory row remapping failed",
            "{backend:?}"
        );
        assert_eq!(verdict(3), "idle", "{backend:?}: [N/A] is not sickness");
        assert_eq!(v["gpus"][1]["available"], false);
        // Two asked: the two healthy ones.
        let r = visible(&h, backend, 2, "0s");
        r.ok();
        assert_eq!(
            r.stdout.trim(),
            format!("{},{}", uuid(0), uuid(3)),
            "{backend:?}"
        );
        // Three asked of two healthy: refused at once, naming each sick GPU and why,
        // though the wait allowed is long.
        let r = visible(&h, backend, 3, "10m");
        r.fails_with(4, "cannot lease 3 GPU(s): 2 of 4 read healthy");
        for said in [
            format!("GPU 1 ({}): 2 uncorrected ECC errors", uuid(1)),
            format!("GPU 2 ({}): a memory row remapping failed", uuid(2)),
        ] {
            assert!(r.stderr.contains(&said), "{backend:?}: {}", r.stderr);
        }
        // A reset: they read healthy again, and are leased again.
        h.smi.set("health.csv", "");
        let r = visible(&h, backend, 4, "0s");
        r.ok();
        assert_eq!(r.stdout.trim().split(',').count(), 4);
    }
}

#[test]
fn a_health_field_that_cannot_be_read_fails_the_probe_closed() {
    let h = GpuHost::new(2);
    h.smi.set("health.csv", "0, 0, [N/A], Perhaps, No\n");
    let r = visible(&h, Backend::NvidiaSmi, 1, "0s");
    r.fails_with(5, "remapped_rows.pending is `Perhaps`");
    // A driver that does not know the health fields: probed without them (health
    // not read), rather than failing every probe.
    h.smi.set("health.csv", "");
    h.smi.set("no_health_fields", "");
    visible(&h, Backend::NvidiaSmi, 2, "0s").ok();
}

#[test]
fn under_contention_only_healthy_gpus_are_handed_out() {
    for backend in Backend::BOTH {
        let h = GpuHost::new(6);
        h.smi.set(
            "health.csv",
            "0, 1, [N/A], No, No\n3, 0, Yes, No, No\n4, 0, [N/A], Yes, No\n",
        );
        let seen = tempfile::tempdir().unwrap();
        let log = seen.path().join("uuids");
        let children: Vec<_> = (0..8)
            .map(|i| {
                let script = format!(
                    "echo \"$CUDA_VISIBLE_DEVICES\" >> {}; sleep 0.{}",
                    log.display(),
                    i % 3 + 1
                );
                cmd(
                    &h,
                    backend,
                    &[
                        "gpu", "exec", "--count", "1", "--wait", "2m", "--", "sh", "-c", &script,
                    ],
                )
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{backend:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let got = std::fs::read_to_string(&log).unwrap();
        let healthy = [uuid(1), uuid(2), uuid(5)];
        assert_eq!(got.lines().count(), 8, "{got}");
        for l in got.lines() {
            assert!(healthy.contains(&l.to_string()), "{backend:?}: {l} leased");
        }
    }
}

#[test]
fn doctor_and_capacity_name_the_sick_and_count_them_out() {
    require_engine();
    let h = GpuHost::new(4);
    h.smi.set("health.csv", MIXED);
    let p = Project::new(
        "version: 1\nproject: h\nimage:\n  locks: [cibox.yaml]\nbatches:\n  big: {gpus: 3, timeout: 1h, run: [x]}\nlayers:\n  \"1\": {batches: [big]}\n",
    );
    let with = |args: &[&str]| {
        let mut c = cibox(p.path());
        h.smi.apply(&mut c);
        c.env("CIBOX_GPU_LOCK_DIR", h.locks.path()).args(args);
        run(&mut c)
    };
    let r = with(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    let health = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "gpu health")
        .unwrap_or_else(|| panic!("no gpu health finding: {v}"));
    assert_eq!(health["status"], "warn", "{health}");
    let detail = health["detail"].as_str().unwrap();
    assert!(
        detail.contains("2 of 4 units unhealthy")
            && detail.contains(&format!("GPU 1 ({}): 2 uncorrected ECC errors", uuid(1)))
            && detail.contains("GPU 2 (")
            && !detail.contains("GPU 3 ("),
        "{detail}"
    );
    let r = with(&["capacity", "--require", "1"]);
    r.fails_with(4, "layer 1 cannot be admitted");
    assert!(
        r.stdout
            .contains("2 of 4 are idle and unleased (0 leased, 2 busy); unhealthy: GPU 1"),
        "{}",
        r.stdout
    );
    h.smi.set("health.csv", "");
    with(&["capacity", "--require", "1"]).ok();
}

/// A batch that prints which chip it got, on an Ascend host whose chip 0 cannot be
/// handed over (its node is a link): the attempt ends in an infrastructure error.
fn ascend_batch(retries: &str) -> String {
    format!(
        "  npu:\n    gpus: 1\n    timeout: 1m\n{retries}    run: [{}, {}]\n",
        serde_json::to_string(
            "echo \"ENV=$ASCEND_RT_VISIBLE_DEVICES\"; ls /dev | grep '^davinci[0-9]'"
        )
        .unwrap(),
        serde_json::to_string(JUNIT_OK).unwrap()
    )
}

#[test]
fn a_gpu_found_sick_after_an_infrastructure_error_is_named_and_the_retry_goes_elsewhere() {
    let h = AscendHost::new(2);
    std::fs::remove_file(h.dev.path().join("davinci0")).unwrap();
    std::os::unix::fs::symlink("/dev/null", h.dev.path().join("davinci0")).unwrap();
    h.set("calls.log", "");
    // Once: how many npu-smi calls a run whose hand-over fails makes (the last is the
    // look at its GPUs after the error).
    let p = busybox_project(&ascend_batch(""), "");
    let mut c = p.batch_cmd(&["batch", "run", "npu", "--wait", "10s"]);
    h.apply(&mut c);
    assert_eq!(run(&mut c).code, 5);
    let calls = std::fs::read_to_string(h.state.path().join("calls.log")).unwrap();
    let last = calls.lines().count();
    let rec = p.result("npu");
    assert!(
        rec["gpus"][0].get("sick").is_none(),
        "healthy all along: {rec}"
    );
    // Again, with chip 0 falling sick from that last call on: the record names it, and
    // the retry leases chip 1 and passes.
    h.set("calls.log", "");
    h.set("sick_from_call", &last.to_string());
    h.set("sick_npu", "0");
    let p = busybox_project(
        &ascend_batch("    retries: {count: 1, on: [infra_error]}\n"),
        "",
    );
    let mut c = p.batch_cmd(&["batch", "run", "npu", "--wait", "10s"]);
    h.apply(&mut c);
    let r = run(&mut c);
    r.ok();
    assert!(r.stdout.contains("davinci1"), "{}", r.stdout);
    let rec = p.result("npu");
    assert_eq!(rec["attempts"], 2, "{rec}");
    assert_eq!(rec["gpus"][0]["uuid"], AscendHost::id(1), "{rec}");
    let first = &rec["earlier_attempts"][0];
    let said = first["message"].as_str().unwrap_or_default();
    assert!(
        said.contains(&format!(
            "GPU 0 ({}) reads unhealthy: npu-smi reports its health as Alarm",
            AscendHost::id(0)
        )),
        "{rec}"
    );
    // Without a retry, the record's own entry for the GPU says why.
    h.set("calls.log", "");
    let p = busybox_project(&ascend_batch(""), "");
    let mut c = p.batch_cmd(&["batch", "run", "npu", "--wait", "10s"]);
    h.apply(&mut c);
    assert_eq!(run(&mut c).code, 5);
    let rec = p.result("npu");
    assert_eq!(
        rec["gpus"][0]["sick"], "npu-smi reports its health as Alarm",
        "{rec}"
    );
}
