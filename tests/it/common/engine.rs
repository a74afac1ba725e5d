//! The real Docker engine: [`require_engine`] and [`require_registry`] (engine tests
//! fail with instructions, never skip, when there is none), images built with the
//! engine's own CLI ([`docker_build`], [`docker_build_dir`]), the local registry
//! ([`REGISTRY`], [`push_to_registry`]), and [`image_exists`].
//!
//! Rules kept here:
//! - Image builds and removals of all test processes go through [`image_store_lock`]
//!   (builds share it, a removal takes it alone), so no build sees an image vanish.
//! - Tests remove only images they built: an [`ImageGuard`] removes its image when
//!   dropped, [`remove_image`] is called with the test's own IDs, and
//!   [`push_to_registry`] untags only the tag it added.

use std::path::Path;
use std::process::{Command, Stdio};

use super::cli::nonce;

/// Panics with instructions when no Docker engine answers: engine tests never skip.
pub fn require_engine() {
    let ok = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "this test needs a running Docker engine and the docker CLI; run `bash .ci/run` (installs docker.io and starts dockerd) or start dockerd yourself"
    );
}

/// Image builds and image removals of all test processes exclude each other. The
/// classic builder's cache lookup reads other images, and Docker 20.10 fails a build
/// ("unable to find image", "failed to get digest") when one of them is removed by a
/// parallel test meanwhile. Builds share the lock; a removal takes it alone.
pub struct ImageStoreLock(#[allow(dead_code)] std::fs::File);

pub fn image_store_lock(exclusive: bool) -> ImageStoreLock {
    let path = std::env::temp_dir().join("cibox-tests-image-store.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if exclusive { f.lock() } else { f.lock_shared() }.expect("lock the image store");
    ImageStoreLock(f)
}

/// The local registry `.ci/run` starts (Debian's docker-registry on 127.0.0.1:5000).
pub const REGISTRY: &str = "127.0.0.1:5000";

pub fn require_registry() {
    require_engine();
    let ok = std::net::TcpStream::connect_timeout(
        &REGISTRY.parse().unwrap(),
        std::time::Duration::from_secs(2),
    )
    .is_ok();
    assert!(
        ok,
        "this test needs a registry on {REGISTRY}: run `bash .ci/run` (installs Debian's docker-registry and starts it) or `bash .ci/setup-host.sh`"
    );
}

/// Pushes a local image to the test registry under a fresh name and returns its
/// pinned reference (`REPO@sha256:…`).
pub fn push_to_registry(id: &str) -> String {
    require_registry();
    let repo = format!("{REGISTRY}/cibox-test/{}", nonce().to_lowercase());
    let tagged = format!("{repo}:push");
    let ok = |args: &[&str]| {
        let out = Command::new("docker").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    ok(&["tag", id, &tagged]);
    ok(&["push", &tagged]);
    let digests = ok(&[
        "inspect",
        "--format",
        "{{range .RepoDigests}}{{.}} {{end}}",
        id,
    ]);
    let pinned = digests
        .split_whitespace()
        .find(|d| d.starts_with(&repo))
        .unwrap_or_else(|| panic!("no digest of {repo} in {digests}"))
        .to_string();
    ok(&["rmi", &tagged]);
    pinned
}

/// `docker image rm -f ID`, not during any test's build; whether it succeeded.
pub fn remove_image(id: &str) -> bool {
    let _store = image_store_lock(true);
    Command::new("docker")
        .args(["image", "rm", "-f", id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Removes the image when dropped.
pub struct ImageGuard(pub String);

impl Drop for ImageGuard {
    fn drop(&mut self) {
        remove_image(&self.0);
    }
}

/// Builds a one-file image FROM scratch with the engine's own CLI (not cibox), with the
/// given labels. Returns its full ID.
pub fn docker_build(labels: &[(&str, &str)]) -> ImageGuard {
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(ctx.path().join("nonce"), nonce()).unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        "FROM scratch\nCOPY nonce /nonce\n",
    )
    .unwrap();
    docker_build_dir(ctx.path(), labels)
}

/// `docker build` (classic builder, no cache) of a folder with the engine's own CLI.
pub fn docker_build_dir(dir: &Path, labels: &[(&str, &str)]) -> ImageGuard {
    require_engine();
    let _store = image_store_lock(false);
    let mut c = Command::new("docker");
    c.env("DOCKER_BUILDKIT", "0")
        .args(["build", "-q", "--no-cache"]);
    for (k, v) in labels {
        c.arg("--label").arg(format!("{k}={v}"));
    }
    let out = c.arg(dir).output().expect("docker build");
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout)
        .trim()
        .lines()
        .last()
        .unwrap()
        .to_string();
    assert!(id.starts_with("sha256:"), "{id}");
    ImageGuard(id)
}

/// `DOCKER_BUILDKIT=1 docker build` of a folder (no cache), with the engine's BuildKit:
/// the engine's own client (`/usr/bin/docker`, Debian's 20.10), as a newer client
/// first on PATH wants the buildx plugin for BuildKit.
pub fn docker_buildkit_dir(dir: &Path) -> ImageGuard {
    require_engine();
    let client = Path::new("/usr/bin/docker");
    assert!(
        client.exists(),
        "this test needs Debian's docker client at /usr/bin/docker (docker.io): run `bash .ci/setup-host.sh`"
    );
    let _store = image_store_lock(false);
    let out = Command::new(client)
        .env("DOCKER_BUILDKIT", "1")
        .args(["build", "-q", "--no-cache"])
        .arg(dir)
        .output()
        .expect("docker build");
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(id.starts_with("sha256:"), "{id}");
    ImageGuard(id)
}

/// Whether the engine knows an image.
pub fn image_exists(id: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The name `cibox image build` gives an image of `project` by its ID
/// (`cibox/PROJECT:id-<hex>`), which a `FROM` takes.
pub fn own_name(project: &str, id: &str) -> String {
    format!("cibox/{project}:id-{}", id.trim_start_matches("sha256:"))
}
