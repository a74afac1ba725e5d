//! Changed test files between two revisions, and how many GPUs each needs.
//!
//! Replaces `git diff --name-only --diff-filter=AM … | grep -oP '^NUM_GPUS…'`: renames
//! count, a missing marker falls back to the default with a warning instead of aborting,
//! an annotated `NUM_GPUS: int = 4` is read, and file names stay data (the matrix is
//! written by a JSON serializer, never pasted into code).

use std::path::Path;
use std::process::Command;

/// `*` stays within a folder, `**` crosses folders.
pub fn glob_matches(pattern: &str, path: &str) -> bool {
    let opts = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    glob::Pattern::new(pattern).is_ok_and(|p| p.matches_with(path, opts))
}

/// The value of a top-level `MARKER = <int>` or `MARKER: int = <int>` line.
pub fn gpus_marker(text: &str, marker: &str) -> Option<u32> {
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(marker) else {
            continue;
        };
        let rest = rest.trim_start();
        let rest = match rest.strip_prefix(':') {
            Some(annotated) => {
                let a = annotated.trim_start();
                a.strip_prefix("int").map(str::trim_start).unwrap_or(a)
            }
            None => rest,
        };
        let Some(value) = rest.strip_prefix('=') else {
            continue;
        };
        let value = value.split('#').next().unwrap_or("").trim();
        if let Ok(n) = value.parse::<u32>() {
            return Some(n);
        }
    }
    None
}

fn git(dir: &Path, args: &[&str]) -> Result<Vec<u8>, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr)
            .lines()
            .next()
            .unwrap_or("git failed")
            .to_string());
    }
    Ok(out.stdout)
}

/// Resolves a revision to a commit, or says it is not one.
pub fn commit(dir: &Path, rev: &str) -> Result<String, String> {
    let spec = format!("{rev}^{{commit}}");
    git(dir, &["rev-parse", "--verify", "--quiet", &spec])
        .map(|o| String::from_utf8_lossy(&o).trim().to_string())
        .map_err(|_| format!("`{rev}` is not a revision in {}", dir.display()))
}

/// Files added, modified or renamed (new name) between the merge base of `base` and
/// `head`, relative to `dir`.
pub fn changed_paths(dir: &Path, base: &str, head: &str) -> Result<Vec<String>, String> {
    let b = commit(dir, base)?;
    let h = commit(dir, head)?;
    let mb = git(dir, &["merge-base", &b, &h])
        .map_err(|e| format!("no merge base of {base} and {head}: {e}"))?;
    let mb = String::from_utf8_lossy(&mb).trim().to_string();
    let out = git(
        dir,
        &[
            "diff",
            "--relative",
            "--name-status",
            "-z",
            "-M",
            "--diff-filter=AMR",
            &mb,
            &h,
        ],
    )?;
    // -z output: STATUS \0 PATH \0, or for renames STATUS \0 OLD \0 NEW \0.
    let fields: Vec<String> = out
        .split(|b| *b == 0)
        .filter(|f| !f.is_empty())
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < fields.len() {
        let status = &fields[i];
        if status.starts_with('R') || status.starts_with('C') {
            if let Some(new) = fields.get(i + 2) {
                paths.push(new.clone());
            }
            i += 3;
        } else {
            if let Some(p) = fields.get(i + 1) {
                paths.push(p.clone());
            }
            i += 2;
        }
    }
    Ok(paths)
}

/// A file's text at `rev` (path relative to `dir`).
pub fn show(dir: &Path, rev: &str, path: &str) -> Result<String, String> {
    git(dir, &["show", &format!("{rev}:./{path}")])
        .map(|o| String::from_utf8_lossy(&o).into_owned())
}

/// Tracked files under `dir`, relative to it.
pub fn tracked(dir: &Path) -> Result<Vec<String>, String> {
    let out = git(dir, &["ls-files", "-z"])?;
    Ok(out
        .split(|b| *b == 0)
        .filter(|f| !f.is_empty())
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers() {
        assert_eq!(gpus_marker("import x\nNUM_GPUS = 4\n", "NUM_GPUS"), Some(4));
        assert_eq!(
            gpus_marker("NUM_GPUS: int = 2  # two\n", "NUM_GPUS"),
            Some(2)
        );
        assert_eq!(gpus_marker("NUM_GPUS=8", "NUM_GPUS"), Some(8));
        assert_eq!(gpus_marker("    NUM_GPUS = 4\n", "NUM_GPUS"), None);
        assert_eq!(
            gpus_marker("NUM_GPUS_X = 4\nNUM_GPUS = five\n", "NUM_GPUS"),
            None
        );
    }

    #[test]
    fn globs() {
        assert!(glob_matches("tests/test_*.py", "tests/test_a.py"));
        assert!(!glob_matches("tests/test_*.py", "tests/sub/test_a.py"));
        assert!(glob_matches(
            "tests/**/test_*.py",
            "tests/sub/deep/test_a.py"
        ));
        assert!(glob_matches("tests/**/test_*.py", "tests/test_a.py"));
    }
}
