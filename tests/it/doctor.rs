//! `cibox doctor` with the fake nvidia-smi and the real engine.

use std::process::Command;

use crate::common::*;

fn engine_has_gpu_runtime() -> bool {
    let out = Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("nvidia")
        || std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .any(|d| d.join("nvidia-container-runtime-hook").exists())
}

fn doctor(smi: &FakeSmi, lock_dir: &std::path::Path) -> (Run, serde_json::Value) {
    require_engine();
    let p = Project::new(&manifest_with_locks(&["cibox.yaml"]));
    let mut c = cibox(p.path());
    smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", lock_dir)
        .args(["doctor", "--json"]);
    let r = run(&mut c);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    (r, v)
}

fn status<'a>(v: &'a serde_json::Value, check: &str) -> &'a str {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no {check} finding in {v}"))["status"]
        .as_str()
        .unwrap()
}

#[test]
fn doctor_reports_each_check() {
    let smi = FakeSmi::idle();
    let locks = tempfile::tempdir().unwrap();
    let (r, v) = doctor(&smi, locks.path());
    assert_eq!(status(&v, "engine"), "ok");
    assert_eq!(status(&v, "storage"), "ok");
    assert_eq!(status(&v, "gpu probe"), "ok");
    assert_eq!(status(&v, "lock dir"), "ok");
    assert_eq!(status(&v, "gpu pool"), "ok");
    // This host's engine has no NVIDIA runtime unless it really does; doctor must say
    // which, and exit 5 exactly when it is missing.
    if engine_has_gpu_runtime() {
        assert_eq!(status(&v, "gpu runtime"), "ok");
        assert_eq!(r.code, 0);
    } else {
        assert_eq!(status(&v, "gpu runtime"), "fail");
        assert_eq!(r.code, 5);
        assert_eq!(v["ready_for_gpu_batches"], false);
    }
}

#[test]
fn doctor_fails_closed_on_a_broken_or_hanging_probe() {
    let locks = tempfile::tempdir().unwrap();
    for (file, contents) in [
        ("mode", "fail"),
        (
            "gpus.csv",
            "0, GPU-11111111-2222-3333-4444-000000000000, [N/A], 81559, 0\n",
        ),
    ] {
        let smi = FakeSmi::idle();
        smi.set(file, contents);
        let (r, v) = doctor(&smi, locks.path());
        assert_eq!(status(&v, "gpu probe"), "fail", "{file}={contents}");
        assert_eq!(r.code, 5);
    }
}

#[test]
fn doctor_flags_unknown_pool_entries_and_unwritable_lock_dirs() {
    let smi = FakeSmi::idle();
    let p = Project::new(&manifest_with_locks(&["cibox.yaml"]));
    let file = p.write("not-a-dir", "x");
    let mut c = cibox(p.path());
    smi.apply(&mut c);
    c.env("CIBOX_GPU_POOL", "0,7")
        .env("CIBOX_GPU_LOCK_DIR", file.join("sub"))
        .args(["doctor", "--json"]);
    let r = run(&mut c);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(status(&v, "gpu pool"), "fail");
    assert_eq!(status(&v, "lock dir"), "fail");
    assert_eq!(r.code, 5);
}

#[test]
fn doctor_without_engine_fails_engine_check() {
    let smi = FakeSmi::idle();
    let locks = tempfile::tempdir().unwrap();
    let p = Project::new(&manifest_with_locks(&["cibox.yaml"]));
    let mut c = cibox(p.path());
    smi.apply(&mut c);
    c.env("DOCKER_HOST", "unix:///nonexistent.sock")
        .env("CIBOX_GPU_LOCK_DIR", locks.path())
        .arg("doctor");
    let r = run(&mut c);
    assert_eq!(r.code, 5);
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("engine ") && l.contains(" FAIL ")),
        "{}",
        r.stdout
    );
}

#[test]
fn doctor_shows_the_host_policy_and_what_it_grants() {
    require_engine();
    let smi = FakeSmi::idle();
    let locks = tempfile::tempdir().unwrap();
    let policy = HostPolicyFile::new(
        "version: 1\ngrants: {mounts: [/data/models], users: [root], pass_env: [HF_TOKEN]}\n",
    );
    let p = Project::new(&manifest_with_locks(&["cibox.yaml"]));
    let doctor = |policy: &HostPolicyFile| {
        let mut c = cibox(p.path());
        smi.apply(&mut c);
        c.env("CIBOX_GPU_LOCK_DIR", locks.path())
            .env("CIBOX_HOST_POLICY", policy.path())
            .args(["doctor", "--json"]);
        let r = run(&mut c);
        let v: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
        (r, v)
    };
    let (_, v) = doctor(&policy);
    let finding = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "host policy")
        .unwrap()
        .clone();
    assert_eq!(finding["status"], "ok", "{finding}");
    let detail = finding["detail"].as_str().unwrap();
    assert!(
        detail.contains("(sha256:")
            && detail.contains("grants mounts under /data/models; users root; pass_env HF_TOKEN"),
        "{detail}"
    );
    // A policy others may write is refused: doctor says so and exits 2.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(policy.path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let (r, v) = doctor(&policy);
    assert_eq!(status(&v, "host policy"), "fail");
    assert_eq!(r.code, 2, "{}", r.stdout);
}

#[test]
fn doctor_honours_the_network_lock_dir_allowance() {
    // A lock dir on a file system cibox counts as a network one (FUSE here): doctor
    // fails it, unless allow_network_lock_dir is set, as leasing itself does.
    let net = FuseDir::mount();
    let dir = net.join("locks");
    let smi = FakeSmi::idle();
    let (_, v) = doctor(&smi, &dir);
    assert_eq!(status(&v, "lock dir"), "fail", "{v}");
    let p = Project::new(&manifest_with_locks(&["cibox.yaml"]));
    let mut c = cibox(p.path());
    smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", &dir)
        .env("CIBOX_ALLOW_NETWORK_LOCK_DIR", "1")
        .args(["doctor", "--json"]);
    let r = run(&mut c);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    assert_eq!(status(&v, "lock dir"), "warn", "{v}");
    let detail = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "lock dir")
        .unwrap()["detail"]
        .to_string();
    assert!(
        detail.contains("FUSE") && detail.contains("allow_network_lock_dir"),
        "{detail}"
    );
}
