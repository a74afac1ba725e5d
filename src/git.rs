//! Running git, for what cibox asks of the source: its commit, what changed, worktrees.

use std::path::Path;
use std::process::{Command, Stdio};

/// Why git did not answer.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("cannot run git: {0}")]
    Spawn(#[source] std::io::Error),
    /// git ran and failed; the first line it printed on stderr.
    #[error("{0}")]
    Failed(String),
}

impl crate::error::ErrorKind for GitError {
    /// git is asked about the user's checkout and revisions.
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
}

/// Runs `git -C dir ARGS`; stdout, or the first line git printed on stderr.
pub fn run(dir: &Path, args: &[&str]) -> Result<Vec<u8>, GitError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(GitError::Spawn)?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(GitError::Failed(
            err.lines()
                .next()
                .unwrap_or("git failed")
                .trim()
                .to_string(),
        ));
    }
    Ok(out.stdout)
}

/// Why git cannot be run here, when it cannot (`git --version` does not answer).
pub fn unusable() -> Option<GitError> {
    match Command::new("git")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => None,
        Ok(s) => Some(GitError::Failed(format!("`git --version` exited with {s}"))),
        Err(e) => Some(GitError::Spawn(e)),
    }
}

/// The folder at or above `dir` that holds `.git` (a checkout's top), if any.
pub fn checkout_above(dir: &Path) -> Option<&Path> {
    dir.ancestors()
        .find(|d| std::fs::symlink_metadata(d.join(".git")).is_ok())
}

/// Like [`run`], as trimmed text.
pub fn text(dir: &Path, args: &[&str]) -> Result<String, GitError> {
    run(dir, args).map(|o| String::from_utf8_lossy(&o).trim().to_string())
}
