//! Devices beyond GPUs and seccomp profiles (issue 25): granted by the host policy
//! only, expanded and resolved on the host, refused before anything starts otherwise,
//! and recorded in `loosened`.

use super::*;
use std::process::Command;

/// A character device of this test's under /dev (the null device's numbers), removed
/// when dropped. Tests run as root here; making device nodes needs it.
struct TestDevice(std::path::PathBuf);

impl TestDevice {
    fn new() -> TestDevice {
        TestDevice::with_numbers("1", "3")
    }

    /// A character device of the numbers `major`:`minor`, with a name that says nothing.
    fn with_numbers(major: &str, minor: &str) -> TestDevice {
        let path = std::path::PathBuf::from(format!("/dev/cibox-test-{}", nonce()));
        // Open to all, as RDMA's device nodes are: batches do not run as root.
        let ok = Command::new("mknod")
            .args(["-m", "666"])
            .arg(&path)
            .args(["c", major, minor])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mknod {} (these tests run as root)", path.display());
        TestDevice(path)
    }
}

impl Drop for TestDevice {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn device_batch(dev: &str) -> String {
    batch(
        "d",
        0,
        "1m",
        &[
            &format!("test -c {dev} && echo data > {dev} && echo DEVICE-OK"),
            JUNIT_OK,
        ],
        &format!("    container: {{devices: [\"{dev}\"]}}\n"),
    )
}

#[test]
fn a_granted_device_reaches_the_batch_and_is_recorded() {
    let dev = TestDevice::new();
    let path = dev.0.display().to_string();
    let p = busybox_project(&device_batch(&path), "")
        .with_policy("version: 1\ngrants:\n  devices: [\"/dev/cibox-test-*\"]\n");
    let r = p.run(&["batch", "run", "d"]);
    r.ok();
    assert!(r.stdout.contains("DEVICE-OK"), "{}", r.stdout);
    let rec = p.result("d");
    assert_eq!(rec["loosened"]["devices"][0], path.as_str(), "{rec}");
    assert!(rec["loosened"]["policy"].is_string(), "{rec}");
}

#[test]
fn devices_are_refused_unless_granted_and_present() {
    let dev = TestDevice::new();
    let path = dev.0.display().to_string();
    let p = busybox_project(&device_batch(&path), "");
    require_no_host_policy();
    p.run(&["batch", "run", "d"])
        .fails_with(2, "batches.d.container.devices: device `/dev/cibox-test-");
    // A grant of other devices grants nothing.
    let p = p.with_policy("version: 1\ngrants:\n  devices: [\"/dev/infiniband/*\"]\n");
    p.run(&["batch", "run", "d"])
        .fails_with(2, "the host policy");
    assert!(p.containers().is_empty());
    // A granted pattern that matches nothing on this host.
    let p = busybox_project(&device_batch("/dev/cibox-test-absent"), "")
        .with_policy("version: 1\ngrants:\n  devices: [\"/dev/cibox-test-*\"]\n");
    p.run(&["batch", "run", "d"])
        .fails_with(2, "matches no device on this host");
    // A link in /dev that resolves to a device the grant does not cover.
    let link = format!("/dev/cibox-test-link-{}", nonce());
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let p = busybox_project(&device_batch(&link), "")
        .with_policy("version: 1\ngrants:\n  devices: [\"/dev/cibox-test-*\"]\n");
    let r = p.run(&["batch", "run", "d"]);
    let _ = std::fs::remove_file(&link);
    r.fails_with(2, "resolves to /dev/zero");
    // GPUs are never mapped by path, whatever the policy says: the manifest is refused.
    let p = Project::new(
        "version: 1\nproject: p\nimage: {locks: [cibox.yaml]}\nbatches:\n  d: {gpus: 0, timeout: 1m, run: [x], container: {devices: [/dev/nvidia0]}}\n",
    );
    p.cibox(&["batch", "list"])
        .fails_with(2, "GPUs are leased by cibox");
}

/// Issue 38: one manifest for a mixed fleet. A device a host may lack
/// (`{path, optional: true}`): where it is, the batch gets it; where the pattern
/// matches nothing, the batch runs without it and its record says so; where a match is
/// not granted, it is refused as any device is.
#[test]
fn an_optional_device_is_given_where_present_and_recorded_where_absent() {
    let dev = TestDevice::new();
    let path = dev.0.display().to_string();
    let optional_batch = |pattern: &str| {
        batch(
            "d",
            0,
            "1m",
            &[
                &format!(
                    "if test -c {path}; then echo data > {path} && echo DEVICE-OK; else echo NO-DEVICE; fi"
                ),
                JUNIT_OK,
            ],
            &format!("    container: {{devices: [{{path: \"{pattern}\", optional: true}}]}}\n"),
        )
    };
    let policy = "version: 1\ngrants:\n  devices: [\"/dev/cibox-test-*\"]\n";
    // Present.
    let p = busybox_project(&optional_batch(&path), "").with_policy(policy);
    let r = p.run(&["batch", "run", "d"]);
    r.ok();
    assert!(r.stdout.contains("DEVICE-OK"), "{}", r.stdout);
    let rec = p.result("d");
    assert_eq!(rec["loosened"]["devices"][0], path.as_str(), "{rec}");
    assert!(rec["loosened"]["devices_absent"].is_null(), "{rec}");
    // Absent: it runs, without it, and says so.
    let absent = "/dev/cibox-test-absent-*";
    let p = busybox_project(&optional_batch(absent), "").with_policy(policy);
    let r = p.run(&["batch", "run", "d"]);
    r.ok();
    assert!(r.stdout.contains("NO-DEVICE"), "{}", r.stdout);
    let rec = p.result("d");
    assert_eq!(rec["loosened"]["devices_absent"][0], absent, "{rec}");
    assert!(rec["loosened"]["devices"].is_null(), "{rec}");
    // Optional is no grant: a pattern the policy does not cover is refused.
    let p = busybox_project(&optional_batch("/dev/infiniband/*"), "").with_policy(policy);
    p.run(&["batch", "run", "d"])
        .fails_with(2, "batches.d.container.devices");
    // Nor does it take other keys or shapes.
    let p = Project::new(
        "version: 1\nproject: p\nimage: {locks: [cibox.yaml]}\nbatches:\n  d: {gpus: 0, timeout: 1m, run: [x], container: {devices: [{path: /dev/x, optional: maybe}]}}\n",
    );
    p.cibox(&["batch", "list"]).fails_with(
        2,
        "is not a device: write a path under /dev, or `{path: PATH, optional: true}`",
    );
}

/// Issue 33: a GPU is told by its device numbers, never by its name. `/dev/*` granted,
/// a pattern that names NVIDIA's device by another spelling, a node of NVIDIA's (or
/// the DRM's, AMD's) major under a name that says nothing, and a link to one are all
/// refused before anything starts.
#[test]
fn a_gpu_is_refused_by_its_device_numbers_whatever_names_it() {
    let nvidia = TestDevice::with_numbers("195", "0");
    let drm = TestDevice::with_numbers("226", "0");
    let nvidia_path = nvidia.0.display().to_string();
    let name = nvidia_path.trim_start_matches("/dev/");
    // `/dev/[c]ibox-test-…`: a pattern whose text is no GPU's.
    let spelled = format!("/dev/[{}]{}", &name[..1], &name[1..]);
    let link = format!("/dev/cibox-test-link-{}", nonce());
    std::os::unix::fs::symlink(&nvidia.0, &link).unwrap();
    // Removed however the test ends (a TestDevice removes a link as well as a node).
    let _link = TestDevice(std::path::PathBuf::from(&link));
    let policy = "version: 1\ngrants:\n  devices: [\"/dev/*\"]\n";
    let cases = [
        (nvidia_path.clone(), "char device 195:0, NVIDIA"),
        (spelled, "char device 195:0, NVIDIA"),
        (link.clone(), "char device 195:0, NVIDIA"),
        (drm.0.display().to_string(), "char device 226:0"),
    ];
    for (asked, said) in cases {
        let p = busybox_project(&device_batch(&asked), "").with_policy(policy);
        let r = p.run(&["batch", "run", "d"]);
        r.fails_with(2, &format!("batches.d.container.devices: device `{asked}`"));
        assert!(r.stderr.contains(said), "{asked}: {}", r.stderr);
        assert!(
            r.stderr.contains("GPUs are leased by cibox"),
            "{}",
            r.stderr
        );
        assert!(p.containers().is_empty(), "{asked}: a container was made");
        assert!(
            !p.reports().join("d").exists(),
            "{asked}: a batch folder was made"
        );
    }
}

#[test]
fn a_granted_seccomp_profile_applies_and_a_loose_one_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("no-mkdir.json");
    std::fs::write(
        &profile,
        r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    std::fs::set_permissions(&profile, std::fs::Permissions::from_mode(0o644)).unwrap();
    let batches = batch(
        "s",
        0,
        "1m",
        &[
            "if mkdir /tmp/x 2>/dev/null; then echo MKDIR-WORKED; else echo MKDIR-DENIED; fi",
            JUNIT_OK,
        ],
        "    container: {seccomp: no-mkdir}\n",
    );
    let policy = format!(
        "version: 1\ngrants:\n  seccomp: {{no-mkdir: {}, open: unconfined}}\n",
        profile.display()
    );
    let p = busybox_project(&batches, "").with_policy(&policy);
    let r = p.run(&["batch", "run", "s"]);
    r.ok();
    assert!(r.stdout.contains("MKDIR-DENIED"), "{}", r.stdout);
    assert_eq!(p.result("s")["loosened"]["seccomp"], "no-mkdir");
    // A profile others may change is never read.
    std::fs::set_permissions(&profile, std::fs::Permissions::from_mode(0o666)).unwrap();
    p.run(&["batch", "run", "s"])
        .fails_with(2, "seccomp profile `no-mkdir`");
    // A name the policy does not define, or none at all.
    let p = busybox_project(&batches, "")
        .with_policy("version: 1\ngrants:\n  seccomp: {open: unconfined}\n");
    p.run(&["batch", "run", "s"])
        .fails_with(2, "grants.seccomp");
}
