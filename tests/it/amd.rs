//! AMD GPUs through ROCm (issue 34), on an 8-GPU host of doubles: the rocm-smi double,
//! a sysfs of its own and device files made with mknod. Leases go by unique ID; a
//! batch's container gets `/dev/kfd` and exactly its GPUs' render and card nodes
//! (found in sysfs, not by index) and nothing of any other GPU; a busy GPU is passed
//! over; a probe or a hand-over that cannot tell fails closed; a manifest still cannot
//! map AMD's device files itself.

use std::process::Stdio;

use crate::common::*;

/// `gpu exec --count N --wait 0s -- sh -c 'echo …'` on `h`, printing the variables
/// that name the GPUs.
fn exec_visible(h: &AmdHost, count: usize) -> Run {
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
        "echo \"$ROCR_VISIBLE_DEVICES|$HIP_VISIBLE_DEVICES|${CUDA_VISIBLE_DEVICES-unset}\"",
    ])
}

#[test]
fn gpu_exec_leases_amd_gpus_by_unique_id_and_passes_a_busy_one_over() {
    let h = AmdHost::new(8);
    // `auto` chooses rocm-smi: CIBOX_ROCM_SMI names one.
    let v = h.status();
    assert!(v["probe"].as_str().unwrap().starts_with("rocm-smi"), "{v}");
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8, "{v}");
    assert_eq!(gpus[3]["uuid"], AmdHost::id(3));
    assert_eq!(gpus[3]["model"], "AMD Instinct MI300X");
    let r = exec_visible(&h, 2);
    r.ok();
    assert_eq!(
        r.stdout.trim(),
        format!("{},{}|0,1|unset", AmdHost::id(0), AmdHost::id(1))
    );
    // A compute process on GPU 0, and GPU 1's VRAM in use: both passed over.
    h.set("apps.csv", "4242, 0\n");
    let mut gpus: String = (0..8)
        .map(|i| format!("{i}, {}, 0, 196592, 0\n", &AmdHost::id(i)[4..]))
        .collect();
    gpus = gpus.replacen(
        &format!("1, {}, 0,", &AmdHost::id(1)[4..]),
        &format!("1, {}, 4096,", &AmdHost::id(1)[4..]),
        1,
    );
    h.set("gpus.csv", &gpus);
    let r = exec_visible(&h, 2);
    r.ok();
    assert_eq!(
        r.stdout.trim(),
        format!("{},{}|0,1|unset", AmdHost::id(2), AmdHost::id(3))
    );
    let v = h.status();
    assert_eq!(v["gpus"][0]["verdict"], "busy: compute process 4242", "{v}");
    assert_eq!(
        v["gpus"][1]["verdict"], "busy: 4096 MiB used > 256 MiB",
        "{v}"
    );
    // Seven asked, six idle: none within the wait.
    exec_visible(&h, 7).fails_with(4, "could not lease 7 GPU(s)");
}

#[test]
fn an_amd_probe_that_cannot_tell_fails_closed() {
    let h = AmdHost::new(8);
    for (mode, says) in [
        ("fail", "No DRM devices available"),
        ("nopids", "Unable to get list of KFD PIDs"),
        ("hang", "did not answer within"),
    ] {
        h.set("mode", mode);
        let mut c = h.cmd(&["gpu", "exec", "--count", "1", "--wait", "0s", "--", "true"]);
        c.env("CIBOX_PROBE_TIMEOUT", "1s");
        run(&mut c).fails_with(5, says);
    }
    h.set("mode", "ok");
    // A GPU without a unique ID cannot be named: nothing is leased on that host.
    h.set(
        "gpus.csv",
        &format!(
            "0, {}, 0, 196592, 0\n1, N/A, 0, 196592, 0\n",
            &AmdHost::id(0)[4..]
        ),
    );
    exec_visible(&h, 1).fails_with(5, "Unique ID is `N/A`");
    assert_eq!(
        std::fs::read_dir(h.locks.path().join("queue"))
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );
}

#[test]
fn an_amd_gpu_named_twice_fails_closed_and_is_not_leased() {
    // rocm-smi's JSON with card 0 busy and then idle, under one key or two: the busy
    // reading must not be dropped (JSON readers keep a key's last value).
    let h = AmdHost::new(1);
    let id = &AmdHost::id(0)[4..];
    for (index, says) in [
        ("0", "the key `card0` is given twice"),
        (
            "00",
            "`card00` names card 0, which an earlier key names too",
        ),
    ] {
        h.set(
            "gpus.csv",
            &format!("0, {id}, 4096, 196592, 90\n{index}, {id}, 0, 196592, 0\n"),
        );
        exec_visible(&h, 1).fails_with(5, says);
        h.run(&["gpu", "status"]).fails_with(5, says);
    }
    assert_eq!(
        std::fs::read_dir(h.locks.path().join("queue"))
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );
}

/// A batch that prints what of the GPUs its container has.
pub(crate) fn looking_batch(name: &str, gpus: u32) -> String {
    let script = "echo \"DRI=$(ls /dev/dri | sort | tr '\\n' ' ')\"; \
                  echo \"KFD=$(test -c /dev/kfd && echo yes)\"; \
                  echo \"ENV=$ROCR_VISIBLE_DEVICES|$HIP_VISIBLE_DEVICES|${CUDA_VISIBLE_DEVICES-unset}\"; \
                  echo \"OPEN=$(for d in /dev/kfd /dev/dri/*; do test -r $d -a -w $d || echo $d; done)\"";
    format!(
        "  {name}:\n    gpus: {gpus}\n    timeout: 1m\n    run: [{}, {}]\n",
        serde_json::to_string(script).unwrap(),
        serde_json::to_string(JUNIT_OK).unwrap()
    )
}

/// The line of `out` that starts with `key=`, without the key.
pub(crate) fn said<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= line in:\n{out}"))
        .trim()
}

#[test]
fn a_batch_gets_kfd_and_exactly_its_own_render_nodes() {
    let h = AmdHost::new(8);
    // GPU 0 is busy: the batch gets 1 and 2.
    h.set("apps.csv", "4242, 0\n");
    let p = busybox_project(&looking_batch("two", 2), "");
    let mut c = p.batch_cmd(&["batch", "run", "two", "--wait", "30s"]);
    h.apply(&mut c);
    let r = run(&mut c);
    r.ok();
    let mut want: Vec<String> = h.nodes(1).into_iter().chain(h.nodes(2)).collect();
    want.sort();
    assert_eq!(said(&r.stdout, "DRI"), want.join(" "), "{}", r.stdout);
    assert_eq!(said(&r.stdout, "KFD"), "yes");
    assert_eq!(
        said(&r.stdout, "ENV"),
        format!("{},{}|0,1|unset", AmdHost::id(1), AmdHost::id(2))
    );
    // The batch (not root, no capability) may open them: the render group is given.
    assert_eq!(said(&r.stdout, "OPEN"), "", "{}", r.stdout);
    let rec = p.result("two");
    let leased: Vec<&str> = rec["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap())
        .collect();
    assert_eq!(leased, [AmdHost::id(1), AmdHost::id(2)]);
    assert_eq!(
        rec["hardware"]["gpus"][0]["name"], "AMD Instinct MI300X",
        "{rec}"
    );
    assert!(p.containers().is_empty());
}

#[test]
fn batches_at_once_see_disjoint_gpus_and_none_of_the_others() {
    let h = AmdHost::new(8);
    let batches: String = (0..4).map(|i| looking_batch(&format!("b{i}"), 2)).collect();
    let p = busybox_project(&batches, "");
    let mut c = p.batch_cmd(&[
        "batch",
        "run",
        "b0",
        "b1",
        "b2",
        "b3",
        "--parallel",
        "--wait",
        "60s",
    ]);
    h.apply(&mut c);
    c.stdout(Stdio::piped());
    let r = run(&mut c);
    r.ok();
    let mut seen: Vec<String> = Vec::new();
    for i in 0..4 {
        let rec = p.result(&format!("b{i}"));
        let ids: Vec<usize> = rec["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (0..8)
                    .find(|j| g["uuid"] == AmdHost::id(*j))
                    .unwrap_or_else(|| panic!("{rec}"))
            })
            .collect();
        let log = std::fs::read_to_string(p.reports().join(format!("b{i}/log.txt"))).unwrap();
        let mut want: Vec<String> = ids.iter().flat_map(|j| h.nodes(*j)).collect();
        want.sort();
        assert_eq!(said(&log, "DRI"), want.join(" "), "b{i}: {log}");
        seen.extend(want);
    }
    let mut all = seen.clone();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 16, "a node was handed out twice: {seen:?}");
    assert!(p.containers().is_empty());
}

#[test]
fn a_hand_over_that_sysfs_does_not_vouch_for_fails_the_batch_and_frees_its_gpus() {
    let h = AmdHost::new(2);
    let p = busybox_project(&looking_batch("one", 1), "");
    // GPU 0's render node is swapped for another device's numbers.
    let [_, render] = h.nodes(0);
    let node = h.dev.path().join("dri").join(&render);
    std::fs::remove_file(&node).unwrap();
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o660),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    let mut c = p.batch_cmd(&["batch", "run", "one", "--wait", "10s"]);
    h.apply(&mut c);
    let r = run(&mut c);
    assert_eq!(r.code, 5, "{}", r.stderr);
    let rec = p.result("one");
    let message = rec["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("AMD GPU {}", AmdHost::id(0)))
            && message.contains("is 1:3, and sysfs says 226:"),
        "{rec}"
    );
    assert!(p.containers().is_empty());
    // Its lease went with it.
    exec_visible(&h, 2).ok();
}

#[test]
fn a_manifest_still_cannot_map_amd_device_files_itself() {
    let h = AmdHost::new(1);
    // AMD's compute driver's file and a render node, where a grant covers them.
    for (major, minor, says) in [
        (AMD_KFD_MAJOR, 0, "AMD's GPU compute driver's (kfd)"),
        (226, 128, "a GPU's (DRM)"),
    ] {
        let path = format!("/dev/cibox-test-gpu-{}", nonce());
        nix::sys::stat::mknod(
            path.as_str(),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(major, minor),
        )
        .unwrap();
        let p = Project::new(&format!(
            "version: 1\nproject: p\nimage: {{locks: [cibox.yaml]}}\nbatches:\n  d: {{gpus: 0, timeout: 1m, run: [x], container: {{devices: [\"{path}\"]}}}}\n"
        ));
        let policy =
            HostPolicyFile::new("version: 1\ngrants:\n  devices: [\"/dev/cibox-test-*\"]\n");
        let mut c = cibox(p.path());
        h.apply(&mut c);
        // The policy pins the lock dir.
        c.env_remove("CIBOX_GPU_LOCK_DIR");
        c.env("CIBOX_HOST_POLICY", policy.path()).args([
            "batch",
            "run",
            "d",
            "--image",
            &format!("sha256:{}", "a".repeat(64)),
        ]);
        let r = run(&mut c);
        let _ = std::fs::remove_file(&path);
        r.fails_with(2, says);
        r.fails_with(
            2,
            "GPUs are leased by cibox (`gpus:`), never mapped by path",
        );
    }
}

#[test]
fn doctor_on_an_amd_host_needs_no_runtime_and_checks_the_device_files() {
    let h = AmdHost::new(8);
    let finding = |v: &serde_json::Value, check: &str| {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == check)
            .cloned()
            .unwrap_or_else(|| panic!("no {check} finding: {v}"))
    };
    let r = h.run(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(finding(&v, "gpu runtime")["status"], "ok", "{v}");
    let devices = finding(&v, "gpu devices");
    assert_eq!(devices["status"], "ok", "{v}");
    assert!(
        devices["detail"]
            .as_str()
            .unwrap()
            .starts_with("17 device files of 8 GPUs"),
        "{devices}"
    );
    let probe = finding(&v, "gpu probe");
    assert!(
        probe["detail"]
            .as_str()
            .unwrap()
            .contains("8 GPUs (8 × AMD Instinct MI300X)"),
        "{probe}"
    );
    // A render node gone: doctor says which GPU cannot be handed over.
    let [_, render] = h.nodes(5);
    std::fs::remove_file(h.dev.path().join("dri").join(&render)).unwrap();
    let r = h.run(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let devices = finding(&v, "gpu devices");
    assert_eq!(devices["status"], "fail", "{v}");
    assert!(
        devices["detail"]
            .as_str()
            .unwrap()
            .contains(&AmdHost::id(5)),
        "{devices}"
    );
    assert_eq!(r.code, 5, "{}", r.stdout);
}
