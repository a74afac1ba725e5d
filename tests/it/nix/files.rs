//! The Nix files themselves: every tracked `.nix` parses and is formatted, and the
//! flake's lock covers its inputs.

use std::path::Path;
use std::process::Command;

use super::{EMPTY_LOCK, NIX_CONFIG, copy_tracked, require_nix, require_root, tracked_nix_files};

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
    require_root();
    // A copy of just the flake, so the check does not depend on git state.
    let dir = tempfile::tempdir().unwrap();
    copy_tracked(dir.path(), &["flake.nix", "flake.lock", "nix/", "images/"]);
    let out = flake_metadata(dir.path());
    assert!(
        out.status.success(),
        "nix flake metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("5880666fd9eb563038431edb35c2d0aa595884e6")
    );
    // And the check has teeth: a lock without the input cannot be completed offline.
    std::fs::write(dir.path().join("flake.lock"), EMPTY_LOCK).unwrap();
    assert!(
        !flake_metadata(dir.path()).status.success(),
        "an incomplete lock passed"
    );
}
