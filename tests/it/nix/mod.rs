//! Offline checks of the Nix side: every tracked `.nix` parses and is formatted, the
//! flake's lock covers its inputs, `nix/lockset.nix` computes exactly what
//! `cibox image lockset` does, refusals included, in pure flake evaluation (as the flake
//! runs it) and in impure evaluation, the CUDA unfree predicate accepts exactly NVIDIA's
//! CUDA licences, and every output of the flake evaluates against a stand-in nixpkgs
//! written here (nixpkgs itself cannot be fetched on these machines). Nothing is built.
//!
//! One module per subject; the helpers they share (the repository's tracked files,
//! `nix eval`, `cibox image lockset` of a manifest) are here.

mod check_path;
mod cuda;
mod files;
mod lockset;
mod outputs;
mod stand_in;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

const NIX_CONFIG: &str = "experimental-features = nix-command flakes\nsubstituters =\n";

/// A flake.lock for a flake without inputs.
const EMPTY_LOCK: &str = r#"{"nodes":{"root":{}},"root":"root","version":7}"#;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn require_nix() {
    for tool in ["nix-instantiate", "nix"] {
        let ok = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            ok,
            "these tests need Nix (`{tool}`, Debian's nix-bin): run `bash .ci/run`, which installs it"
        );
    }
}

/// Flake evaluation without a daemon writes to the store: root only (CI runs as root).
fn require_root() {
    assert!(
        nix::unistd::getuid().is_root(),
        "evaluating a flake without a Nix daemon needs root (CI runs as root)"
    );
}

fn tracked_files() -> Vec<String> {
    let out = Command::new("git")
        .current_dir(repo())
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .split('\0')
        .filter(|s| !s.is_empty() && repo().join(s).symlink_metadata().is_ok())
        .map(str::to_string)
        .collect()
}

fn tracked_nix_files() -> Vec<PathBuf> {
    let files: Vec<PathBuf> = tracked_files()
        .iter()
        .filter(|s| s.ends_with(".nix"))
        .map(|s| repo().join(s))
        .collect();
    assert!(
        files.len() >= 6,
        "expected the flake's .nix files, found {files:?}"
    );
    files
}

/// Copies the tracked (and untracked, not ignored) files whose path starts with one of
/// `prefixes` (all when empty) into `to`, symlinks as symlinks: the flake as Nix would
/// see it, whatever the git state.
fn copy_tracked(to: &Path, prefixes: &[&str]) {
    for f in tracked_files() {
        if !prefixes.is_empty() && !prefixes.iter().any(|p| f.starts_with(p)) {
            continue;
        }
        let from = repo().join(&f);
        let dest = to.join(&f);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        let md = from.symlink_metadata().unwrap();
        if md.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from).unwrap(), &dest).unwrap();
        } else {
            std::fs::copy(&from, &dest).unwrap();
        }
    }
}

/// `nix eval --json --offline` of `installable` (a `path:` flake reference), with extra
/// arguments (`--override-input`, `--apply`): Ok(JSON) or Err(stderr).
fn nix_eval(installable: &str, extra: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new("nix")
        .env("NIX_CONFIG", NIX_CONFIG)
        .args(["eval", "--json", "--offline", "--no-update-lock-file"])
        .args(extra)
        .arg(installable)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `cibox image lockset [--name NAME] --json` of a manifest: Ok((digest, text)).
fn manifest_lockset(manifest: &Path, name: Option<&str>) -> Result<(String, String), String> {
    let mut cmd = cibox(manifest.parent().unwrap());
    cmd.arg("--manifest")
        .arg(manifest)
        .args(["image", "lockset", "--json"]);
    if let Some(name) = name {
        cmd.args(["--name", name]);
    }
    let r = run(&mut cmd);
    if r.code == 0 {
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        Ok((
            v["digest"].as_str().unwrap().to_string(),
            v["text"].as_str().unwrap().to_string(),
        ))
    } else {
        Err(r.stderr)
    }
}
