//! `workflow lint`: refusing workflows that let outsiders' code or text onto self-hosted
//! runners (and other places holding the base repository's permissions).
//!
//! Workflows are read with `github-actions-models` (zizmor's typed models of GitHub
//! Actions) and conditions with `github-actions-expressions`; positions come from our own
//! YAML tree ([`crate::yaml`]), which keeps a line and column for every node.
//!
//! This file reads workflow files and their neighbours ([`lint_file`]) and starts
//! [`run`] on each; the modules, each importing only those listed after it:
//!
//! - [`report`]: what lint found over its files: counted, shown, its exit code;
//! - [`sarif`]: findings as SARIF, for code scanning;
//! - [`run`]: one workflow linted in one scope: parsed, its facts gathered, the rules
//!   run on every job, the findings ordered and merged; called workflows recursively;
//! - [`call`]: the scope a called workflow is linted in, and its findings carried back;
//! - [`audit`]: what a job may not do when outsiders can reach it, one rule per file,
//!   listed in [`audit::registry`];
//! - [`facts`]: what the rules read about a workflow and its jobs (steps, runners,
//!   triggers, taint, the pull request's head), computed once;
//! - [`parse`]: a workflow's text to its model, or an `unparsable` finding saying why;
//! - [`source`]: positions in a workflow's text, and how the files it names are read;
//! - [`finding`] and [`rule`]: what lint reports;
//! - [`guard`]: which events outsiders can cause, and whether an `if:` keeps them out;
//! - [`expr`]: expressions inside text, and context paths.

mod audit;
mod call;
pub mod expr;
mod facts;
mod finding;
pub mod guard;
mod parse;
pub mod report;
mod rule;
mod run;
pub mod sarif;
mod source;

use std::path::{Path, PathBuf};

pub use finding::Finding;
pub use rule::{Rule, Severity};
pub use source::Resolver;

use facts::scope::Scope;
use parse::FILE_START;
use run::Linter;

/// The largest workflow file read; GitHub's own limit is far lower, and a bigger file is
/// more likely a mistake (or a trap) than a workflow.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Lints one workflow file's text. A file that cannot be read as a workflow gives one
/// `unparsable` finding. Workflows it calls are read through `resolve`, and linted as
/// reached by the calling job's triggers.
pub fn lint_source(file: &str, text: &str, resolve: Resolver<'_>) -> Vec<Finding> {
    Linter::new(resolve, audit::registry::AUDITS).lint(&Scope::own(file), text)
}

/// Reads a workflow file someone else wrote: a plain file (no FIFO or device), at most
/// [`MAX_FILE_BYTES`].
fn read_workflow(path: &Path, follow: bool) -> Result<String, String> {
    use std::io::Read;
    if !follow && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err("a symbolic link: not followed (it could point anywhere on this host; name the file itself to lint it)".into());
    }
    let (f, md) = crate::util::open_plain(path, follow).map_err(|e| format!("cannot read: {e}"))?;
    let too_big = || format!("larger than {} KiB: not read", MAX_FILE_BYTES >> 10);
    if md.len() > MAX_FILE_BYTES {
        return Err(too_big());
    }
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big());
    }
    String::from_utf8(bytes)
        .map_err(|e| format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()))
}

/// The folder `uses: ./PATH` is read from for a workflow in `dir`: the nearest folder at
/// or above it that has a `.github` folder (for `REPO/.github/workflows`, `REPO`), not
/// past the repository's root (`.git`).
fn repository_root(dir: &Path) -> Option<PathBuf> {
    let dir = std::fs::canonicalize(dir).ok()?;
    for a in dir.ancestors() {
        if a.join(".github").is_dir() {
            return Some(a.to_path_buf());
        }
        if a.join(".git").exists() {
            return None;
        }
    }
    None
}

/// A path as findings show it: from the current folder when it is below it.
fn shown(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
        .display()
        .to_string()
}

/// Reads and lints one file; an unreadable file is an `unparsable` finding too. A local
/// reusable workflow it calls (`./.github/workflows/NAME`) is read from the same folder;
/// a local action it uses (`./PATH`, its `action.yml`) from the repository around it
/// ([`repository_root`]); never through a symbolic link or out of the repository.
/// `follow` says whether `path` itself may be a link (a file named on the command line,
/// not one found in a folder).
pub fn lint_file(path: &Path, follow: bool) -> Vec<Finding> {
    let file = path.display().to_string();
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let dir = if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    };
    let root = repository_root(&dir);
    let resolve = move |uses: &str| -> Option<(String, String)> {
        let rel = uses.trim().trim_start_matches("./");
        if rel.contains('@') || rel.split('/').any(|c| c == ".." || c.is_empty()) {
            return None;
        }
        if let Some(name) = rel.strip_prefix(".github/workflows/")
            && !name.contains('/')
        {
            let callee = dir.join(name);
            let text = read_workflow(&callee, false).ok()?;
            return Some((callee.display().to_string(), text));
        }
        let target = root.as_ref()?.join(rel);
        let text = read_workflow(&target, false).ok()?;
        Some((shown(&target), text))
    };
    match read_workflow(path, follow) {
        Ok(text) => lint_source(&file, &text, &resolve),
        Err(why) => vec![Finding::unparsable(&file, FILE_START, why)],
    }
}
