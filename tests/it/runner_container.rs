//! cibox in a container with the engine's socket (issue 25): the way slime's runners
//! live. The source reaches the batch through the engine's archive API, a granted
//! mount and the cache store reach the engine at their paths on the host (found from
//! the engine: the runner container's own mounts), and a mount of the runner's
//! workspace is still refused.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// An image holding this cibox, git and busybox, with the libraries they load: a
/// runner's image in miniature, unique to this test run.
fn runner_image() -> ImageGuard {
    let ctx = tempfile::tempdir().unwrap();
    let root = ctx.path().join("rootfs");
    let cibox = PathBuf::from(env!("CARGO_BIN_EXE_cibox"));
    let mut files: Vec<(PathBuf, PathBuf)> = vec![
        (cibox.clone(), "usr/local/bin/cibox".into()),
        ("/usr/bin/git".into(), "usr/bin/git".into()),
        ("/bin/busybox".into(), "bin/busybox".into()),
    ];
    for exe in [cibox.as_path(), Path::new("/usr/bin/git")] {
        let out = Command::new("ldd").arg(exe).output().unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let path = line
                .split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from);
            if let Some(p) = path {
                let rel = p.strip_prefix("/").unwrap().to_path_buf();
                files.push((p, rel));
            }
        }
    }
    for (from, rel) in &files {
        let to = root.join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
    // A debug build is mostly debug information: without it the image is a fifth.
    let stripped = Command::new("strip")
        .arg(root.join("usr/local/bin/cibox"))
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        stripped,
        "strip (binutils) is needed to build the runner image"
    );
    for link in ["sh", "ls", "cat"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(link)).unwrap();
    }
    for dir in ["tmp", "run/lock", "etc"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        format!(
            "FROM scratch\nLABEL org.cibox.test.nonce={}\nCOPY rootfs/ /\nENV PATH=/usr/local/bin:/usr/bin:/bin\n",
            nonce()
        ),
    )
    .unwrap();
    let _store = image_store_lock(false);
    let out = Command::new("docker")
        .args(["build", "-q"])
        .arg(ctx.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ImageGuard(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn cibox_in_a_container_runs_a_batch_with_its_source_mounts_and_caches() {
    require_engine();
    let batches = "  b:\n    gpus: 0\n    timeout: 2m\n    verdict: exit-code\n    container: {mounts: [\"/data/shared:/weights\"]}\n    run: [\"cat /work/hello.txt\", \"cat /weights/vocab.txt\", \"if [ -e /cache/models/kept ]; then echo CACHE-HAD-IT; else echo kept > /cache/models/kept; echo CACHE-WROTE; fi\"]\n  ws:\n    gpus: 0\n    timeout: 2m\n    verdict: exit-code\n    caches: []\n    container: {mounts: [\"/data/shared/ws:/w\"]}\n    run: [\"ls /w\"]\n";
    let p = busybox_project(batches, "caches:\n  models: /cache/models\n");
    p.project.write("hello.txt", "hello from the workspace\n");
    let data = data_dir();
    std::fs::write(data.path().join("vocab.txt"), "the model's vocabulary\n").unwrap();
    // Where a runner could have its workspace bound under the data folder.
    std::fs::create_dir(data.path().join("ws")).unwrap();
    let store = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(store.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The admin's policy, as the runner container sees its folders.
    let policy = HostPolicyFile::new(
        "version: 1\ngrants:\n  mounts: [{root: /data/shared, special_files: allow}]\ncaches:\n  root: /cache-store\n  trusted: true\n",
    );
    let image = runner_image();
    let scope = format!("test-rc-{}", &p.image.0[7..19]);
    let runner = |batch: &str, extra: &[&str]| {
        let mut c = Command::new("docker");
        c.args([
            "run",
            "--rm",
            "-v",
            "/var/run/docker.sock:/var/run/docker.sock",
        ])
        .arg("-v")
        .arg(format!("{}:/workspace/proj", p.project.path().display()))
        .arg("-v")
        .arg(format!("{}:/data/shared:ro", data.path().display()))
        .arg("-v")
        .arg(format!("{}:/cache-store", store.path().display()))
        .arg("-v")
        .arg(format!(
            "{}:/etc/cibox/host.yaml:ro",
            policy.path().display()
        ))
        .args(extra)
        .args(["-w", "/workspace/proj"])
        .arg(&image.0)
        .args(["cibox", "batch", "run", batch, "--image", &p.image.0])
        .args([
            "--source",
            "/workspace/proj",
            "--reports",
            "/workspace/proj/reports",
        ])
        .args(["--scope", &scope]);
        run(&mut c)
    };
    let r = runner("b", &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("hello from the workspace"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("the model's vocabulary"), "{}", r.stdout);
    assert!(r.stdout.contains("CACHE-WROTE"), "{}", r.stdout);
    let rec = p.result("b");
    assert_eq!(
        rec["loosened"]["mounts"][0]["resolved"],
        data.path().display().to_string(),
        "the engine got the host's path: {rec}"
    );
    let r = runner("b", &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("CACHE-HAD-IT"), "{}", r.stdout);
    // A mount of the runner's own workspace is refused, whatever it is called inside.
    let r = runner(
        "ws",
        &[
            "-v",
            &format!("{}:/data/shared/ws:ro", p.project.path().display()),
        ],
    );
    r.fails_with(2, "on the engine's host");
}

/// A runner container left running, removed when dropped.
struct Runner(String);

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

/// Issue 33: the host path of a runner's bind is the host's to resolve, through
/// folders cibox in its container cannot see. Another user who owns the host folder
/// above the bind could swap it for a link after cibox mapped the path, and the batch
/// would mount what it leads to (the host's `/etc`). cibox judges the host path on the
/// host: a folder on the way that someone else may change, or a path that resolves
/// elsewhere than what cibox checked, is refused before anything starts.
#[test]
fn a_runners_bind_below_another_users_host_folder_is_refused() {
    require_engine();
    let batches = "  b:\n    gpus: 0\n    timeout: 2m\n    verdict: exit-code\n    container: {mounts: [\"/data/shared:/weights\"]}\n    run: [\"ls /weights\", \"cat /weights/passwd || true\"]\n";
    let p = busybox_project(batches, "");
    let data = data_dir();
    // Another user's folder on the host, and the runner's bind below it.
    let theirs = data.path().join("mallory");
    let shared = theirs.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("vocab.txt"), "the model's vocabulary\n").unwrap();
    nix::unistd::chown(&theirs, Some(4321.into()), Some(4321.into())).unwrap();
    let policy = HostPolicyFile::new("version: 1\ngrants:\n  mounts: [/data/shared]\n");
    let image = runner_image();
    let scope = format!("test-rc-{}", &p.image.0[7..19]);
    let out = Command::new("docker")
        .args([
            "run",
            "-d",
            "-i",
            "-v",
            "/var/run/docker.sock:/var/run/docker.sock",
        ])
        .arg("-v")
        .arg(format!("{}:/workspace/proj", p.project.path().display()))
        .arg("-v")
        .arg(format!("{}:/data/shared:ro", shared.display()))
        .arg("-v")
        .arg(format!(
            "{}:/etc/cibox/host.yaml:ro",
            policy.path().display()
        ))
        .arg(&image.0)
        .arg("sh")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runner = Runner(String::from_utf8_lossy(&out.stdout).trim().to_string());
    let batch_run = || {
        run(Command::new("docker")
            .args(["exec", "-w", "/workspace/proj", &runner.0])
            .args(["cibox", "batch", "run", "b", "--image", &p.image.0])
            .args([
                "--source",
                "/workspace/proj",
                "--reports",
                "/workspace/proj/reports",
            ])
            .args(["--scope", &scope]))
    };
    let r = batch_run();
    r.fails_with(
        2,
        &format!(
            "batches.b.container.mounts: source `/data/shared` is {} on the engine's host, which lies in {}, owned by uid 4321",
            shared.display(),
            theirs.display()
        ),
    );
    assert!(
        r.stderr
            .contains("bound into the runner container in its place"),
        "{}",
        r.stderr
    );
    assert!(p.containers().is_empty(), "{:?}", p.containers());
    assert!(!p.reports().join("b").exists(), "no batch folder");
    // The attack: they swap the folder for a link to the host's /etc after the runner
    // started (its bind still shows the old folder).
    std::fs::rename(&shared, theirs.join("old")).unwrap();
    std::os::unix::fs::symlink("/etc", &shared).unwrap();
    let r = batch_run();
    r.fails_with(2, "batches.b.container.mounts: source `/data/shared`");
    assert!(
        r.stderr.contains("through a link") || r.stderr.contains("another folder"),
        "{}",
        r.stderr
    );
    assert!(
        !r.stdout.contains("root:x:0:0"),
        "the host's /etc: {}",
        r.stdout
    );
    assert!(p.containers().is_empty(), "{:?}", p.containers());
    drop(runner);
}
