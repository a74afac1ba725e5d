//! Puts the commit cibox was built from into `cibox --version`: `CIBOX_COMMIT` when the
//! builder sets it (the Nix flake does, from the flake's revision: its source has no
//! `.git`), else what git says of this checkout, else `unknown`.
//!
//! The script reruns only when the commit or the binary's own source can have changed
//! (as nextest's build.rs does): HEAD, the branch it points to, `packed-refs`, and the
//! files the binary is built from. Never git's index: `git status` and `git add` rewrite
//! it, and watching it recompiled the crate after every one of them. Only paths that
//! exist are named (cargo reruns a script on every build while a watched path is
//! missing), found through git (in a worktree `.git` is a file naming the real folder).

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the binary is built from: `-dirty` means one of these differs from the commit.
const SOURCE: &[&str] = &["src", "build.rs", "Cargo.toml", "Cargo.lock"];

fn main() {
    println!("cargo:rerun-if-env-changed=CIBOX_COMMIT");
    for path in SOURCE {
        println!("cargo:rerun-if-changed={path}");
    }
    let commit = std::env::var("CIBOX_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            watch_git();
            git_commit()
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=CIBOX_COMMIT={commit}");
}

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Watches what moves when the commit does: HEAD (this worktree's), the ref HEAD names
/// and `packed-refs` (both in the common folder, shared by worktrees).
fn watch_git() {
    let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) else {
        return;
    };
    let common = git(&["rev-parse", "--git-common-dir"])
        .map(|c| absolute(&c))
        .unwrap_or_else(|| git_dir.clone());
    let mut watched = vec![git_dir.join("HEAD"), common.join("packed-refs")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git_dir.join(&branch));
        watched.push(common.join(&branch));
    }
    for path in watched.iter().filter(|p| p.is_file()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn absolute(path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

/// The short commit, with `-dirty` when the binary's source differs from it.
fn git_commit() -> Option<String> {
    let sha = git(&["rev-parse", "--short=12", "HEAD"])?;
    let mut status = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    status.extend(SOURCE);
    let dirty = git(&status).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{sha}-dirty") } else { sha })
}
