//! GPU models on a mixed host (issue 34): `gpu exec --model GLOB` leases only GPUs of
//! the model the probe reports, through both probe backends; a model the host lacks is
//! exit 4 naming the models it has; models that cannot be read fail closed.

use std::io::BufRead;
use std::process::Stdio;

use crate::common::*;

const H100: &str = "NVIDIA H100 80GB HBM3";
const A100: &str = "NVIDIA A100-SXM4-80GB";

/// Four GPUs: 0 and 2 H100s (the fixture's default model), 1 and 3 A100s.
fn mixed_host() -> GpuHost {
    let h = GpuHost::new(4);
    h.smi.set("gpu_name.1", A100);
    h.smi.set("gpu_name.3", A100);
    h
}

/// `gpu exec --model MODEL --count N --wait 0s -- echo $CUDA_VISIBLE_DEVICES`.
fn visible(h: &GpuHost, backend: Backend, model: &str, count: usize) -> Run {
    let count = count.to_string();
    let mut cmd = h.cmd(&[
        "gpu",
        "exec",
        "--model",
        model,
        "--count",
        &count,
        "--wait",
        "0s",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    backend.apply(&mut cmd);
    run(&mut cmd)
}

#[test]
fn a_model_leases_only_its_own_gpus_through_either_backend() {
    let h = mixed_host();
    for backend in Backend::BOTH {
        let r = visible(&h, backend, "*A100*", 2);
        r.ok();
        assert_eq!(
            r.stdout.trim(),
            format!("{},{}", uuid(1), uuid(3)),
            "{backend:?}"
        );
        let r = visible(&h, backend, "nvidia h100*", 1);
        r.ok();
        assert_eq!(r.stdout.trim(), uuid(0), "{backend:?}");
        // Without a model, any GPU: the lowest index first.
        let mut any = h.cmd(&["gpu", "exec", "--count", "4", "--wait", "0s", "--", "true"]);
        backend.apply(&mut any);
        run(&mut any).ok();
    }
    assert!(h.leased().is_empty());
}

#[test]
fn one_model_held_leaves_the_other_servable_and_its_own_requests_waiting() {
    let h = mixed_host();
    // Both H100s held.
    let mut holder = h
        .cmd(&[
            "gpu", "exec", "--model", "*H100*", "--count", "2", "--", "sleep", "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(20, || h.leased() == [0, 2]));
    // An H100 is not free: the free A100s are not handed out instead.
    visible(&h, Backend::NvidiaSmi, "*H100*", 1).fails_with(4, "could not lease 1 GPU(s)");
    // A request for an H100 waits at the head of the queue...
    let mut waiter = h
        .cmd(&[
            "gpu", "exec", "--model", "*H100*", "--count", "1", "--wait", "120s", "--", "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(20, || h.queued_with_pool() == 1));
    // ...and holds up no request for the A100s, which it cannot use.
    let r = run(&mut h.cmd(&[
        "gpu",
        "exec",
        "--model",
        "*A100*",
        "--count",
        "2",
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]));
    r.ok();
    assert_eq!(r.stdout.trim(), format!("{},{}", uuid(1), uuid(3)));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "the H100 waiter ended while both H100s were held"
    );
    unsafe { nix::libc::kill(holder.id() as i32, nix::libc::SIGTERM) };
    holder.wait().unwrap();
    // The H100s come free: the waiter gets one.
    assert!(waiter.wait().unwrap().success());
    assert!(h.leased().is_empty());
}

#[test]
fn a_model_the_host_lacks_is_exit_4_naming_the_models_it_has() {
    let h = mixed_host();
    for backend in Backend::BOTH {
        visible(&h, backend, "*B200*", 1).fails_with(
            4,
            &format!("no GPU of model `*B200*` in the pool; it has 2 × {H100}, 2 × {A100}"),
        );
        visible(&h, backend, "*A100*", 3)
            .fails_with(4, "3 GPU(s) of model `*A100*` asked for; the pool has 2");
        // A glob matches the whole name: a bare `H100` is no model here.
        visible(&h, backend, "H100", 1).fails_with(4, "no GPU of model `H100`");
    }
    // The pool bounds it: GPUs outside the pool are not counted.
    let mut cmd = h.cmd(&[
        "gpu", "exec", "--model", "*A100*", "--count", "1", "--wait", "0s", "--", "true",
    ]);
    cmd.env("CIBOX_GPU_POOL", "0,2");
    run(&mut cmd).fails_with(4, &format!("it has 2 × {H100}"));
    assert!(h.leased().is_empty());
    assert_eq!(h.queued(), 0);
}

#[test]
fn models_that_cannot_be_read_lease_nothing_for_a_model() {
    let h = mixed_host();
    h.smi.set("no_hardware", "");
    visible(&h, Backend::NvidiaSmi, "*H100*", 1).fails_with(
        5,
        "GPU model `*H100*` asked for, and the GPUs' models could not be read",
    );
    // A request without a model does not need them.
    let mut any = h.cmd(&["gpu", "exec", "--count", "1", "--wait", "0s", "--", "true"]);
    Backend::NvidiaSmi.apply(&mut any);
    run(&mut any).ok();
    // `gpu status` still answers, its models blank.
    let v = h.status();
    assert!(v["gpus"][0]["model"].is_null(), "{v}");
    assert!(h.leased().is_empty());
    assert_eq!(h.queued(), 0);
}

#[test]
fn status_names_each_gpus_model() {
    let h = mixed_host();
    let v = h.status();
    let models: Vec<&str> = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["model"].as_str().unwrap())
        .collect();
    assert_eq!(models, [H100, A100, H100, A100]);
    let r = h.run(&["gpu", "status"]);
    r.ok();
    assert!(r.stdout.contains("MODEL"), "{}", r.stdout);
    assert!(r.stdout.contains(A100), "{}", r.stdout);
}

#[test]
fn a_mixed_host_serves_both_models_at_once_without_overlap() {
    let h = mixed_host();
    let log = h.work.path().join("intervals.log");
    let mut children = Vec::new();
    for i in 0..40 {
        let (model, count) = [("*H100*", 1), ("*A100*", 1), ("*H100*", 2), ("*A100*", 2)][i % 4];
        let script = format!(
            "s=$(date +%s%N); sleep 0.02; e=$(date +%s%N); echo \"{model} $s $e $CUDA_VISIBLE_DEVICES\" >> {}",
            log.display()
        );
        let count = count.to_string();
        children.push(
            h.cmd(&[
                "gpu", "exec", "--model", model, "--count", &count, "--wait", "300s", "--", "sh",
                "-c", &script,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        );
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let jobs: Vec<(String, u128, u128, Vec<String>)> =
        std::io::BufReader::new(std::fs::File::open(&log).unwrap())
            .lines()
            .map(|l| {
                let l = l.unwrap();
                let f: Vec<&str> = l.split(' ').collect();
                (
                    f[0].to_string(),
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[3].split(',').map(str::to_string).collect(),
                )
            })
            .collect();
    assert_eq!(jobs.len(), 40);
    let h100s = [uuid(0), uuid(2)];
    let a100s = [uuid(1), uuid(3)];
    for (model, _, _, gpus) in &jobs {
        let own = if model == "*H100*" { &h100s } else { &a100s };
        assert!(
            gpus.iter().all(|g| own.contains(g)),
            "a {model} job got {gpus:?}"
        );
    }
    let mut overlaps = Vec::new();
    for (i, a) in jobs.iter().enumerate() {
        for b in &jobs[i + 1..] {
            if a.1 < b.2 && b.1 < a.2 && a.3.iter().any(|g| b.3.contains(g)) {
                overlaps.push(format!("{a:?} and {b:?}"));
            }
        }
    }
    assert!(overlaps.is_empty(), "GPUs shared: {overlaps:?}");
    assert!(h.leased().is_empty());
}

const MODELS_MANIFEST: &str = r#"version: 1
project: models
image: {locks: [cibox.yaml]}
defaults: {timeout: 10m, run: [x]}
batches:
  h100-pair: {gpus: 2, gpu_model: "*H100*"}
  a100-one: {gpus: 1, gpu_model: "*A100*"}
  b200-one: {gpus: 1, gpu_model: "*B200*"}
  cpu: {gpus: 0}
layers:
  h: {batches: [h100-pair, cpu]}
  a: {batches: [a100-one]}
  b: {batches: [b200-one]}
"#;

#[test]
fn capacity_and_doctor_judge_each_model_on_its_own() {
    let h = mixed_host();
    let p = Project::new(MODELS_MANIFEST);
    let cmd = |args: &[&str]| {
        let mut c = cibox(p.path());
        h.smi.apply(&mut c);
        c.env("CIBOX_GPU_LOCK_DIR", h.locks.path()).args(args);
        c
    };
    // One H100 leased: two GPUs are free, but only one H100.
    let mut holder = h
        .cmd(&[
            "gpu", "exec", "--model", "*H100*", "--count", "1", "--", "sleep", "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(20, || h.leased() == [0]));
    // batch list names each batch's model.
    let r = run(&mut cmd(&["batch", "list"]));
    r.ok();
    assert!(
        r.rows()
            .iter()
            .any(|l| l.starts_with("h100-pair 2 (*H100*) 10m")),
        "{}",
        r.stdout
    );
    let r = run(&mut cmd(&["batch", "list", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["batches"][1]["gpu_model"], "*A100*", "{v}");
    assert!(v["batches"][3]["gpu_model"].is_null(), "{v}");
    let r = run(&mut cmd(&["capacity"]));
    r.ok();
    let rows = r.rows();
    assert!(
        rows.contains(
            &"h no 2 batch h100-pair needs 2 GPUs of model `*H100*`; 1 of 2 are idle and unleased"
                .to_string()
        ),
        "{}",
        r.stdout
    );
    assert!(
        rows.iter().any(|l| l.starts_with("a yes 1")),
        "{}",
        r.stdout
    );
    assert!(
        rows.iter()
            .any(|l| l.starts_with("b no 1 batch b200-one: no GPU of model `*B200*`")),
        "{}",
        r.stdout
    );
    run(&mut cmd(&["capacity", "--require", "h"])).fails_with(
        4,
        "layer h cannot be admitted now: batch h100-pair needs 2 GPUs of model",
    );
    run(&mut cmd(&["capacity", "--require", "a"])).ok();
    unsafe { nix::libc::kill(holder.id() as i32, nix::libc::SIGTERM) };
    holder.wait().unwrap();
    // doctor names the host's models and warns of the one it lacks.
    let r = run(&mut cmd(&["doctor", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let finding = |check: &str| {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == check)
            .cloned()
            .unwrap_or_else(|| panic!("no {check} finding: {v}"))
    };
    let probe = finding("gpu probe");
    assert!(
        probe["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("4 GPUs (2 × {H100}, 2 × {A100})")),
        "{probe}"
    );
    let models = finding("gpu models");
    assert_eq!(models["status"], "warn", "{models}");
    let detail = models["detail"].as_str().unwrap();
    assert!(
        detail.contains("no GPU here of model `*B200*` (batches b200-one)"),
        "{detail}"
    );
}
