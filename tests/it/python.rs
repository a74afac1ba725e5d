//! A real Python package's pytest suite in a Debian image the harness builds itself:
//! debootstrap (Debian's packages, pinned by the lock file it records) → `cibox image
//! build` (FROM scratch over the rootfs) → `cibox batch run` with the source installed by
//! `pip install --no-deps` into a venv that sees the image's packages → its JUnit read.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

const PACKAGES: &str = "python3,python3-pytest,python3-venv,python3-setuptools,python3-wheel";

fn sh(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The Debian rootfs, made once per build folder (debootstrap takes a minute or two).
pub(crate) fn debian_rootfs(cache: &Path) -> PathBuf {
    let rootfs = cache.join("image/rootfs");
    if rootfs.join("usr/bin/python3").exists() {
        return rootfs;
    }
    assert!(
        Path::new("/usr/sbin/debootstrap").exists() && nix::unistd::getuid().is_root(),
        "this test builds a Debian image with debootstrap as root: run `bash .ci/run` (installs debootstrap) as root"
    );
    let partial = cache.join("rootfs.partial");
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(cache.join("image")).unwrap();
    sh(
        Command::new("debootstrap")
            .args([
                "--variant=minbase",
                &format!("--include={PACKAGES}"),
                "bookworm",
            ])
            .arg(&partial)
            .arg("http://deb.debian.org/debian"),
        "debootstrap",
    );
    for d in ["work", "src", "reports"] {
        std::fs::create_dir_all(partial.join(d)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        partial.join("work"),
        std::fs::Permissions::from_mode(0o1777),
    )
    .unwrap();
    // What the image is made of, as a lock file: every package and its exact version.
    let packages = sh(
        Command::new("dpkg-query")
            .arg(format!(
                "--admindir={}",
                partial.join("var/lib/dpkg").display()
            ))
            .args(["-W", "-f", "${Package}=${Version}\n"]),
        "dpkg-query",
    );
    std::fs::write(cache.join("image/packages.lock"), packages).unwrap();
    std::fs::rename(&partial, &rootfs).unwrap();
    rootfs
}

/// The sdist of `six` (MIT), a real package whose suite runs under pytest.
fn six_source(cache: &Path) -> PathBuf {
    let dir = cache.join("six-1.16.0");
    if dir.join("test_six.py").exists() {
        return dir;
    }
    sh(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "six==1.16.0",
                "-d",
            ])
            .arg(cache),
        "pip download six",
    );
    sh(
        Command::new("tar")
            .arg("-xzf")
            .arg(cache.join("six-1.16.0.tar.gz"))
            .arg("-C")
            .arg(cache),
        "tar",
    );
    dir
}

#[test]
fn pytest_suite_of_a_real_package_in_a_debian_image() {
    require_engine();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("debian-python");
    std::fs::create_dir_all(&cache).unwrap();
    debian_rootfs(&cache);
    let source = six_source(&cache);
    std::fs::write(
        cache.join("image/Dockerfile"),
        "FROM scratch\nCOPY rootfs/ /\nENV PATH=/usr/bin:/bin\n",
    )
    .unwrap();
    std::fs::write(
        cache.join("cibox.yaml"),
        r#"version: 1
project: six-ci
image:
  locks: [image/Dockerfile, image/packages.lock]
  dockerfile: image/Dockerfile
source:
  install:
    - python3 -m venv --system-site-packages /tmp/venv
    - /tmp/venv/bin/pip install --no-deps --no-build-isolation --no-index .
container: {memory: 1g, pids: 512}
batches:
  six:
    description: six's own test suite, against the installed package
    gpus: 0
    timeout: 10m
    preflight: ["cd /tmp && /tmp/venv/bin/python -c 'import six, pytest; print(six.__file__)'"]
    run: ["cd /tmp && /tmp/venv/bin/python -m pytest -q -p no:cacheprovider --junitxml=$CIBOX_REPORTS/junit.xml /work/test_six.py"]
"#,
    )
    .unwrap();
    let r = {
        let _store = image_store_lock(false);
        run(cibox(&cache).args(["image", "build"]))
    };
    r.ok();
    let image = ImageGuard(r.stdout.trim().to_string());
    let reports = tempfile::tempdir().unwrap();
    let r = run(cibox(&cache)
        .args([
            "batch",
            "run",
            "six",
            "--image",
            &image.0,
            "--scope",
            &format!("py-{}", nonce()),
        ])
        .arg("--source")
        .arg(&source)
        .arg("--reports")
        .arg(reports.path()));
    r.ok();
    let log = std::fs::read_to_string(reports.path().join("six/log.txt")).unwrap();
    assert!(
        log.contains("/tmp/venv/lib/python3.11/site-packages/six.py"),
        "six not from the venv:\n{log}"
    );
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(reports.path().join("six/result.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(v["status"], "passed");
    assert!(
        v["tests"]["total"].as_u64().unwrap() > 100,
        "{}",
        v["tests"]
    );
    assert_eq!(v["tests"]["failed"], 0);
}
