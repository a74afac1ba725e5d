//! Offline checks of the Nix side: every tracked `.nix` parses and is formatted, the
//! flake's lock covers its inputs, and `nix/lockset.nix` computes exactly what
//! `cibox image lockset` does, refusals included. Nothing here builds the flake:
//! nixpkgs cannot be fetched on these machines.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

const NIX_CONFIG: &str = "experimental-features = nix-command flakes\nsubstituters =\n";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn require_nix() {
    let ok = Command::new("nix-instantiate")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "these tests need Nix (Debian's nix-bin): run `bash .ci/run`, which installs it"
    );
}

fn tracked_nix_files() -> Vec<PathBuf> {
    let out = Command::new("git")
        .current_dir(repo())
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "*.nix",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "git ls-files failed");
    let files: Vec<PathBuf> = String::from_utf8(out.stdout)
        .unwrap()
        .split('\0')
        .filter(|s| !s.is_empty())
        .map(|s| repo().join(s))
        .filter(|p| p.exists())
        .collect();
    assert!(
        files.len() >= 6,
        "expected the flake's .nix files, found {files:?}"
    );
    files
}

#[test]
fn every_nix_file_parses() {
    require_nix();
    for f in tracked_nix_files() {
        let out = Command::new("nix-instantiate")
            .arg("--parse")
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn nix_files_are_formatted() {
    // alejandra, the Nix formatter, as a library: runs offline.
    for f in tracked_nix_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let (status, formatted) =
            alejandra::format::in_memory(f.display().to_string(), text.clone());
        assert!(
            !matches!(status, alejandra::format::Status::Error(_)),
            "{}: alejandra cannot parse it",
            f.display()
        );
        assert!(
            formatted == text,
            "{} is not formatted (alejandra); expected:\n{formatted}",
            f.display()
        );
    }
}

fn flake_metadata(dir: &Path) -> std::process::Output {
    Command::new("nix")
        .current_dir(dir)
        .env("NIX_CONFIG", NIX_CONFIG)
        .args([
            "flake",
            "metadata",
            "--no-update-lock-file",
            "--offline",
            "path:.",
        ])
        .output()
        .unwrap()
}

#[test]
fn the_lock_covers_every_flake_input() {
    require_nix();
    assert!(
        nix::unistd::getuid().is_root(),
        "`nix flake metadata` without a daemon needs root (CI runs as root)"
    );
    // A copy of just the flake, so the check does not depend on git state.
    let dir = tempfile::tempdir().unwrap();
    for f in ["flake.nix", "flake.lock"] {
        std::fs::copy(repo().join(f), dir.path().join(f)).unwrap();
    }
    for d in ["nix", "images/demo", "images/cuda-torch"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
        for e in std::fs::read_dir(repo().join(d)).unwrap().flatten() {
            std::fs::copy(e.path(), dir.path().join(d).join(e.file_name())).unwrap();
        }
    }
    let out = flake_metadata(dir.path());
    assert!(
        out.status.success(),
        "nix flake metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("531670d871c0e29724a02f3cbcac170adc65b58c")
    );
    // And the check has teeth: a lock without the input cannot be completed offline.
    std::fs::write(
        dir.path().join("flake.lock"),
        r#"{"nodes":{"root":{}},"root":"root","version":7}"#,
    )
    .unwrap();
    assert!(
        !flake_metadata(dir.path()).status.success(),
        "an incomplete lock passed"
    );
}

/// `nix/lockset.nix` over `root` and `locks`: Ok(digest) or Err(message).
fn nix_lockset(root: &Path, locks: &[&str]) -> Result<String, String> {
    let args = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        args.path(),
        serde_json::json!({"root": root, "locks": locks}).to_string(),
    )
    .unwrap();
    let expr = format!(
        "let a = builtins.fromJSON (builtins.readFile {}); in (import {} {{ root = /. + a.root; locks = a.locks; }}).digest",
        args.path().display(),
        repo().join("nix/lockset.nix").display()
    );
    let out = Command::new("nix-instantiate")
        .args(["--eval", "--strict", "--json", "-E", &expr])
        .output()
        .unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice::<String>(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `cibox image lockset` with a manifest written into `root`, which must be a scratch
/// folder of the test's own (the manifest is left there).
fn cibox_lockset(root: &Path, locks: &[&str]) -> Result<String, String> {
    assert!(
        !root.starts_with(repo()),
        "never write manifests into the checkout"
    );
    let manifest = root.join("cibox.yaml");
    let list = locks
        .iter()
        .map(|l| serde_json::to_string(l).unwrap())
        .collect::<Vec<_>>()
        .join(", ");
    std::fs::write(&manifest, format!("version: 1\nproject: p\nimage:\n  locks: [{list}]\nbatches:\n  b: {{gpus: 0, timeout: 1m, run: [x]}}\n")).unwrap();
    manifest_lockset(&manifest)
}

fn manifest_lockset(manifest: &Path) -> Result<String, String> {
    let r = run(cibox(manifest.parent().unwrap())
        .arg("--manifest")
        .arg(manifest)
        .args(["image", "lockset", "--json"]));
    if r.code == 0 {
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        Ok(v["digest"].as_str().unwrap().to_string())
    } else {
        Err(r.stderr)
    }
}

fn same(root: &Path, locks: &[&str]) {
    let n = nix_lockset(root, locks).unwrap_or_else(|e| panic!("nix lockset {locks:?}: {e}"));
    let c = cibox_lockset(root, locks).unwrap_or_else(|e| panic!("cibox lockset {locks:?}: {e}"));
    assert_eq!(n, c, "lockset digests differ for {locks:?}");
}

#[test]
fn lockset_parity_for_the_repository_images_and_the_example() {
    require_nix();
    // The manifests as committed, read only.
    for (manifest, locks) in [
        (
            repo().join("cibox.yaml"),
            vec!["flake.lock", "images/demo/*"],
        ),
        (
            repo().join("examples/demo/cibox.yaml"),
            vec!["images/demo/*"],
        ),
    ] {
        let n = nix_lockset(manifest.parent().unwrap(), &locks).unwrap();
        assert_eq!(Ok(n), manifest_lockset(&manifest), "{}", manifest.display());
    }
    // The cuda-torch image has no manifest here: compare over a copy of its locks.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(repo().join("flake.lock"), dir.path().join("flake.lock")).unwrap();
    std::fs::create_dir_all(dir.path().join("images/cuda-torch")).unwrap();
    for e in std::fs::read_dir(repo().join("images/cuda-torch"))
        .unwrap()
        .flatten()
    {
        std::fs::copy(
            e.path(),
            dir.path().join("images/cuda-torch").join(e.file_name()),
        )
        .unwrap();
    }
    same(dir.path(), &["flake.lock", "images/cuda-torch/*"]);
}

#[test]
fn lockset_parity_for_awkward_names_and_globs() {
    require_nix();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let names = [
        "with space.lock",
        "back\\slash.lock",
        "new\nline.lock",
        "tab\there.lock",
        "ünïcödé.lock",
        "quote'\"$(echo no).lock",
        "B-upper.lock",
        "a-lower.lock",
        ".hidden.lock",
        "deep/er/still/x.txt",
        "deep/y.txt",
        "deep/er/z.md",
        "sub/one.lock",
        "sub/dir/two.lock",
    ];
    for (i, n) in names.iter().enumerate() {
        let p = root.join(n);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("content {i}\n")).unwrap();
    }
    std::os::unix::fs::symlink("a-lower.lock", root.join("link.lock")).unwrap();
    same(root, &["*.lock"]);
    same(root, &["deep/**/*.txt"]);
    same(root, &["**/*.lock"]);
    same(root, &["sub/*", "a-lower.lock", "*.lock"]);
    same(
        root,
        &[
            "deep/er/z.md",
            "new\nline.lock",
            "[ab]-*.lock",
            "?-upper.lock",
        ],
    );
}

#[test]
fn nix_lockset_refuses_what_cibox_refuses() {
    require_nix();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.lock"), "a").unwrap();
    for (locks, nix_says, cibox_says) in [
        (
            vec!["missing.lock"],
            "lock pattern `missing.lock` matches no file",
            "matches no file",
        ),
        (
            vec!["*.toml"],
            "lock pattern `*.toml` matches no file",
            "matches no file",
        ),
        (vec![], "image.locks is empty", "image.locks is empty"),
    ] {
        let n = nix_lockset(dir.path(), &locks).unwrap_err();
        assert!(n.contains(nix_says), "nix said: {n}");
        let c = cibox_lockset(dir.path(), &locks).unwrap_err();
        assert!(c.contains(cibox_says), "cibox said: {c}");
    }
}
