//! `cibox host setup` and `cibox host policy`.

use std::path::PathBuf;

use serde_json::json;

use super::context::Context;
use crate::console;
use crate::error::{ErrorKind, Result};
use crate::exit::{self, Failure};
use crate::gpu::probe::Prober;
use crate::lockdir::setup::setup as setup_lock_dir;

/// What `host setup` refuses.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("host setup makes the lock dir root's: run it as root (sudo cibox host setup)")]
    NotRoot,
    #[error("--lock-dir {}: must be an absolute path", .dir.display())]
    RelativeLockDir { dir: PathBuf },
}

impl ErrorKind for SetupError {
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}

/// `cibox host setup`: the lock dir and every file a lease depends on, root's.
pub fn setup(ctx: &Context, lock_dir: Option<PathBuf>) -> Result<u8> {
    if !nix::unistd::geteuid().is_root() {
        return Err(SetupError::NotRoot.into());
    }
    let gpu = ctx.gpu_without_manifest()?;
    let dir = lock_dir.unwrap_or(gpu.lock_dir.clone());
    if !dir.is_absolute() {
        return Err(SetupError::RelativeLockDir { dir }.into());
    }
    // Each GPU's lock file is made now, so none is ever first made by another user.
    let snap = Prober::new(gpu.probe).probe()?;
    let uuids: Vec<String> = snap.gpus.iter().map(|g| g.uuid.clone()).collect();
    let report = setup_lock_dir(&dir, &uuids)?;
    if ctx.json {
        console::json(&json!({
            "lock_dir": dir,
            "gpus": uuids,
            "done": report.done,
            "left": report.left,
        }));
    } else {
        // Names found in the lock dir are anyone's.
        for line in &report.done {
            println!("{}", crate::util::escape(line));
        }
        println!(
            "lock dir {} is root's, with lock files for {} GPU(s)",
            dir.display(),
            uuids.len()
        );
    }
    for line in &report.left {
        console::warn(line);
    }
    Ok(if report.left.is_empty() {
        exit::SUCCESS
    } else {
        exit::INFRA
    })
}

/// `cibox host policy`: the policy in force and what it grants.
pub fn policy(ctx: &Context) -> Result<u8> {
    let p = ctx.host_policy()?;
    if ctx.json {
        console::json(&json!({
            "path": p.source.as_ref().map(|s| &s.path),
            "digest": p.source.as_ref().map(|s| &s.digest),
            "grants": p.grants_summary(),
            "scheduler": p.scheduler.describe(),
        }));
    } else {
        println!("{}", p.describe());
        println!("{}", p.grants_summary());
        println!("scheduler: {}", p.scheduler.describe());
    }
    Ok(exit::SUCCESS)
}
