//! `cibox gpu fake`: fake GPUs of a vendor and model, on which a multi-GPU batch leases
//! and passes in a real container on the one engine, and which nothing takes for
//! hardware (doctor, the record, the summary say so).

use crate::common::*;

/// `cibox gpu fake ARGS` in `dir`, and the variables it prints.
fn fake(dir: &std::path::Path, args: &[&str]) -> (Run, Vec<(String, String)>) {
    let r = run(cibox(dir).args(["gpu", "fake"]).args(args));
    let vars = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
        .collect();
    (r, vars)
}

#[test]
fn a_two_gpu_batch_leases_and_passes_on_fake_gpus_said_to_be_fake() {
    let p = busybox_project(
        "  dist:\n    gpus: 2\n    gpu_model: \"*A100*\"\n    timeout: 2m\n    allow_empty: true\n    run: [\"echo $CUDA_VISIBLE_DEVICES | tr , '\\\\n' | grep -c '^GPU-' | grep -qx 2\"]\n",
        "",
    );
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("fake");
    let (r, vars) = fake(
        p.project.path(),
        &[
            "--vendor",
            "nvidia",
            "--model",
            "NVIDIA A100-SXM4-80GB",
            "--count",
            "4",
            "--dir",
        ],
    );
    // --dir wants a value: refused at parse time, nothing written.
    assert_eq!(r.code, 2, "{}", r.stderr);
    let dir_s = dir.display().to_string();
    let (r, vars2) = fake(
        p.project.path(),
        &[
            "--vendor",
            "nvidia",
            "--model",
            "NVIDIA A100-SXM4-80GB",
            "--count",
            "4",
            "--dir",
            &dir_s,
        ],
    );
    r.ok();
    assert!(vars.is_empty());
    assert!(
        r.stderr
            .contains("FAKE GPUs, not real hardware: 4 × NVIDIA A100-SXM4-80GB"),
        "{}",
        r.stderr
    );
    let names: Vec<&str> = vars2.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["CIBOX_FAKE_GPUS", "CIBOX_GPU_LOCK_DIR"]);
    let with = |c: &mut std::process::Command| {
        for (k, v) in &vars2 {
            c.env(k, v);
        }
    };
    let mut doctor = p.batch_cmd_bare(&["doctor", "--json"]);
    with(&mut doctor);
    let d = run(&mut doctor);
    let v: serde_json::Value = serde_json::from_str(&d.stdout).unwrap();
    let first = &v["findings"][0];
    assert_eq!(first["check"], "fake gpus", "{v}");
    assert_eq!(first["status"], "warn", "{v}");
    assert_eq!(v["fake_gpus"], true, "{v}");
    // The table's last line says it too: read alone, it must not pass them for real.
    let mut doctor = p.batch_cmd_bare(&["doctor"]);
    with(&mut doctor);
    let d = run(&mut doctor);
    let last = d.stdout.lines().last().unwrap_or("");
    assert!(last.contains("on FAKE GPUs"), "{}", d.stdout);
    let mut batch = p.batch_cmd(&["batch", "run", "dist"]);
    with(&mut batch);
    let r = run(&mut batch);
    r.ok();
    assert!(
        r.stderr
            .contains("GPUs: FAKE (not real hardware) 2× NVIDIA A100"),
        "{}",
        r.stderr
    );
    let rec = p.result("dist");
    assert_eq!(rec["hardware"]["fake_gpus"], true, "{rec}");
    assert_eq!(rec["gpus"].as_array().unwrap().len(), 2, "{rec}");
    let summary = std::fs::read_to_string(p.reports().join("summary.md")).unwrap();
    assert!(summary.contains("FAKE (not real hardware)"), "{summary}");
    // Without the variables, the same host has no GPUs to lease.
    let r = p.run(&["batch", "run", "dist", "--wait", "0s"]);
    assert_ne!(r.code, 0, "{}", r.stderr);
}

#[test]
fn amd_gpus_can_be_faked_and_a_vendor_without_a_double_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("amd").display().to_string();
    let (r, vars) = fake(
        work.path(),
        &["--vendor", "amd", "--count", "2", "--dir", &dir],
    );
    r.ok();
    let mut status = cibox(work.path());
    status.args(["gpu", "status"]);
    for (k, v) in &vars {
        status.env(k, v);
    }
    let s = run(&mut status);
    s.ok();
    assert!(s.stdout.contains("rocm-smi"), "{}", s.stdout);
    assert!(
        s.stdout
            .starts_with("FAKE GPUs, not real hardware: 2 × AMD Instinct MI300X"),
        "{}",
        s.stdout
    );
    let rows = s
        .stdout
        .lines()
        .filter(|l| l.contains("GPU-fa4e") && l.contains("MI300X"));
    assert_eq!(rows.count(), 2, "{}", s.stdout);
    let (r, _) = fake(work.path(), &["--vendor", "acme", "--dir", &dir]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("--vendor acme: not a vendor cibox can fake (one of: nvidia, amd)"),
        "{}",
        r.stderr
    );
}
