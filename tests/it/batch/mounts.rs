//! Host mounts and other loosenings: the host settings real GPU tests need, mounts
//! refused before anything starts, and mounts that are what was checked, read-only.

use std::path::PathBuf;
use std::process::Command;

use super::batch;
use crate::common::*;

#[test]
fn a_batch_gets_the_host_settings_real_gpu_tests_need() {
    // Model weights in a host folder, read-only; NCCL's host IPC, memlock and SYS_NICE;
    // root in the container, still without other capabilities.
    let weights = data_dir();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(weights.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(weights.path().join("hello.txt"), "weights").unwrap();
    std::fs::set_permissions(
        weights.path().join("hello.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let host_ipc = std::fs::read_link("/proc/self/ns/ipc")
        .unwrap()
        .display()
        .to_string();
    let checks = [
        "test \"$(cat /models/hello.txt)\" = weights",
        "! touch /models/x 2>/dev/null",
        "test \"$(id -u)\" = 0",
        // IPC_LOCK (bit 14) and SYS_NICE (bit 23), nothing else.
        "grep -q '^CapEff:[[:space:]]*0000000000804000$' /proc/self/status",
        "grep -q '^NoNewPrivs:[[:space:]]*1$' /proc/self/status",
        // (`unlimited`, what NCCL wants, needs an engine allowed to raise its own
        // limit; this one's hard memlock limit is 8 MiB.)
        "test \"$(ulimit -l)\" = 4096",
        // Soft equal to hard: this engine's exec sometimes starts a process with the
        // soft nofile limit raised to the hard one (seen 2 runs in 12).
        "n=$(ulimit -n); echo \"nofile $n\"; test \"$n\" = 2048",
        "i=$(readlink /proc/self/ns/ipc); echo \"ipc $i host $HOST_IPC\"; test \"$i\" = \"$HOST_IPC\"",
        JUNIT_OK,
    ];
    let container = format!(
        "    container:\n      mounts: [\"{}:/models\"]\n      ipc: host\n      ulimits: {{memlock: 4194304, nofile: {{soft: 2048, hard: 2048}}}}\n      cap_add: [IPC_LOCK, SYS_NICE]\n      user: root\n      pass_env: [HOST_IPC]\n",
        weights.path().display()
    );
    let p = busybox_project(&batch("nccl", 0, "1m", &checks, &container), "")
        .with_policy(&format!("{GRANT_ALL}  pass_env: [HOST_IPC]\n"));
    let r = run(p
        .batch_cmd(&["batch", "run", "nccl"])
        .env("HOST_IPC", &host_ipc));
    r.ok();
    let v = p.result("nccl");
    let loose = &v["loosened"];
    assert_eq!(loose["ipc"], "host", "{v}");
    assert_eq!(loose["user"], "root", "{v}");
    assert_eq!(
        loose["cap_add"],
        serde_json::json!(["IPC_LOCK", "SYS_NICE"])
    );
    assert_eq!(loose["ulimits"]["memlock"]["soft"], 4194304);
    assert_eq!(loose["mounts"][0]["target"], "/models");
    assert_eq!(loose["pass_env"], serde_json::json!(["HOST_IPC"]));
    assert!(
        loose["policy"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:")),
        "the policy that granted it: {v}"
    );
}

#[test]
fn a_ulimit_the_engine_refuses_is_a_usage_error_and_leaves_no_container() {
    // More open files than the host's fs.nr_open allows: only the engine can say (its
    // runtime fails to set it when the container starts). That is the manifest's
    // mistake, exit 2 naming the ulimit, not an infrastructure error, and no container
    // is left. (Were nr_open already at the kernel's ceiling, the manifest itself would
    // be refused: also exit 2, naming it.)
    let nr_open: i64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let container = format!(
        "    container:\n      ulimits: {{nofile: {{soft: 1024, hard: {}}}}}\n",
        nr_open + 64
    );
    let p = busybox_project(&batch("files", 0, "1m", &[JUNIT_OK], &container), "")
        .with_policy(GRANT_ALL);
    let r = p.run(&["batch", "run", "files"]);
    r.fails_with(2, "ulimits.nofile");
    assert!(p.containers().is_empty(), "{:?}", p.containers());
}

#[test]
fn a_mount_that_is_missing_or_leads_home_starts_nothing() {
    let dir = data_dir();
    let missing = dir.path().join("no-such-folder");
    let home_link = dir.path().join("models");
    std::os::unix::fs::symlink("/root", &home_link).unwrap();
    for (source, want) in [
        (missing.clone(), "No such file or directory".to_string()),
        (
            home_link.clone(),
            "(resolves to /root) is in a home folder".to_string(),
        ),
    ] {
        let extra = format!("  mounts: [\"{}:/models\"]\n", source.display());
        let p =
            busybox_project(&batch("m", 0, "1m", &[JUNIT_OK], ""), &extra).with_policy(GRANT_ALL);
        let r = p.run(&["batch", "run", "m"]);
        r.fails_with(2, "cibox.yaml:9:12: batches.m.container.mounts: source");
        assert!(r.stderr.contains(&want), "{}", r.stderr);
        assert!(p.containers().is_empty(), "no container was made");
        assert!(!p.reports().join("m").exists(), "no report was made");
    }
}

#[test]
fn a_mount_that_could_be_swapped_or_shows_the_run_starts_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let p = busybox_project(&batch("m", 0, "1m", &[JUNIT_OK], ""), "").with_policy(GRANT_ALL);
    let d = p.project.path();
    // A folder anyone may write (not sticky): the models inside could be swapped for a
    // link to anywhere between the check and the mount.
    let open = data_dir();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::create_dir(open.path().join("models")).unwrap();
    // A checkout outside /tmp (mounts from /tmp are refused anyway).
    let data = data_dir();
    let checkout = data.path().join("checkout");
    let inner = checkout.join("sub");
    std::fs::create_dir_all(&inner).unwrap();
    for (source, checkout, want) in [
        (
            open.path().join("models"),
            d,
            "(mode 777), which others may write",
        ),
        (
            checkout.clone(),
            checkout.as_path(),
            "is the checkout under test",
        ),
        (
            data.path().to_path_buf(),
            checkout.as_path(),
            "holds the checkout under test",
        ),
        (
            inner.clone(),
            checkout.as_path(),
            "is inside the checkout under test",
        ),
    ] {
        std::fs::write(
            d.join("cibox.yaml"),
            std::fs::read_to_string(d.join("cibox.yaml"))
                .unwrap()
                .lines()
                .filter(|l| !l.starts_with("  mounts:"))
                .map(|l| {
                    if l == "container:" {
                        format!("container:\n  mounts: [\"{}:/models\"]", source.display())
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n"),
        )
        .unwrap();
        let r = p.run(&[
            "batch",
            "run",
            "m",
            "--source",
            &checkout.display().to_string(),
        ]);
        r.fails_with(2, "batches.m.container.mounts: source");
        assert!(r.stderr.contains(want), "{want}: {}", r.stderr);
        assert!(p.containers().is_empty(), "no container was made");
        assert!(!p.reports().join("m").exists(), "no report was made");
    }
}

/// Gives `uid` rwx on `dir` through a POSIX access ACL (what `setfacl -m u:UID:rwx`
/// writes), leaving the owner root and the mode's group bits as the mask.
fn grant_acl_write(dir: &std::path::Path, uid: u32) {
    // Version 2, then (tag, perm, id): user_obj, user, group_obj, mask, other.
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, u32::MAX),
        (0x02, 7, uid),
        (0x04, 5, u32::MAX),
        (0x10, 7, u32::MAX),
        (0x20, 5, u32::MAX),
    ] {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    if let Err(e) = xattr::set_deref(dir, "system.posix_acl_access", &acl) {
        panic!(
            "setting an ACL on {} (the filesystem must support POSIX ACLs): {e}",
            dir.display()
        );
    }
}

#[test]
fn a_mount_reached_through_a_folder_others_may_write_by_acl_or_owned_by_the_runner_starts_nothing()
{
    let p = busybox_project(&batch("m", 0, "1m", &[JUNIT_OK], ""), "").with_policy(GRANT_ALL);
    // Root's folder, mode 775 root:root, but an ACL lets uid 65534 write it: they could
    // swap `models` for a link to /etc between the check and the mount.
    let acl = data_dir();
    std::fs::create_dir(acl.path().join("models")).unwrap();
    grant_acl_write(acl.path(), 65534);
    // A GitHub runner's folder, found by its `.runner` file, whatever its work folder
    // is called.
    let runner = data_dir();
    std::fs::write(runner.path().join(".runner"), "{}").unwrap();
    std::fs::write(runner.path().join(".credentials"), "secret").unwrap();
    let workspace = runner.path().join("work/repo");
    std::fs::create_dir_all(&workspace).unwrap();
    for (source, want) in [
        (acl.path().join("models"), "which others may write"),
        (
            runner.path().to_path_buf(),
            "a folder of the CI runner (its credentials",
        ),
        (
            runner.path().join("work"),
            "a folder of the CI runner (its credentials",
        ),
    ] {
        let extra = format!("  mounts: [\"{}:/models\"]\n", source.display());
        let manifest = std::fs::read_to_string(p.project.path().join("cibox.yaml"))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with("  mounts:"))
            .map(|l| {
                if l == "container:" {
                    format!("container:\n{}", extra.trim_end())
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        p.project.write("cibox.yaml", manifest);
        let r = run(p
            .batch_cmd(&["batch", "run", "m"])
            .env("RUNNER_WORKSPACE", &workspace));
        r.fails_with(2, "batches.m.container.mounts: source");
        assert!(r.stderr.contains(want), "{want}: {}", r.stderr);
        assert!(p.containers().is_empty(), "no container was made");
    }
}

#[test]
fn a_mount_is_what_was_checked_and_read_only_all_the_way_down() {
    // A mount named through a link is mounted as the folder the check resolved; a mount
    // below it is read-only too, or, on an engine that cannot do that, refused.
    let data = data_dir();
    let weights = data.path().join("weights");
    let below = weights.join("nfs");
    std::fs::create_dir_all(&below).unwrap();
    std::fs::write(weights.join("w.txt"), "w").unwrap();
    let link = data.path().join("current");
    std::os::unix::fs::symlink(&weights, &link).unwrap();
    let extra = format!("  mounts: [\"{}:/weights\"]\n", link.display());
    let p = busybox_project(
        &batch(
            "m",
            0,
            "1m",
            &[
                "test \"$(cat /weights/w.txt)\" = w",
                "! touch /weights/x 2>/dev/null",
                "! touch /weights/nfs/x 2>/dev/null",
                JUNIT_OK,
            ],
            "",
        ),
        &extra,
    )
    .with_policy(GRANT_ALL);
    p.run(&["batch", "run", "m"]).ok();
    let v = p.result("m");
    assert_eq!(
        v["loosened"]["mounts"][0]["resolved"],
        weights.canonicalize().unwrap().display().to_string(),
        "{v}"
    );
    let status = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            // Not the tmpfs default 1777: a folder anyone may write below a mount is
            // refused (a socket made there later would reach the batch).
            "size=1m,mode=0755",
            "cibox-test",
            &below.display().to_string(),
        ])
        .status()
        .unwrap();
    assert!(
        status.success(),
        "mount -t tmpfs needs root (CI runs as root)"
    );
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(below.clone());
    let api = Command::new("docker")
        .args(["version", "--format", "{{.Server.APIVersion}}"])
        .output()
        .unwrap();
    let api = String::from_utf8_lossy(&api.stdout).trim().to_string();
    let (major, minor) = api.split_once('.').unwrap();
    let recursive = (major.parse::<u32>().unwrap(), minor.parse::<u32>().unwrap()) >= (1, 44);
    let r = p.run(&["batch", "run", "m"]);
    if recursive {
        // The tmpfs below is writable on the host, read-only in the batch.
        r.ok();
    } else {
        r.fails_with(2, "batches.m.container.mounts: source");
        assert!(
            r.stderr.contains(&format!(
                "holds another mount, {}",
                below.canonicalize().unwrap().display()
            )) && r.stderr.contains(&format!("this engine (API {api})")),
            "{}",
            r.stderr
        );
        assert!(p.containers().is_empty(), "no container was made");
    }
}
