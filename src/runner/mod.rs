//! Running batches, each in its own disposable container (docs/interface.md §6, §7):
//! plan → execute → events → reporters.
//!
//! A front end (`batch run`, `layer run`, `image qualify`, `reproduce`) builds a
//! [`RunRequest`]; [`plan()`] resolves it against the manifest into a [`RunPlan`]
//! without touching anything; [`execute()`] runs the plan and hands back a
//! [`RunOutcome`], telling a [`Reporter`] what happens as it goes ([`Event`]).
//!
//! Per batch: lease its GPUs → create the container → start → stream its output →
//! wait with the deadline (or a signal) → collect reports → remove the container by
//! exact name → verdict → release the lease. The image is verified once, before
//! anything starts.

pub mod batch_dir;
pub mod collect;
pub mod container;
pub mod error;
pub mod event;
mod execute;
mod git_mask;
pub mod junit;
pub mod mounts;
pub mod outcome;
pub mod plan;
pub mod record;
pub mod reporter;
pub mod steps;
pub mod sweep;
pub mod watchdog;

use std::path::{Path, PathBuf};

pub use error::RunError;
pub use event::Event;
pub use execute::execute;
pub use outcome::{BatchResult, RunOutcome, Verdict};
pub use plan::{BatchPlan, HostFacts, PlanError, RunPlan, RunRequest, plan};
pub use record::SourceInfo;
pub use reporter::Reporter;

/// The source: the git toplevel (or `--source`), with its commit and dirtiness when it
/// is a checkout. Not being one is allowed and recorded.
pub fn source_info(dir: &Path) -> SourceInfo {
    let sha = crate::git::text(dir, &["rev-parse", "--verify", "HEAD"])
        .ok()
        .filter(|s| s.len() == 40);
    let dirty = sha
        .as_ref()
        .and_then(|_| {
            crate::git::text(dir, &["status", "--porcelain", "--untracked-files=normal"]).ok()
        })
        .map(|s| !s.is_empty());
    SourceInfo {
        sha,
        dirty,
        path: dir.display().to_string(),
    }
}

/// The git toplevel of the current folder.
pub fn git_toplevel() -> Option<PathBuf> {
    crate::git::text(Path::new("."), &["rev-parse", "--show-toplevel"])
        .ok()
        .map(PathBuf::from)
}

/// The default scope: per workflow run on GitHub Actions, per user elsewhere.
pub fn default_scope() -> String {
    if let (Ok(id), Ok(attempt)) = (
        std::env::var("GITHUB_RUN_ID"),
        std::env::var("GITHUB_RUN_ATTEMPT"),
    ) {
        return format!("gh-{id}-{attempt}");
    }
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| nix::unistd::getuid().to_string())
        });
    format!("local-{user}")
}

/// 16 hex digits from the kernel's random source.
pub fn new_run_id() -> String {
    crate::util::random_hex(8)
}
