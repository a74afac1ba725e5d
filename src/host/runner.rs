//! The folders of the CI runner cibox runs under: what no host mount may show (its
//! credentials, every job's files), and where a pull request's files lie (so nothing
//! there is trusted as the host's, a policy least of all).

use std::path::{Path, PathBuf};

fn var(v: &str) -> Option<PathBuf> {
    std::env::var_os(v)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
}

/// The folders of the GitHub Actions runner cibox runs under, if any: its install
/// folder (`.runner`, `.credentials`, the runner's private key: found as the nearest
/// folder above the workspace holding `.runner` or `.credentials`), its work folder
/// (every job's checkout; the parent of `RUNNER_WORKSPACE`, whatever it is called),
/// `RUNNER_TEMP` and `RUNNER_TOOL_CACHE`.
pub fn runner_folders() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let workspaces: Vec<PathBuf> = ["RUNNER_WORKSPACE", "GITHUB_WORKSPACE"]
        .iter()
        .filter_map(|v| var(v))
        .collect();
    if let Some(work) = var("RUNNER_WORKSPACE").as_deref().and_then(Path::parent) {
        out.push(work.to_path_buf());
    }
    for w in &workspaces {
        if let Some(home) = w
            .ancestors()
            .find(|a| a.join(".runner").exists() || a.join(".credentials").exists())
        {
            out.push(home.to_path_buf());
        }
    }
    out.extend(
        ["RUNNER_TEMP", "RUNNER_TOOL_CACHE"]
            .iter()
            .filter_map(|v| var(v)),
    );
    out.retain(|p| p.is_absolute() && p != Path::new("/"));
    out
}

/// Where a pull request's files are: the runner's work folder (every job's checkout),
/// `GITHUB_WORKSPACE`, `RUNNER_TEMP`, `RUNNER_TOOL_CACHE`, and the git checkout of the
/// current folder.
pub fn pull_request_folders() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["GITHUB_WORKSPACE", "RUNNER_TEMP", "RUNNER_TOOL_CACHE"]
        .iter()
        .filter_map(|v| var(v))
        .collect();
    if let Some(work) = var("RUNNER_WORKSPACE").as_deref().and_then(Path::parent) {
        out.push(work.to_path_buf());
    }
    if let Ok(top) = crate::git::text(Path::new("."), &["rev-parse", "--show-toplevel"]) {
        out.push(PathBuf::from(top));
    }
    out.retain(|p| p.is_absolute() && p != Path::new("/"));
    out.into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect()
}
