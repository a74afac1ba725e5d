//! Huawei Ascend NPUs (issue 45), on hosts of doubles: the npu-smi double, device files
//! made with mknod, the driver's user space in a folder. Leases go by PCI address; a
//! batch's container gets exactly its chips' `/dev/davinciN`, the driver's shared nodes,
//! its user space read-only, and `ASCEND_RT_VISIBLE_DEVICES`; a busy or sick chip is
//! passed over; what cannot be told fails closed.

use crate::common::*;

fn exec_visible(h: &AscendHost, count: usize) -> Run {
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
        "echo \"$ASCEND_RT_VISIBLE_DEVICES|${CUDA_VISIBLE_DEVICES-unset}\"",
    ])
}

#[test]
fn gpu_exec_leases_npus_by_pci_address_passing_busy_and_sick_ones_over() {
    let h = AscendHost::new(8);
    let v = h.status();
    assert!(v["probe"].as_str().unwrap().starts_with("npu-smi"), "{v}");
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8, "{v}");
    assert_eq!(gpus[0]["uuid"], AscendHost::id(0));
    assert_eq!(gpus[0]["model"], "910B3");
    let r = exec_visible(&h, 2);
    r.ok();
    assert_eq!(r.stdout.trim(), "0,1|unset");
    // A process on NPU 0, NPU 1 in alarm: both passed over.
    h.set("apps.csv", "0, 4242, python3, 2890\n");
    let mut health = vec!["OK"; 8];
    health[1] = "Alarm";
    h.set_npus(&health);
    let r = exec_visible(&h, 2);
    r.ok();
    assert_eq!(r.stdout.trim(), "2,3|unset");
    let v = h.status();
    assert_eq!(v["gpus"][0]["verdict"], "busy: compute process 4242", "{v}");
    assert_eq!(
        v["gpus"][1]["verdict"], "unhealthy: npu-smi reports its health as Alarm",
        "{v}"
    );
    // Eight asked, seven healthy: refused at once, naming the sick chip.
    exec_visible(&h, 8).fails_with(
        4,
        &format!("GPU 1 ({}): npu-smi reports", AscendHost::id(1)),
    );
}

#[test]
fn an_npu_probe_that_cannot_tell_fails_closed() {
    for (file, contents, says) in [
        ("mode", "fail", "exited with"),
        ("mode", "hang", "did not answer within"),
        (
            "npus.csv",
            "0, 0000:C1:00.0, 0, 65536, 0, Fine\n",
            "health `Fine`",
        ),
        (
            "npus.csv",
            "0, 0000:C1:00.0, 0, 65536, 0, OK\n1, 0000:C1:00.0, 0, 65536, 0, OK\n",
            "appears twice",
        ),
        (
            "apps.csv",
            "9, 1, python3, 1\n",
            "which the table does not show",
        ),
    ] {
        let h = AscendHost::new(2);
        h.set(file, contents);
        let mut c = h.cmd(&["gpu", "exec", "--count", "1", "--wait", "0s", "--", "true"]);
        c.env("CIBOX_PROBE_TIMEOUT", "1s");
        run(&mut c).fails_with(5, says);
    }
}

/// A batch that prints what of the NPUs its container has.
fn looking_batch(name: &str, gpus: u32) -> String {
    let script = "echo \"NODES=$(ls /dev | grep -E '^(davinci|devmm|hisi)' | sort | tr '\\n' ' ')\"; \
                  echo \"ENV=$ASCEND_RT_VISIBLE_DEVICES|${CUDA_VISIBLE_DEVICES-unset}\"; \
                  echo \"HAL=$(cat /usr/local/Ascend/driver/lib64/libascend_hal.so)\"; \
                  echo \"SMI=$(/usr/local/bin/npu-smi)\"; \
                  echo \"WRITE=$(touch /usr/local/Ascend/driver/lib64/x 2>/dev/null && echo yes || echo no)\"; \
                  echo \"OPEN=$(for d in /dev/davinci*; do test -r $d -a -w $d || echo $d; done)\"";
    format!(
        "  {name}:\n    gpus: {gpus}\n    timeout: 1m\n    run: [{}, {}]\n",
        serde_json::to_string(script).unwrap(),
        serde_json::to_string(JUNIT_OK).unwrap()
    )
}

/// The line of `out` that starts with `key=`, without the key.
fn said<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= line in:\n{out}"))
        .trim()
}

#[test]
fn a_batch_gets_exactly_its_chips_the_shared_nodes_and_the_driver_read_only() {
    let h = AscendHost::new(8);
    // NPU 0 is busy: the batch gets 1 and 2.
    h.set("apps.csv", "0, 4242, python3, 2890\n");
    let p = busybox_project(&looking_batch("two", 2), "");
    let mut c = p.batch_cmd(&["batch", "run", "two", "--wait", "30s"]);
    h.apply(&mut c);
    let r = run(&mut c);
    r.ok();
    assert_eq!(
        said(&r.stdout, "NODES"),
        "davinci1 davinci2 davinci_manager devmm_svm hisi_hdc",
        "{}",
        r.stdout
    );
    assert_eq!(said(&r.stdout, "ENV"), "0,1|unset");
    assert_eq!(said(&r.stdout, "HAL"), "hal");
    assert_eq!(said(&r.stdout, "SMI"), "npu-smi of the host");
    assert_eq!(said(&r.stdout, "WRITE"), "no", "the driver is read-only");
    // The batch (not root, no capability) may open them: the group is given.
    assert_eq!(said(&r.stdout, "OPEN"), "", "{}", r.stdout);
    let rec = p.result("two");
    let leased: Vec<&str> = rec["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap())
        .collect();
    assert_eq!(leased, [AscendHost::id(1), AscendHost::id(2)]);
    assert_eq!(rec["hardware"]["gpus"][0]["name"], "910B3", "{rec}");
    assert!(p.containers().is_empty());
}

#[test]
fn a_hand_over_without_the_driver_fails_the_batch_and_frees_its_chips() {
    let h = AscendHost::new(2);
    let p = busybox_project(&looking_batch("one", 1), "");
    std::fs::remove_file(h.dev.path().join("davinci0")).unwrap();
    std::os::unix::fs::symlink("/dev/null", h.dev.path().join("davinci0")).unwrap();
    let mut c = p.batch_cmd(&["batch", "run", "one", "--wait", "10s"]);
    h.apply(&mut c);
    let r = run(&mut c);
    assert_eq!(r.code, 5, "{}", r.stderr);
    let rec = p.result("one");
    let message = rec["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("Ascend GPU {}", AscendHost::id(0)))
            && message.contains("davinci0 is not a character device"),
        "{rec}"
    );
    assert!(p.containers().is_empty());
    // The driver's libraries gone: nothing starts either.
    std::fs::remove_dir_all(h.root.path().join("usr/local/Ascend/driver/lib64")).unwrap();
    let r = exec_visible(&h, 2);
    r.ok();
    let mut c = p.batch_cmd(&["batch", "run", "one", "--wait", "10s"]);
    h.apply(&mut c);
    c.env("CIBOX_GPU_POOL", AscendHost::id(1));
    let r = run(&mut c);
    assert_eq!(r.code, 5, "{}", r.stderr);
    let rec = p.result("one");
    assert!(
        rec["message"].as_str().unwrap().contains("driver/lib64"),
        "{rec}"
    );
}

#[test]
fn a_manifest_cannot_map_ascend_device_files_itself() {
    let h = AscendHost::new(1);
    let dir = format!("/dev/cibox-test-npu-{}", nonce());
    std::fs::create_dir(&dir).unwrap();
    let path = format!("{dir}/davinci0");
    nix::sys::stat::mknod(
        path.as_str(),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(ASCEND_MAJOR, 0),
    )
    .unwrap();
    let p = Project::new(&format!(
        "version: 1\nproject: p\nimage: {{locks: [cibox.yaml]}}\nbatches:\n  d: {{gpus: 0, timeout: 1m, run: [x], container: {{devices: [\"{path}\"]}}}}\n"
    ));
    let policy = HostPolicyFile::new("version: 1\ngrants:\n  devices: [\"/dev/cibox-test-*/*\"]\n");
    let mut c = cibox(p.path());
    h.apply(&mut c);
    c.env_remove("CIBOX_GPU_LOCK_DIR");
    c.env("CIBOX_HOST_POLICY", policy.path()).args([
        "batch",
        "run",
        "d",
        "--image",
        &format!("sha256:{}", "a".repeat(64)),
    ]);
    let r = run(&mut c);
    let _ = std::fs::remove_dir_all(&dir);
    r.fails_with(2, "Ascend's NPU driver's");
}

#[test]
fn doctor_on_an_ascend_host_needs_no_runtime_and_checks_the_device_files() {
    let h = AscendHost::new(8);
    let finding = |v: &serde_json::Value, check: &str| {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == check)
            .cloned()
            .unwrap_or_else(|| panic!("no {check} finding: {v}"))
    };
    let mut health = vec!["OK"; 8];
    health[6] = "Critical";
    h.set_npus(&health);
    let r = h.run(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(finding(&v, "gpu runtime")["status"], "ok", "{v}");
    let devices = finding(&v, "gpu devices");
    assert_eq!(devices["status"], "ok", "{v}");
    assert!(
        devices["detail"]
            .as_str()
            .unwrap()
            .starts_with("11 device files of 8 GPUs found and checked, 3 driver paths"),
        "{devices}"
    );
    let health = finding(&v, "gpu health");
    assert_eq!(health["status"], "warn");
    assert!(
        health["detail"].as_str().unwrap().contains(&format!(
            "GPU 6 ({}): npu-smi reports its health as Critical",
            AscendHost::id(6)
        )),
        "{health}"
    );
    assert!(
        finding(&v, "gpu probe")["detail"]
            .as_str()
            .unwrap()
            .contains("8 GPUs (8 × 910B3)"),
        "{v}"
    );
}
