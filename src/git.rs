//! Running git, for what cibox asks of the source: its commit, what changed, worktrees.

use std::path::Path;
use std::process::{Command, Stdio};

/// Runs `git -C dir ARGS`; stdout, or the first line git printed on stderr.
pub fn run(dir: &Path, args: &[&str]) -> Result<Vec<u8>, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err
            .lines()
            .next()
            .unwrap_or("git failed")
            .trim()
            .to_string());
    }
    Ok(out.stdout)
}

/// Like [`run`], as trimmed text.
pub fn text(dir: &Path, args: &[&str]) -> Result<String, String> {
    run(dir, args).map(|o| String::from_utf8_lossy(&o).trim().to_string())
}
