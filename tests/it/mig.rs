//! NVIDIA MIG slices as leasable units (issue 34), through both probe backends (the
//! NVML double enumerates slices; nvidia-smi's `-L` lists them): slices go by their
//! `MIG-…` UUIDs to requests for their model (`*MIG 1g.18gb`) and are released with
//! the lease; a GPU is never leased whole while one of its slices is, nor the reverse,
//! whatever a probe in between says; a batch's container asks the runtime for the
//! slice.

use std::process::{Child, Stdio};

use crate::common::*;

const PROFILES: [&str; 4] = ["1g.18gb", "1g.18gb", "1g.18gb", "3g.71gb"];

/// Two H200s: GPU 0 in MIG mode (three 1g.18gb slices and a 3g.71gb), GPU 1 whole.
fn mig_host() -> MigHost {
    MigHost::new(2, &PROFILES)
}

/// `gpu exec [--model M] --count N --wait 0s -- echo $CUDA_VISIBLE_DEVICES`.
fn visible(h: &MigHost, backend: Backend, model: Option<&str>, count: usize) -> Run {
    let count = count.to_string();
    let mut args = vec!["gpu", "exec", "--count", &count, "--wait", "0s"];
    if let Some(m) = model {
        args.extend(["--model", m]);
    }
    args.extend(["--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"]);
    let mut cmd = h.host.cmd(&args);
    backend.apply(&mut cmd);
    run(&mut cmd)
}

/// Holds what `args` (after `gpu exec`) leases, running `sleep 60`; returns once the
/// lease is granted (its command has started).
fn hold(h: &MigHost, backend: Backend, args: &[&str]) -> Child {
    let ready = h.host.work.path().join(format!("ready-{}", nonce()));
    let script = format!("touch {}; exec sleep 60", ready.display());
    let mut all = vec!["gpu", "exec"];
    all.extend(args);
    all.extend(["--", "sh", "-c", &script]);
    let mut cmd = h.host.cmd(&all);
    backend.apply(&mut cmd);
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_until(30, || ready.exists() || child.try_wait().unwrap().is_some()),
        "no lease within 30s"
    );
    assert!(ready.exists(), "the holder ended without its lease");
    child
}

fn stop(mut child: Child) {
    unsafe { nix::libc::kill(child.id() as i32, nix::libc::SIGTERM) };
    child.wait().unwrap();
}

/// The UUIDs `gpu status` shows held.
fn held(h: &MigHost) -> Vec<String> {
    h.host.status()["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| !g["lease_holder"].is_null())
        .map(|g| g["uuid"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn slices_are_leased_by_their_uuid_to_requests_for_their_model_through_either_backend() {
    let h = mig_host();
    let s = |j| MigHost::slice(0, j);
    for backend in Backend::BOTH {
        let r = visible(&h, backend, Some("*MIG 1g.18gb"), 2);
        r.ok();
        assert_eq!(r.stdout.trim(), format!("{},{}", s(0), s(1)), "{backend:?}");
        let r = visible(&h, backend, Some("NVIDIA H200 MIG 3g*"), 1);
        r.ok();
        assert_eq!(r.stdout.trim(), s(3), "{backend:?}");
        // Whole GPUs only, without a model or with one that does not say MIG.
        let r = visible(&h, backend, None, 1);
        r.ok();
        assert_eq!(r.stdout.trim(), uuid(1), "{backend:?}");
        let r = visible(&h, backend, Some("*H200*"), 1);
        r.ok();
        assert_eq!(r.stdout.trim(), uuid(1), "{backend:?}");
        visible(&h, backend, None, 2).fails_with(
            4,
            "2 whole GPU(s) asked for; the pool has 1, and MIG slices, which go only to a request for their model",
        );
        visible(&h, backend, Some("*MIG 1g.18gb"), 4).fails_with(
            4,
            "4 GPU(s) of model `*MIG 1g.18gb` asked for; the pool has 3",
        );
    }
    // Each slice is a row of its own, named by its model.
    let v = h.host.status();
    let rows: Vec<(String, String)> = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["uuid"].as_str().unwrap().to_string(),
                g["model"].as_str().unwrap_or("-").to_string(),
            )
        })
        .collect();
    assert_eq!(rows.len(), 5, "{v}");
    assert!(
        rows.contains(&(s(3), "NVIDIA H200 MIG 3g.71gb".to_string())),
        "{rows:?}"
    );
    // A pool may name a slice.
    let mut c = h.host.cmd(&[
        "gpu",
        "exec",
        "--model",
        "*MIG*",
        "--count",
        "1",
        "--wait",
        "0s",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    c.env("CIBOX_GPU_POOL", s(2));
    let r = run(&mut c);
    r.ok();
    assert_eq!(r.stdout.trim(), s(2));
    assert!(held(&h).is_empty());
}

#[test]
fn a_busy_slice_is_passed_over_and_nvidia_smi_judges_its_whole_gpu() {
    let h = mig_host();
    h.host
        .smi
        .set("apps.csv", &format!("{}, 77, 300\n", MigHost::slice(0, 0)));
    // NVML knows the process is in slice 0: slice 1 is free.
    let r = visible(&h, Backend::Nvml, Some("*MIG 1g.18gb"), 1);
    r.ok();
    assert_eq!(r.stdout.trim(), MigHost::slice(0, 1));
    // nvidia-smi names only the GPU: every slice of it counts as busy.
    visible(&h, Backend::NvidiaSmi, Some("*MIG 1g.18gb"), 1).fails_with(4, "compute process 77");
    // The GPU left whole is not affected.
    visible(&h, Backend::NvidiaSmi, None, 1).ok();
}

#[test]
fn a_gpu_leased_whole_keeps_its_slices_from_being_leased() {
    let h = mig_host();
    for backend in Backend::BOTH {
        // GPU 1 is leased whole; then MIG mode is turned on for it.
        let holder = hold(&h, backend, &["--devices", "1"]);
        assert_eq!(held(&h), [uuid(1)], "{}", h.host.status());
        h.set_slices(1, &["1g.18gb"]);
        // Four 1g.18gb slices asked: three of GPU 0 and GPU 1's, which its GPU's lease
        // holds.
        visible(&h, backend, Some("*MIG 1g.18gb"), 4).fails_with(4, "could not lease 4 GPU(s)");
        let slice = MigHost::slice(1, 0);
        assert!(held(&h).contains(&slice), "{backend:?}: {:?}", held(&h));
        stop(holder);
        let r = visible(&h, backend, Some("*MIG 1g.18gb"), 4);
        r.ok();
        assert!(r.stdout.trim().ends_with(&slice), "{}", r.stdout);
        h.set_slices(1, &[]);
        assert!(held(&h).is_empty());
    }
}

#[test]
fn a_leased_slice_keeps_its_gpu_from_being_leased_whole() {
    let h = mig_host();
    for backend in Backend::BOTH {
        let holder = hold(&h, backend, &["--model", "*MIG 3g.71gb", "--count", "1"]);
        assert_eq!(held(&h), [MigHost::slice(0, 3)]);
        // MIG mode is turned off: GPU 0 is a whole GPU to the probe now.
        h.set_slices(0, &[]);
        let mut c = h.host.cmd(&[
            "gpu",
            "exec",
            "--devices",
            "0",
            "--wait",
            "0s",
            "--",
            "true",
        ]);
        backend.apply(&mut c);
        run(&mut c).fails_with(4, "could not lease 1 GPU(s)");
        stop(holder);
        let mut c = h.host.cmd(&[
            "gpu",
            "exec",
            "--devices",
            "0",
            "--wait",
            "0s",
            "--",
            "true",
        ]);
        backend.apply(&mut c);
        run(&mut c).ok();
        h.set_slices(0, &PROFILES);
    }
}

#[test]
fn slices_and_whole_gpus_at_once_never_overlap() {
    let h = mig_host();
    let log = h.host.work.path().join("intervals.log");
    let mut children = Vec::new();
    for i in 0..24 {
        let (model, count) = [
            ("*MIG 1g.18gb", 1),
            ("*MIG*", 2),
            ("*H200", 1),
            ("*MIG 3g*", 1),
        ][i % 4];
        let script = format!(
            "s=$(date +%s%N); sleep 0.02; e=$(date +%s%N); echo \"$s $e $CUDA_VISIBLE_DEVICES\" >> {}",
            log.display()
        );
        let count = count.to_string();
        let mut cmd = h.host.cmd(&[
            "gpu", "exec", "--model", model, "--count", &count, "--wait", "300s", "--", "sh", "-c",
            &script,
        ]);
        Backend::Nvml.apply(&mut cmd);
        children.push(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let jobs: Vec<(u128, u128, Vec<String>)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].split(',').map(str::to_string).collect(),
            )
        })
        .collect();
    assert_eq!(jobs.len(), 24);
    // A unit and the GPU it is a slice of are the same hardware.
    let gpu_of = |u: &str| {
        if u.starts_with("MIG-") {
            uuid(0)
        } else {
            u.to_string()
        }
    };
    for (i, a) in jobs.iter().enumerate() {
        for b in &jobs[i + 1..] {
            let together = a.0 < b.1 && b.0 < a.1;
            let shared = a.2.iter().any(|u| b.2.contains(u))
                || a.2
                    .iter()
                    .any(|u| !u.starts_with("MIG-") && b.2.iter().any(|v| gpu_of(v) == *u))
                || b.2
                    .iter()
                    .any(|u| !u.starts_with("MIG-") && a.2.iter().any(|v| gpu_of(v) == *u));
            assert!(!(together && shared), "{a:?} and {b:?} overlap");
        }
    }
    assert!(held(&h).is_empty());
}

#[test]
fn a_batch_on_a_slice_asks_the_runtime_for_it_and_records_it() {
    let h = mig_host();
    let p = busybox_project(
        &format!(
            "  s:\n    gpus: 1\n    gpu_model: \"*MIG 1g.18gb\"\n    timeout: 1m\n    run: [{}]\n",
            serde_json::to_string(JUNIT_OK).unwrap()
        ),
        "",
    );
    for backend in Backend::BOTH {
        let mut c = p.batch_cmd(&["batch", "run", "s", "--wait", "30s"]);
        h.host.smi.apply(&mut c);
        backend.apply(&mut c);
        c.env("CIBOX_GPU_LOCK_DIR", h.host.locks.path());
        let r = run(&mut c);
        // The slice exists on no engine: created with the device request, it cannot start.
        assert_eq!(r.code, 5, "{backend:?}: {}", r.stderr);
        let rec = p.result("s");
        assert!(
            rec["message"].as_str().unwrap().contains("could not start"),
            "{rec}"
        );
        let unit = rec["gpus"][0]["uuid"].as_str().unwrap();
        assert!(
            (0..3).any(|j| unit == MigHost::slice(0, j)),
            "{backend:?}: {rec}"
        );
        assert_eq!(
            rec["hardware"]["gpus"][0]["name"], "NVIDIA H200 MIG 1g.18gb",
            "{backend:?}: {rec}"
        );
        assert!(p.containers().is_empty());
        assert!(held(&h).is_empty());
    }
}

/// `gpu exec --devices A,B -- echo $CUDA_VISIBLE_DEVICES`, trying once.
fn devices(h: &MigHost, backend: Backend, list: &str) -> Run {
    let mut c = h.host.cmd(&[
        "gpu",
        "exec",
        "--devices",
        list,
        "--wait",
        "0s",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    backend.apply(&mut c);
    run(&mut c)
}

/// Issue 48: `--devices` names a slice by its UUID (alone, with another slice, or with a
/// whole GPU), as the docs say; an index still names only a whole GPU.
#[test]
fn devices_name_a_slice_by_its_uuid() {
    let h = mig_host();
    let s = |j| MigHost::slice(0, j);
    for backend in Backend::BOTH {
        let r = devices(&h, backend, &s(1));
        r.ok();
        assert_eq!(r.stdout.trim(), s(1), "{backend:?}");
        let list = format!("{},{}", s(3), uuid(1));
        let r = devices(&h, backend, &list);
        r.ok();
        assert_eq!(r.stdout.trim(), list, "{backend:?}");
        // A slice not of this host is still refused.
        devices(&h, backend, &MigHost::slice(0, 7)).fails_with(2, &MigHost::slice(0, 7));
        assert!(held(&h).is_empty());
    }
    // A pool of slices only.
    let mut c = h.host.cmd(&[
        "gpu",
        "exec",
        "--devices",
        &s(2),
        "--wait",
        "0s",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    c.env("CIBOX_GPU_POOL", format!("{},{}", s(2), s(3)));
    let r = run(&mut c);
    r.ok();
    assert_eq!(r.stdout.trim(), s(2));
}

/// Issue 48: a wait behind a leased slice names its holder, whether it waits for the
/// slice or for its GPU whole (MIG mode switched off meanwhile), as a wait behind a
/// leased GPU does.
#[test]
fn a_wait_behind_a_leased_slice_names_its_holder() {
    let h = mig_host();
    for backend in Backend::BOTH {
        let holder = hold(
            &h,
            backend,
            &["--devices", &MigHost::slice(0, 3), "--wait", "0s"],
        );
        let pid = format!("by (slice {}) pid {} ", MigHost::slice(0, 3), holder.id());
        let r = devices(&h, backend, &MigHost::slice(0, 3));
        r.fails_with(4, "could not lease 1 GPU(s)");
        assert!(r.stderr.contains(&pid), "{backend:?}: {}", r.stderr);
        h.set_slices(0, &[]);
        let r = devices(&h, backend, "0");
        r.fails_with(4, "could not lease 1 GPU(s)");
        assert!(r.stderr.contains(&pid), "{backend:?}: {}", r.stderr);
        assert!(r.stderr.contains(&MigHost::slice(0, 3)), "{}", r.stderr);
        stop(holder);
        h.set_slices(0, &PROFILES);
    }
}
