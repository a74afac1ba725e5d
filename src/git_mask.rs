//! The source without its git credentials.
//!
//! `actions/checkout` leaves the job's token in the checkout's `.git/config`
//! (`http.<url>.extraheader`), and others put tokens in remote URLs, in `insteadOf`
//! rules or behind credential helpers. A batch reads `/src`; it must not find them.
//! cibox writes a copy of each git config of the source that keeps only what git needs
//! to work with the checkout (core settings, remotes without user info, branches,
//! submodules, extensions) and mounts it, read-only, over the original.

use std::path::{Path, PathBuf};

use crate::git::GitError;

/// The sections kept; everything else (`http.*`, `credential.*`, `url.*`, `user.*`,
/// includes, aliases, hooks paths) is left out.
const KEPT_SECTIONS: &[&str] = &["core", "remote", "branch", "submodule", "extensions"];

/// Keys of kept sections that are left out all the same: they can run commands or
/// carry secrets.
const DROPPED_KEYS: &[&str] = &[
    "core.sshcommand",
    "core.askpass",
    "core.fsmonitor",
    "core.hookspath",
    "core.pager",
    "core.editor",
    "remote.*.pushurl",
    "remote.*.proxy",
];

/// Why the source's git configs could not be masked.
#[derive(Debug, thiserror::Error)]
pub enum MaskError {
    #[error("cannot write the source's git config without its credentials: {0}")]
    Write(#[from] std::io::Error),
    /// The walk for nested checkouts gave up: fail closed rather than miss one.
    #[error(
        "source {dir}: more than {max} folders to look through for checkouts nested in it, whose .git/config may hold credentials the batch would see; run from a smaller checkout (--source), or remove what the tests do not need from it (build outputs, virtual environments, caches)"
    )]
    TooManyFolders { dir: String, max: usize },
}

impl crate::error::ErrorKind for MaskError {
    fn failure(&self) -> crate::exit::Failure {
        match self {
            MaskError::Write(_) => crate::exit::Failure::Infra,
            MaskError::TooManyFolders { .. } => crate::exit::Failure::Usage,
        }
    }
}

/// Cleaned copies of a source's git configs, alive as long as this value.
pub struct GitMasks {
    _dir: Option<tempfile::TempDir>,
    /// `host:container:ro` binds over the originals.
    pub binds: Vec<String>,
}

/// Makes cleaned copies of `source`'s git configs (`.git/config` and those of its
/// submodules under `.git/modules`, and of repositories checked out inside it, such as
/// a second `actions/checkout` into `deps/x`, at any depth); none when there is no
/// `.git` folder. A config git cannot read (or no git) is masked with an empty one.
pub fn mask(source: &Path) -> Result<GitMasks, MaskError> {
    let configs = cleaned(source)?;
    if configs.is_empty() {
        return Ok(GitMasks {
            _dir: None,
            binds: Vec::new(),
        });
    }
    let dir = tempfile::Builder::new()
        .prefix("cibox-git-mask-")
        .tempdir()?;
    let mut binds = Vec::new();
    for (i, (rel, clean)) in configs.iter().enumerate() {
        let copy = dir.path().join(format!("config-{i}"));
        write_readable(&copy, clean)?;
        binds.push(format!("{}:/src/{}:ro", copy.display(), rel.display()));
    }
    Ok(GitMasks {
        _dir: Some(dir),
        binds,
    })
}

/// The git configs of `source` that [`mask`] covers, each by its path relative to
/// `source` with its cleaned text: what a batch reads in their place, and what an image
/// build's context carries in their place.
pub fn cleaned(source: &Path) -> Result<Vec<(PathBuf, String)>, MaskError> {
    let mut configs = Vec::new();
    for git_dir in git_dirs(source, NESTED_FOLDERS)? {
        configs.extend(configs_under(&git_dir));
    }
    Ok(configs
        .into_iter()
        .map(|config| {
            let listed: Result<Vec<u8>, GitError> = crate::git::run(
                source,
                &[
                    "config",
                    "--file",
                    &config.display().to_string(),
                    "--list",
                    "-z",
                ],
            );
            let clean = clean_config(&listed.unwrap_or_default());
            let rel = config.strip_prefix(source).unwrap_or(&config).to_path_buf();
            (rel, clean)
        })
        .collect())
}

/// The batch reads the copy as whatever user it runs as.
fn write_readable(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

/// How many folders of the source are looked through for nested checkouts at most: a
/// source of millions must not cost a walk of all of them, and one past this is refused
/// rather than run with a checkout's credentials unmasked.
const NESTED_FOLDERS: usize = 200_000;

/// The `.git` folders of the source and of repositories inside it, at any depth (no
/// link followed; `.git` folders themselves not entered), looking through at most
/// `max_folders` folders.
fn git_dirs(source: &Path, max_folders: usize) -> Result<Vec<PathBuf>, MaskError> {
    let mut out = Vec::new();
    let mut stack = vec![source.to_path_buf()];
    let mut seen = 0;
    while let Some(d) = stack.pop() {
        seen += 1;
        if seen > max_folders {
            return Err(MaskError::TooManyFolders {
                dir: source.display().to_string(),
                max: max_folders,
            });
        }
        // One the walk cannot read, a batch (never more privileged) cannot read either.
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name() == ".git" {
                out.push(e.path());
            } else {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `.git/config` and `.git/modules/**/config`, plain files only.
fn configs_under(git_dir: &Path) -> Vec<PathBuf> {
    let plain = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file());
    let mut out = Vec::new();
    if !std::fs::symlink_metadata(git_dir).is_ok_and(|m| m.is_dir()) {
        return out; // a worktree's `.git` file points outside the source
    }
    for name in ["config", "config.worktree"] {
        if plain(&git_dir.join(name)) {
            out.push(git_dir.join(name));
        }
    }
    if let Ok(entries) = std::fs::read_dir(git_dir.join("worktrees")) {
        for e in entries.flatten() {
            if plain(&e.path().join("config.worktree")) {
                out.push(e.path().join("config.worktree"));
            }
        }
    }
    let mut stack = vec![(git_dir.join("modules"), 0)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) && depth < 8 {
                if plain(&p.join("config")) {
                    out.push(p.join("config"));
                }
                stack.push((p.join("modules"), depth + 1));
                stack.push((p, depth + 1));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The kept entries of `git config --list -z` output, as a git config file.
pub fn clean_config(listed: &[u8]) -> String {
    let mut sections: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for entry in listed.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let entry = String::from_utf8_lossy(entry);
        let (key, value) = entry.split_once('\n').unwrap_or((&entry, "true"));
        let Some((section, name)) = key.rsplit_once('.') else {
            continue;
        };
        let top = section
            .split('.')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        if !KEPT_SECTIONS.contains(&top.as_str()) || dropped(&top, name) {
            continue;
        }
        // Any value can be a URL (`branch.*.remote`, `remote.pushDefault`).
        let value = without_user_info(value);
        match sections.iter_mut().find(|(s, _)| s == section) {
            Some((_, entries)) => entries.push((name.to_string(), value)),
            None => sections.push((section.to_string(), vec![(name.to_string(), value)])),
        }
    }
    let mut out = String::from("# cibox: the checkout's git config without credentials\n");
    for (section, entries) in sections {
        match section.split_once('.') {
            Some((top, sub)) => out.push_str(&format!("[{top} {}]\n", quote(sub))),
            None => out.push_str(&format!("[{section}]\n")),
        }
        for (name, value) in entries {
            out.push_str(&format!("\t{name} = {}\n", quote(&value)));
        }
    }
    out
}

fn dropped(top: &str, name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    DROPPED_KEYS.iter().any(|d| {
        let (s, n) = d.rsplit_once('.').unwrap_or_default();
        n == name && (s == top || s.split('.').next() == Some(top) && s.ends_with('*'))
    })
}

/// `https://user:token@host/x` → `https://host/x`; user info may hold a `/` (git takes
/// it), so it ends at the last `@` before the first `/` that follows an `@`. Other forms
/// as they are. Cutting too much only spoils the copy; cutting too little leaks.
fn without_user_info(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some(first_at) = rest.find('@')
    {
        let end = first_at + rest[first_at..].find('/').unwrap_or(rest.len() - first_at);
        let last_at = rest[..end].rfind('@').unwrap_or(first_at);
        return format!("{scheme}://{}", &rest[last_at + 1..]);
    }
    url.to_string()
}

/// A git config value or subsection in double quotes, escaped.
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind as _;

    #[test]
    fn credentials_are_left_out_and_the_rest_kept() {
        let listed = [
            "core.repositoryformatversion\n0",
            "core.bare\nfalse",
            "core.sshcommand\nssh -i /root/.ssh/deploy",
            "remote.origin.url\nhttps://x-access-token:ghs_SECRET1@github.com/o/r",
            "remote.origin.fetch\n+refs/heads/*:refs/remotes/origin/*",
            "http.https://github.com/.extraheader\nAUTHORIZATION: basic U0VDUkVUMg==",
            "credential.helper\nstore --file /root/.tok",
            "url.https://ghp_SECRET3@github.com/.insteadof\nhttps://github.com/",
            "branch.main.remote\norigin",
            "include.path\n/home/ci/.secrets",
            "branch.main.pushremote\nhttps://u:tok/SECRET4@example.com/o/r",
        ]
        .join("\0");
        let clean = clean_config(listed.as_bytes());
        for secret in [
            "SECRET1",
            "U0VDUkVUMg",
            "/root/.tok",
            "SECRET3",
            "deploy",
            "secrets",
        ] {
            assert!(!clean.contains(secret), "{secret} in:\n{clean}");
        }
        assert!(
            clean.contains("url = \"https://github.com/o/r\""),
            "{clean}"
        );
        assert!(clean.contains("[remote \"origin\"]"), "{clean}");
        assert!(clean.contains("[branch \"main\"]"), "{clean}");
        assert!(clean.contains("repositoryformatversion = \"0\""), "{clean}");
    }

    #[test]
    fn nested_checkouts_are_found_at_any_depth_and_a_walk_too_long_fails_closed() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b/c/d/e/f/g/h");
        for d in [tmp.path().join(".git"), deep.join(".git/modules/m")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::os::unix::fs::symlink(tmp.path().join("a"), tmp.path().join("loop")).unwrap();
        assert_eq!(
            git_dirs(tmp.path(), 100).unwrap(),
            [tmp.path().join(".git"), deep.join(".git")]
        );
        // Nine folders to look through (the source and a … h; none inside .git, no link
        // followed): past the most allowed, refused, never a partial answer.
        assert_eq!(git_dirs(tmp.path(), 9).unwrap().len(), 2);
        let err = git_dirs(tmp.path(), 8).unwrap_err();
        assert!(
            matches!(err, MaskError::TooManyFolders { max: 8, .. }),
            "{err}"
        );
        assert_eq!(err.failure(), crate::exit::Failure::Usage);
    }
}
