//! Changed test files between two revisions, and how many GPUs each needs.
//!
//! Replaces `git diff --name-only --diff-filter=AM … | grep -oP '^NUM_GPUS…'`: every
//! change counts (added, copied, modified, type-changed, deleted, and a rename as its
//! new name, and as its old one too where the manifest says `renames: both`, as
//! dorny/paths-filter counts it; `git diff --name-only`, vLLM's, lists the new name
//! alone), a missing marker falls back to the default with a warning instead of
//! aborting, an annotated `NUM_GPUS: int = 4` is read, and file names stay data (the
//! matrix is written by a JSON serializer, never pasted into code). The matrix read
//! back by `changed run`, and what `changed` refuses, are [`matrix`]'s.

pub mod matrix;

use std::path::Path;
use std::process::Command;

/// What a test file's GPU marker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuMarker {
    pub gpus: u32,
    /// The value as written, when it is not one number (`2 if FEW_GPU else 4`): `gpus`
    /// is then the largest whole number in it, enough for every branch.
    pub expression: Option<String>,
}

/// The value of a top-level `MARKER = <value>` or `MARKER: int = <value>` line: a whole
/// number, or an expression whose largest whole number is taken.
pub fn gpus_marker(text: &str, marker: &str) -> Option<GpuMarker> {
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
        // `==` is a comparison, not an assignment.
        if value.starts_with('=') {
            continue;
        }
        let value = value.split('#').next().unwrap_or("").trim();
        if let Ok(n) = value.parse::<u32>() {
            return Some(GpuMarker {
                gpus: n,
                expression: None,
            });
        }
        // Whole numbers standing alone: a digit run inside a name (`GPU2`) is no count.
        let bytes = value.as_bytes();
        let mut largest: Option<u32> = None;
        let mut i = 0;
        while i < bytes.len() {
            if !bytes[i].is_ascii_digit() {
                i += 1;
                continue;
            }
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            let in_name = start > 0
                && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_')
                || i < bytes.len() && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_');
            if !in_name && let Ok(n) = value[start..i].parse::<u32>() {
                largest = largest.max(Some(n));
            }
        }
        if let Some(n) = largest {
            return Some(GpuMarker {
                gpus: n,
                expression: Some(value.to_string()),
            });
        }
    }
    None
}

use crate::exit::Failure;
use crate::git::{GitError, run as git};
use crate::manifest::{ChangedConfig, GroupKind, Manifest, PatternKind, Renames, Selector};

/// Why the changed files cannot be told.
#[derive(Debug, thiserror::Error)]
pub enum ChangedError {
    #[error(
        "{dir} (the manifest's folder) is not in a git checkout: run cibox in one, or point --manifest at the cibox.yaml of one"
    )]
    NotACheckout { dir: String },
    #[error("`{rev}` is not a revision in {dir}")]
    NotARevision { rev: String, dir: String },
    #[error("no merge base of {base} and {head}: {source}")]
    NoMergeBase {
        base: String,
        head: String,
        #[source]
        source: GitError,
    },
    #[error(transparent)]
    Git(#[from] GitError),
    /// git printed what it should not have.
    #[error("git {0}")]
    Unexpected(String),
}

impl crate::error::ErrorKind for ChangedError {
    /// Revisions and checkouts are the user's input.
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}

/// Says so when `dir` is not in a git checkout (git's own message names no cause).
pub fn checkout(dir: &Path) -> Result<(), ChangedError> {
    match git(dir, &["rev-parse", "--is-inside-work-tree"]) {
        Ok(out) if String::from_utf8_lossy(&out).trim() == "true" => Ok(()),
        _ => Err(ChangedError::NotACheckout {
            dir: dir.display().to_string(),
        }),
    }
}

/// A revision that starts with `-` is none: git would read it as an option
/// (`--base=--output=FILE` wrote FILE).
fn refuse_option(dir: &Path, rev: &str) -> Result<(), ChangedError> {
    if rev.starts_with('-') {
        return Err(ChangedError::NotARevision {
            rev: rev.to_string(),
            dir: dir.display().to_string(),
        });
    }
    Ok(())
}

/// Resolves a revision to a commit, or says it is not one.
pub fn commit(dir: &Path, rev: &str) -> Result<String, ChangedError> {
    refuse_option(dir, rev)?;
    let spec = format!("{rev}^{{commit}}");
    git(dir, &["rev-parse", "--verify", "--quiet", &spec])
        .map(|o| String::from_utf8_lossy(&o).trim().to_string())
        .map_err(|_| ChangedError::NotARevision {
            rev: rev.to_string(),
            dir: dir.display().to_string(),
        })
}

/// A changed path: a file at head with its blob there, or a path head no longer has (a
/// deleted file, a renamed file's old name).
#[derive(Debug, Clone)]
pub struct Changed {
    pub path: String,
    /// Its blob at head; `None` for a path gone at head.
    pub blob: Option<String>,
}

impl Changed {
    /// Whether head has the file (a test that can run).
    pub fn at_head(&self) -> bool {
        self.blob.is_some()
    }
}

/// The paths changed between the merge base of `base` and `head`, relative to `dir`:
/// files added, copied, modified or changed in type, files deleted, and each rename as
/// its new name, and with [`Renames::Both`] as its old name (gone at head) too.
pub fn changed_paths(
    dir: &Path,
    base: &str,
    head: &str,
    renames: Renames,
) -> Result<Vec<Changed>, ChangedError> {
    checkout(dir)?;
    refuse_option(dir, base)?;
    refuse_option(dir, head)?;
    // `base...head` diffs from their merge base, in one git process.
    let range = format!("{base}...{head}");
    let args = [
        "diff",
        "--relative",
        "--raw",
        "--no-abbrev",
        "-z",
        "-M",
        "--diff-filter=ACDMRT",
        &range,
        "--",
    ];
    let out = match git(dir, &args) {
        Ok(out) => out,
        Err(source) => {
            // Say which side is wrong, and how.
            commit(dir, base)?;
            commit(dir, head)?;
            return Err(ChangedError::NoMergeBase {
                base: base.to_string(),
                head: head.to_string(),
                source,
            });
        }
    };
    // -z raw output: ":MODE MODE SHA SHA STATUS" \0 PATH \0, and for renames and
    // copies ":… R100" \0 OLD \0 NEW \0.
    let fields: Vec<String> = out
        .split(|b| *b == 0)
        .filter(|f| !f.is_empty())
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    let mut changed = Vec::new();
    let mut i = 0;
    while i < fields.len() {
        let meta: Vec<&str> = fields[i].trim_start_matches(':').split(' ').collect();
        let (Some(blob), Some(status)) = (meta.get(3), meta.get(4)) else {
            return Err(ChangedError::Unexpected(format!(
                "diff: unexpected output {:?}",
                fields[i]
            )));
        };
        let two_paths = status.starts_with('R') || status.starts_with('C');
        // A rename's old name changed too (its file is gone); a copy's source did not.
        if status.starts_with('R')
            && renames == Renames::Both
            && let Some(old) = fields.get(i + 1)
        {
            changed.push(Changed {
                path: old.clone(),
                blob: None,
            });
        }
        if let Some(path) = fields.get(if two_paths { i + 2 } else { i + 1 }) {
            changed.push(Changed {
                path: path.clone(),
                blob: (!status.starts_with('D')).then(|| blob.to_string()),
            });
        }
        i += if two_paths { 3 } else { 2 };
    }
    Ok(changed)
}

/// The git blob ID of some bytes (SHA-1 object format).
fn blob_id(bytes: &[u8]) -> String {
    use sha1::{Digest, Sha1};
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    crate::util::hex(&h.finalize())
}

/// The texts of changed files at head. In CI the checkout usually is head: a file whose
/// bytes in the working tree hash to the blob is read from disk; the others come from
/// one `git cat-file --batch`.
pub fn texts(dir: &Path, files: &[&Changed]) -> Result<Vec<String>, ChangedError> {
    let mut out: Vec<Option<String>> = files
        .iter()
        .map(|c| {
            let blob = c.blob.as_deref()?;
            let bytes = std::fs::read(dir.join(&c.path)).ok()?;
            (blob.len() == 40 && blob_id(&bytes) == blob)
                .then(|| String::from_utf8_lossy(&bytes).into_owned())
        })
        .collect();
    let missing: Vec<usize> = (0..files.len()).filter(|&i| out[i].is_none()).collect();
    let ids: Vec<&str> = missing
        .iter()
        .map(|&i| files[i].blob.as_deref().unwrap_or_default())
        .collect();
    for (i, text) in missing.into_iter().zip(blobs(dir, &ids)?) {
        out[i] = Some(text);
    }
    Ok(out.into_iter().map(Option::unwrap_or_default).collect())
}

/// The texts of many blobs, through one `git cat-file --batch`: a diff of hundreds of
/// test files must not cost hundreds of processes.
pub fn blobs(dir: &Path, ids: &[&str]) -> Result<Vec<String>, ChangedError> {
    use std::io::{BufRead, BufReader, Read, Write};
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut child = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["cat-file", "--batch"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(GitError::Spawn)?;
    let mut stdin = child.stdin.take().expect("piped");
    let queries: String = ids.iter().map(|id| format!("{id}\n")).collect();
    // Write from a thread: git answers while we feed it, and both pipes are bounded.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(queries.as_bytes());
    });
    let mut reader = BufReader::new(child.stdout.take().expect("piped"));
    let mut texts = Vec::with_capacity(ids.len());
    let mut failure = None;
    for id in ids {
        let mut header = String::new();
        if let Err(e) = reader.read_line(&mut header) {
            failure = Some(format!("cat-file: {e}"));
            break;
        }
        let fields: Vec<&str> = header.split_whitespace().collect();
        let Some(size) = fields
            .get(2)
            .filter(|_| fields.len() == 3)
            .and_then(|s| s.parse::<usize>().ok())
        else {
            failure = Some(format!("cat-file: object {id}: {}", header.trim()));
            break;
        };
        let mut buf = vec![0u8; size + 1]; // the content and its trailing newline
        if let Err(e) = reader.read_exact(&mut buf) {
            failure = Some(format!("cat-file: {e}"));
            break;
        }
        buf.pop();
        texts.push(String::from_utf8_lossy(&buf).into_owned());
    }
    drop(reader);
    let _ = writer.join();
    let _ = child.kill();
    let _ = child.wait();
    match failure {
        Some(e) => Err(ChangedError::Unexpected(e)),
        None => Ok(texts),
    }
}

/// Tracked files under `dir`, relative to it.
pub fn tracked(dir: &Path) -> Result<Vec<String>, ChangedError> {
    checkout(dir)?;
    let out = git(dir, &["ls-files", "-z"])?;
    Ok(out
        .split(|b| *b == 0)
        .filter(|f| !f.is_empty())
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect())
}

/// What each change group found among `paths`: the unnamed group (`changed.patterns`),
/// then each named one, as (its name, what it found). `warn` hears about test files
/// whose GPU count is a guess, and about patterns that match no file in `head`'s tree
/// nor any changed path.
pub fn groups<'m>(
    m: &Manifest,
    cfg: &'m ChangedConfig,
    paths: &[Changed],
    head: &str,
    mut warn: impl FnMut(String),
) -> Result<Vec<(Option<&'m str>, Found)>, ChangedError> {
    let mut found = Vec::new();
    if cfg.unnamed() {
        let include = test_matrix(m, cfg, &cfg.selector, paths, &mut warn)?;
        found.push((None, Found::Tests(include)));
    }
    for (name, group) in &cfg.groups {
        let f = match group.kind {
            GroupKind::Tests => {
                Found::Tests(test_matrix(m, cfg, &group.selector, paths, &mut warn)?)
            }
            GroupKind::Files => Found::Files(matching(&group.selector, paths)),
        };
        found.push((Some(name.as_str()), f));
    }
    for line in matching_nothing(&m.dir, cfg, paths, head)? {
        warn(line);
    }
    Ok(found)
}

/// The named change groups a diff changed, as `changed` finds them (a files group with
/// a changed file, a tests group with a test to run): what a pipeline that follows the
/// diff selects its batches by (`batches.NAME.changes`).
pub fn changed_groups(
    m: &Manifest,
    cfg: &ChangedConfig,
    base: &str,
    head: &str,
    warn: impl FnMut(String),
) -> Result<Vec<String>, ChangedError> {
    let paths = changed_paths(&m.dir, base, head, cfg.renames)?;
    Ok(groups(m, cfg, &paths, head, warn)?
        .into_iter()
        .filter(|(_, f)| f.changed())
        .filter_map(|(g, _)| g.map(str::to_string))
        .collect())
}

/// The batches a diff selects, when some batch names change groups
/// (`batches.NAME.changes`): those whose groups changed and those that name none, in
/// manifest order, as the step output `selected_batches` (a JSON list: a GitHub
/// matrix) and the `--json` key of that name. The same rule as a pipeline's `selected`.
pub fn selected_batches(m: &Manifest, found: &[(Option<&str>, Found)]) -> Option<Vec<String>> {
    if m.batches.values().all(|b| b.changes.is_empty()) {
        return None;
    }
    let changed: Vec<&str> = found
        .iter()
        .filter(|(_, f)| f.changed())
        .filter_map(|(g, _)| *g)
        .collect();
    Some(
        m.batches
            .iter()
            .filter(|(_, b)| {
                b.changes.is_empty() || b.changes.iter().any(|g| changed.contains(&g.as_str()))
            })
            .map(|(n, _)| n.clone())
            .collect(),
    )
}

/// The step output that lists the selected batches.
pub const SELECTED_BATCHES: &str = "selected_batches";

/// What one change group found.
pub enum Found {
    /// The matrix of changed test files: `{test_file, num_gpus}` (and `batch`, for an
    /// entry of a test list).
    Tests(Vec<serde_json::Value>),
    /// The changed files.
    Files(Vec<String>),
}

impl Found {
    /// Its step outputs: `[PREFIX_]matrix` and `[PREFIX_]has_tests`, or `NAME` (`true`
    /// or `false`) and `NAME_files`. Serialised, never pasted: names with quotes,
    /// `$(…)` or newlines stay data.
    pub fn outputs(&self, group: Option<&str>) -> Vec<(String, String)> {
        match self {
            Found::Tests(include) => {
                let [matrix, has_tests] = GroupKind::Tests.outputs(group);
                vec![
                    (matrix, self.text()),
                    (has_tests, (!include.is_empty()).to_string()),
                ]
            }
            Found::Files(files) => {
                let [changed, list] = GroupKind::Files.outputs(group);
                vec![
                    (changed, (!files.is_empty()).to_string()),
                    (list, serde_json::to_string(files).expect("serialises")),
                ]
            }
        }
    }

    /// Whether the group changed: a file, or a test to run.
    pub fn changed(&self) -> bool {
        match self {
            Found::Tests(include) => !include.is_empty(),
            Found::Files(files) => !files.is_empty(),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        match self {
            Found::Tests(include) => {
                serde_json::json!({"include": include, "has_tests": !include.is_empty()})
            }
            Found::Files(files) => {
                serde_json::json!({"changed": !files.is_empty(), "files": files})
            }
        }
    }

    /// One line: the matrix, or the files as a JSON list.
    pub fn text(&self) -> String {
        match self {
            Found::Tests(include) => {
                serde_json::to_string(&serde_json::json!({ "include": include }))
                    .expect("serialises")
            }
            Found::Files(files) => serde_json::to_string(files).expect("serialises"),
        }
    }
}

/// The changed paths (gone at head or not) that a files group takes, each once.
fn matching(selector: &Selector, paths: &[Changed]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in paths.iter().filter(|c| selector.matches(&c.path)) {
        if !out.contains(&c.path) {
            out.push(c.path.clone());
        }
    }
    out
}

/// Whether one written pattern takes a path.
type PathTest = Box<dyn Fn(&str) -> bool>;

/// One warning line per pattern, path or exclusion of `changed` that matches no
/// changed path and no file of `head`'s tree: a typo, a folder since moved, or a glob
/// written in another tool's syntax would otherwise select nothing, silently. The tree
/// is listed only when some pattern matched no changed path.
pub fn matching_nothing(
    dir: &Path,
    cfg: &ChangedConfig,
    paths: &[Changed],
    head: &str,
) -> Result<Vec<String>, ChangedError> {
    let written = cfg.written();
    let matcher = |kind: PatternKind, p: &str| -> PathTest {
        match kind {
            PatternKind::Glob => match crate::manifest::compile_glob(p) {
                Ok(g) => {
                    let m = g.compile_matcher();
                    Box::new(move |path: &str| m.is_match(path))
                }
                Err(_) => Box::new(|_: &str| false),
            },
            PatternKind::Prefix => {
                let prefix = p.strip_suffix('/').unwrap_or(p).to_string();
                Box::new(move |path: &str| crate::manifest::under_prefix(&prefix, path))
            }
            // An exclusion too matches what it names: one that names nothing is a typo.
            PatternKind::GitHub => match crate::manifest::github_glob(p) {
                Ok((_, re)) => Box::new(move |path: &str| re.is_match(path)),
                Err(_) => Box::new(|_: &str| false),
            },
        }
    };
    let mut open: Vec<(usize, PathTest)> = written
        .iter()
        .enumerate()
        .map(|(i, (_, kind, p))| (i, matcher(*kind, p)))
        .filter(|(_, m)| !paths.iter().any(|c| m(&c.path)))
        .collect();
    if open.is_empty() {
        return Ok(Vec::new());
    }
    // By its commit: `head` is the user's text, never an option to git.
    let sha = commit(dir, head)?;
    let tree = git(dir, &["ls-tree", "-r", "-z", "--name-only", &sha])?;
    for f in tree.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let f = String::from_utf8_lossy(f);
        open.retain(|(_, m)| !m(&f));
        if open.is_empty() {
            break;
        }
    }
    Ok(open
        .into_iter()
        .map(|(i, _)| {
            let (at, _, p) = &written[i];
            format!(
                "{at}: `{}` matches no file in the tree of {} nor any changed path",
                crate::util::escape(p),
                crate::util::escape(head)
            )
        })
        .collect())
}

/// The matrix of the changed test files `patterns` match: a file a test list names is
/// each of its entries, with the entry's GPUs and batch; any other gets the GPU count
/// its marker says.
fn test_matrix(
    m: &Manifest,
    cfg: &ChangedConfig,
    selector: &Selector,
    paths: &[Changed],
    warn: &mut dyn FnMut(String),
) -> Result<Vec<serde_json::Value>, ChangedError> {
    // A test gone at head (deleted, or renamed away) has nothing to run.
    let tests: Vec<&Changed> = paths
        .iter()
        .filter(|c| c.at_head() && selector.matches(&c.path))
        .collect();
    let texts = texts(&m.dir, &tests)?;
    let mut include = Vec::new();
    for (c, text) in tests.iter().zip(&texts) {
        let path = &c.path;
        let entries: Vec<serde_json::Value> = m
            .batches
            .iter()
            .filter(|(_, b)| b.family.is_some() && b.tests.first() == Some(path))
            .map(|(name, b)| entry_row(name, b))
            .collect();
        if !entries.is_empty() {
            include.extend(entries);
            continue;
        }
        let gpus = match gpus_marker(text, &cfg.gpus_marker) {
            Some(GpuMarker {
                gpus,
                expression: Some(expr),
            }) => {
                warn(format!(
                    "{path}: `{} = {expr}` is not one number; taking the largest in it, {gpus}",
                    cfg.gpus_marker
                ));
                gpus
            }
            Some(m) => m.gpus,
            None => {
                warn(format!(
                    "{path}: no top-level `{} = <int>`; assuming {}",
                    cfg.gpus_marker,
                    crate::util::count(cfg.default_gpus, "GPU")
                ));
                cfg.default_gpus
            }
        };
        include.push(serde_json::json!({"test_file": path, "num_gpus": gpus}));
    }
    Ok(include)
}

/// The matrix row of a test list's entry: its file, GPUs and batch, and what its batch
/// runs with (its arguments, image and GPU model), for a workflow to show or route on.
/// `changed run` runs the manifest's batch by name: its arguments, image and container
/// are the manifest's, whatever else a row says.
pub fn entry_row(name: &str, b: &crate::manifest::Batch) -> serde_json::Value {
    serde_json::json!({
        "test_file": b.tests.first(),
        "num_gpus": b.gpus,
        "batch": name,
        "args": b.env.get("CIBOX_TEST_ARGS"),
        "image": b.image,
        "gpu_model": b.gpu_model.as_deref().filter(|_| b.gpus > 0),
    })
}

/// Whether a test file named by data from elsewhere (a matrix, a run record) is one
/// `changed` itself would list: written as git writes it, matched by `patterns`.
pub fn check_test_file(cfg: &ChangedConfig, path: &str) -> Result<(), NotATestFile> {
    if crate::util::is_plain_relative(path) && cfg.takes_test_file(path) {
        return Ok(());
    }
    Err(NotATestFile {
        path: path.to_string(),
        patterns: cfg.test_patterns().cloned().collect(),
    })
}

/// A test file named by data from elsewhere that `changed` itself would not list.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{}` is not a test file `changed.patterns` matches ({})",
    crate::util::escape(.path),
    .patterns.join(", ")
)]
pub struct NotATestFile {
    pub path: String,
    /// `changed.patterns`.
    pub patterns: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers() {
        let n = |text: &str| gpus_marker(text, "NUM_GPUS").map(|m| m.gpus);
        assert_eq!(n("import x\nNUM_GPUS = 4\n"), Some(4));
        assert_eq!(n("NUM_GPUS: int = 2  # two\n"), Some(2));
        assert_eq!(n("NUM_GPUS=8"), Some(8));
        assert_eq!(n("    NUM_GPUS = 4\n"), None);
        assert_eq!(n("NUM_GPUS_X = 4\nNUM_GPUS = five\n"), None);
        assert_eq!(n("NUM_GPUS == 4\n"), None);
        // A conditional: the largest number, and what was found.
        let m = gpus_marker("NUM_GPUS = 2 if FEW_GPU else 4\n", "NUM_GPUS").unwrap();
        assert_eq!(m.gpus, 4);
        assert_eq!(m.expression.as_deref(), Some("2 if FEW_GPU else 4"));
        assert_eq!(n("NUM_GPUS = int(os.environ.get('N', 8))\n"), Some(8));
        assert_eq!(n("NUM_GPUS = 1 if GPU2 else 2\n"), Some(2));
    }
}
