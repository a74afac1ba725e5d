//! `workflow lint`: refusing workflows that let outsiders' code or text onto self-hosted
//! runners (and other places holding the base repository's permissions).
//!
//! Workflows are read with `github-actions-models` (zizmor's typed models of GitHub
//! Actions) and conditions with `github-actions-expressions`; positions come from our own
//! YAML tree ([`crate::yaml`]), which keeps a line and column for every node.
//!
//! - [`guard`]: which events outsiders can cause, and whether an `if:` keeps them out;
//! - [`audit`]: what a job may not do when outsiders can reach it, one rule per file,
//!   run in the order of [`audit::registry`];
//! - [`facts`]: what the rules read about a workflow and its jobs (steps, runners,
//!   triggers, taint, the pull request's head), computed once;
//! - [`call`]: linting the reusable workflows a job calls, as the caller reaches them;
//! - [`expr`]: expressions inside text, and context paths.

mod audit;
mod call;
pub mod expr;
mod facts;
pub mod guard;
pub mod sarif;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use github_actions_models::workflow::Workflow;

use crate::yaml::{self, Mark, Node};

/// The largest workflow file read; GitHub's own limit is far lower, and a bigger file is
/// more likely a mistake (or a trap) than a workflow.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Where findings about a whole file point.
const FILE_START: Mark = Mark { line: 1, col: 1 };

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// What a finding is about; the name is printed after each finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// The file is not a workflow we can read.
    Unparsable,
    /// A self-hosted job that an outsider's event starts without a guard.
    UntrustedSelfHosted,
    /// The pull request's code checked out where the base repository's token and secrets
    /// are.
    PrHeadCheckout,
    /// Text an outsider controls inlined into a script, or run as code.
    ScriptInjection,
    /// Text an outsider controls written to `$GITHUB_ENV` or `$GITHUB_PATH`.
    EnvFileInjection,
    /// Write permissions on a job an outsider can drive.
    WritePermissions,
    /// Secrets in a `pull_request_target` job an outsider can start.
    SecretsExposed,
    /// An artifact of a pull request's run trusted on a self-hosted runner.
    UntrustedArtifact,
    /// A self-hosted job without `timeout-minutes`.
    NoTimeout,
    /// A reusable workflow lint cannot read (another repository), called where
    /// outsiders can reach it.
    UncheckedCall,
    /// A job's container or service image, or a `docker://` step, not pinned by digest.
    UnpinnedImage,
}

impl Rule {
    /// Every rule, in the order SARIF lists them.
    pub const ALL: [Rule; 11] = [
        Rule::Unparsable,
        Rule::UntrustedSelfHosted,
        Rule::PrHeadCheckout,
        Rule::ScriptInjection,
        Rule::EnvFileInjection,
        Rule::WritePermissions,
        Rule::SecretsExposed,
        Rule::UntrustedArtifact,
        Rule::NoTimeout,
        Rule::UncheckedCall,
        Rule::UnpinnedImage,
    ];

    /// One line on what the rule finds.
    pub fn summary(self) -> &'static str {
        match self {
            Rule::Unparsable => "Not a workflow lint can read",
            Rule::UntrustedSelfHosted => "A self-hosted runner that outsiders' events reach",
            Rule::PrHeadCheckout => {
                "The pull request's code checked out where the base repository's token and secrets are"
            }
            Rule::ScriptInjection => {
                "Text an outsider controls pasted into a script, or run as code"
            }
            Rule::EnvFileInjection => {
                "Text an outsider controls written to $GITHUB_ENV or $GITHUB_PATH"
            }
            Rule::WritePermissions => "Write permissions on a job that outsiders drive",
            Rule::SecretsExposed => "Secrets in a pull_request_target job that any fork can start",
            Rule::UntrustedArtifact => {
                "A fork's artifact downloaded where running it costs something"
            }
            Rule::NoTimeout => "A self-hosted job without timeout-minutes",
            Rule::UncheckedCall => "A reusable workflow or local action that lint cannot check",
            Rule::UnpinnedImage => "A container image not pinned by digest",
        }
    }

    /// What the rule finds, why it matters and what to do, for SARIF's rule help.
    pub fn description(self) -> &'static str {
        match self {
            Rule::Unparsable => {
                "The file is not a workflow lint can read: not a plain file, a symbolic link found in a folder, larger than 1 MiB, not UTF-8, not YAML, or not a GitHub Actions workflow. Nothing in it was checked."
            }
            Rule::UntrustedSelfHosted => {
                "A job on a self-hosted runner (any label that is not a GitHub-hosted one, a runner group, an expression) that an event outsiders can cause (a fork's pull request, a comment, an issue, a run of another workflow, a star, a status) starts without a guard. Guard it with the same-repository check, the commenter's association, or for outsiders' pull requests the approved-commit pattern (pull_request_target on labeled only, a label check, a checkout of github.event.pull_request.head.sha)."
            }
            Rule::PrHeadCheckout => {
                "A step fetches or checks out the pull request's code (its head or merge ref, its sha, its branch, refs/pull/N/..., gh pr checkout) under a trigger that runs with the base repository's token and secrets, without a guard; or after an approval that does not vouch for what it fetches: a member's comment names no commit, and a label approves the event's head sha, not a branch that moves."
            }
            Rule::ScriptInjection => {
                "An expression whose value an outsider writes (a title, a body, a branch name, a commit message, a step or job output, a computed matrix value, an input filled from those, an env variable set from them or through $GITHUB_ENV) is pasted into a run: script or github-script, where it becomes code; or such text is run from a file or a variable. Pass values through env: and quote them as data."
            }
            Rule::EnvFileInjection => {
                "A step writes text an outsider controls to $GITHUB_ENV (a newline in it sets any variable for every later step, and BASH_ENV, LD_PRELOAD or NODE_OPTIONS run code) or to $GITHUB_PATH (later commands come from a folder it names). Give each step that needs the value its own env: instead."
            }
            Rule::WritePermissions => {
                "A job that outsiders drive under a privileged trigger (a self-hosted one, or one that runs the pull request's code) has a token with write permissions. Give it contents: read and move writes to a job that runs no outside code."
            }
            Rule::SecretsExposed => {
                "A pull_request_target job that any fork's pull request starts without a guard reads secrets (other than GITHUB_TOKEN), or passes them to a reusable workflow."
            }
            Rule::UntrustedArtifact => {
                "Under workflow_run, a step downloads what the triggering run uploaded (a fork's pull request made that run) on a self-hosted runner, or into a job holding secrets or a token that writes code, workflows or packages. Handle such files as data, in a job without secrets or write permissions."
            }
            Rule::NoTimeout => {
                "A self-hosted job without timeout-minutes: a hung job holds the runner and its GPUs for GitHub's default of six hours."
            }
            Rule::UncheckedCall => {
                "A reusable workflow in another repository (or missing, broken, or deeper than GitHub allows), or a local action whose action.yml lint cannot read, used by a job outsiders can start. Lint it where it lives, or guard the job."
            }
            Rule::UnpinnedImage => {
                "A job's container or service image, or a docker:// step, named by tag: whoever controls the tag controls what runs. Name it by digest (IMAGE@sha256:...)."
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Rule::Unparsable => "unparsable",
            Rule::UntrustedSelfHosted => "untrusted-self-hosted",
            Rule::PrHeadCheckout => "pr-head-checkout",
            Rule::ScriptInjection => "script-injection",
            Rule::EnvFileInjection => "env-file-injection",
            Rule::WritePermissions => "write-permissions",
            Rule::SecretsExposed => "secrets-exposed",
            Rule::UntrustedArtifact => "untrusted-artifact",
            Rule::NoTimeout => "no-timeout",
            Rule::UncheckedCall => "unchecked-call",
            Rule::UnpinnedImage => "unpinned-image",
        }
    }

    pub fn severity(self) -> Severity {
        match self {
            Rule::NoTimeout | Rule::UncheckedCall | Rule::UnpinnedImage => Severity::Warning,
            _ => Severity::Error,
        }
    }
}

/// A step as findings name it: its number in the job (from 1) and what it is called.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StepLabel {
    pub number: usize,
    pub name: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub rule: Rule,
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub job: Option<String>,
    pub step: Option<StepLabel>,
    pub message: String,
    /// For a finding in a called workflow: the calling jobs (`FILE job JOB`, a chain
    /// joined by ` → `), at most [`MAX_CALLERS_SHOWN`] of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub called_by: Vec<String>,
    /// How many calling jobs there are in all.
    #[serde(skip_serializing_if = "is_zero")]
    pub called_by_count: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Callers listed per finding; the rest are counted.
pub const MAX_CALLERS_SHOWN: usize = 3;

/// Findings with the same place, rule and message, merged: their callers joined. A
/// workflow called from many jobs gives one finding per problem, not one per call.
fn merge(findings: Vec<Finding>) -> Vec<Finding> {
    let mut out: Vec<Finding> = Vec::new();
    let mut index: HashMap<(String, usize, usize, Rule, String), usize> = HashMap::new();
    for f in findings {
        let key = (f.file.clone(), f.line, f.col, f.rule, f.message.clone());
        match index.get(&key) {
            Some(&i) => {
                let into = &mut out[i];
                into.called_by_count += f.called_by_count;
                for c in f.called_by {
                    if into.called_by.len() < MAX_CALLERS_SHOWN && !into.called_by.contains(&c) {
                        into.called_by.push(c);
                    }
                }
            }
            None => {
                index.insert(key, out.len());
                out.push(f);
            }
        }
    }
    out
}

impl Finding {
    fn unparsable(file: &str, mark: Mark, message: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Error,
            rule: Rule::Unparsable,
            file: file.to_string(),
            line: mark.line,
            col: mark.col,
            job: None,
            step: None,
            message: expr::one_line(&message.into()),
            called_by: Vec::new(),
            called_by_count: 0,
        }
    }
}

impl Finding {
    /// What was found, without where or which rule: `job JOB, step N (NAME): MESSAGE
    /// (called by …)`.
    pub fn what(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        if let Some(job) = &self.job {
            let _ = write!(out, "job {job}");
            if let Some(step) = &self.step {
                let _ = write!(out, ", step {} ({})", step.number, step.name);
            }
            out.push_str(": ");
        }
        out.push_str(&self.message);
        if let Some(first) = self.called_by.first() {
            let _ = write!(out, " (called by {first}");
            if self.called_by_count > 1 {
                let _ = write!(out, ", and {} more", self.called_by_count - 1);
            }
            out.push(')');
        }
        out
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(
            f,
            "{severity}: {}:{}:{}: {} [{}]",
            self.file,
            self.line,
            self.col,
            self.what(),
            self.rule.name()
        )
    }
}

/// Positions in one workflow's source.
pub(crate) struct Source<'a> {
    root: &'a Node,
    text: &'a str,
}

impl Source<'_> {
    /// The position of the node at `path` (or the closest one above it).
    fn at<S: AsRef<str>>(&self, path: &[S]) -> Mark {
        self.root.locate(path).mark
    }

    /// The position of a map key (a job's id), else of its value.
    fn key_at(&self, parent: &[&str], key: &str) -> Mark {
        let parent_node = self.root.locate(parent);
        parent_node
            .key(key)
            .map(|k| k.mark)
            .unwrap_or(parent_node.mark)
    }

    /// Where `needle` first appears at or after the node at `path` (a `${{ }}` inside a
    /// block script is lines below the `run:` key).
    fn text_at<S: AsRef<str>>(&self, path: &[S], needle: &str) -> Mark {
        let start = self.at(path);
        for (i, line) in self
            .text
            .lines()
            .enumerate()
            .skip(start.line.saturating_sub(1))
        {
            if let Some(col) = line.find(needle) {
                return Mark {
                    line: i + 1,
                    col: line[..col].chars().count() + 1,
                };
            }
        }
        start
    }
}

/// Reads a file that a `uses:` names, by its path from the repository's root: a workflow
/// a job calls (`./.github/workflows/gpu.yml`), a local action's
/// (`./.github/actions/setup/action.yml`). Its file name for findings and its text, or
/// `None` when it is not at hand.
pub type Resolver<'r> = &'r dyn Fn(&str) -> Option<(String, String)>;

/// Who reaches a workflow: its own triggers, or those of the job that calls it.
pub(crate) struct Scope<'r> {
    file: String,
    /// `None`: the workflow's own `on:`; else the untrusted triggers of the caller.
    triggers: Option<Vec<guard::Trigger>>,
    /// What the caller's triggers say beyond their names; `None` with `triggers`.
    reach: guard::Reach,
    /// Of those, the ones the calling job (or a job it needs) already keeps out.
    guarded: Vec<guard::Trigger>,
    /// And the ones it lets in only when a trusted person asked.
    approved: Vec<guard::Trigger>,
    /// The inputs the caller fills with untrusted values (lower-case name → why).
    tainted_inputs: BTreeMap<String, String>,
    /// The inputs the caller fills with the pull request's head (a ref, a sha).
    head_inputs: BTreeMap<String, facts::head::HeadRef>,
    /// Whether the workflow has secrets: its own, or ones its caller passes.
    secrets_passed: bool,
    /// The files of the calls that led here (a workflow calling itself is refused by
    /// GitHub; we just stop).
    chain: Vec<String>,
    resolve: Resolver<'r>,
    /// Called workflows already linted, by file and by what reaches them: each is
    /// linted once however many jobs call it.
    cache: &'r RefCell<HashMap<String, Vec<Finding>>>,
    /// The rules to run: the registry's, or (in a rule's own tests) that rule alone, in
    /// the called workflows too.
    audits: &'r [&'r dyn audit::Audit],
}

/// GitHub nests reusable workflows at most ten deep (the caller and nine below).
const MAX_CALL_DEPTH: usize = 10;

/// Parses a workflow, or says why it is not one.
fn parse(file: &str, text: &str) -> Result<(Node, Workflow), Box<Finding>> {
    let root = match yaml::parse(text) {
        Ok(Some(root)) => root,
        Ok(None) => {
            return Err(Box::new(Finding::unparsable(
                file,
                FILE_START,
                "empty file",
            )));
        }
        Err(e) => {
            return Err(Box::new(Finding::unparsable(
                file,
                e.mark,
                format!("not YAML: {}", e.message),
            )));
        }
    };
    let json = root.to_json();
    match serde_path_to_error::deserialize(&json) {
        Ok(w) => Ok((root, w)),
        Err(e) => {
            let (path, message) = explain(&json, e);
            let mark = root.locate(&path).mark;
            let at = if path.is_empty() {
                String::new()
            } else {
                format!(" at `{}`", path.join("."))
            };
            Err(Box::new(Finding::unparsable(
                file,
                mark,
                format!("not a GitHub Actions workflow{at}: {message}"),
            )))
        }
    }
}

/// Lints one workflow file's text. A file that cannot be read as a workflow gives one
/// `unparsable` finding. Workflows it calls are read through `resolve`, and linted as
/// reached by the calling job's triggers.
pub fn lint_source(file: &str, text: &str, resolve: Resolver<'_>) -> Vec<Finding> {
    let cache = RefCell::new(HashMap::new());
    let scope = Scope {
        file: file.to_string(),
        triggers: None,
        reach: guard::Reach::default(),
        guarded: Vec::new(),
        approved: Vec::new(),
        tainted_inputs: BTreeMap::new(),
        head_inputs: BTreeMap::new(),
        secrets_passed: true,
        chain: vec![file.to_string()],
        resolve,
        cache: &cache,
        audits: audit::registry::AUDITS,
    };
    lint_in(&scope, text)
}

fn lint_in(scope: &Scope<'_>, text: &str) -> Vec<Finding> {
    let (root, workflow) = match parse(&scope.file, text) {
        Ok(parsed) => parsed,
        Err(finding) => return vec![*finding],
    };
    let source = Source { root: &root, text };
    merge(audit::check(scope, &workflow, &source))
}

fn segments(path: &serde_path_to_error::Path) -> Vec<String> {
    path.iter()
        .filter_map(|seg| match seg {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
            _ => None,
        })
        .collect()
}

/// The path and message of a model error. A job or a step is one of several shapes
/// (serde's "untagged" enums), whose error only says that no shape matched: parse it
/// again as the shape its keys ask for, to name the field that is wrong.
fn explain(
    json: &serde_json::Value,
    e: serde_path_to_error::Error<serde_json::Error>,
) -> (Vec<String>, String) {
    use github_actions_models::workflow::job::{
        NormalJob, ReusableWorkflowCallJob, RunStep, UsesStep,
    };
    let mut path = segments(e.path());
    let mut message = e.into_inner().to_string();
    // A step inside a job: refine the job, then the step.
    for _ in 0..2 {
        let Some(node) = path.iter().try_fold(json, |v, seg| {
            v.get(seg)
                .or_else(|| seg.parse::<usize>().ok().and_then(|i| v.get(i)))
        }) else {
            break;
        };
        let has = |k: &str| node.get(k).is_some();
        let inner = match path.as_slice() {
            [jobs, _] if jobs == "jobs" && has("uses") => {
                serde_path_to_error::deserialize::<_, ReusableWorkflowCallJob>(node).err()
            }
            [jobs, _] if jobs == "jobs" => {
                serde_path_to_error::deserialize::<_, NormalJob>(node).err()
            }
            [.., steps, _] if steps == "steps" && has("run") => {
                serde_path_to_error::deserialize::<_, RunStep>(node).err()
            }
            [.., steps, _] if steps == "steps" && has("uses") => {
                serde_path_to_error::deserialize::<_, UsesStep>(node).err()
            }
            _ => None,
        };
        let Some(inner) = inner else { break };
        path.extend(segments(inner.path()));
        message = inner.into_inner().to_string();
    }
    if message.starts_with("data did not match any variant") {
        message = "not a value this key takes".to_string();
    }
    // serde quotes the offending value; it may be anything (a linked file's secrets).
    (path, elide_quoted(&message))
}

/// A message with its double-quoted values replaced by `"…"`.
fn elide_quoted(message: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    while let Some(start) = rest.find('"') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        match end {
            Some(i) => {
                out.push_str("\"…\"");
                rest = &after[i + 1..];
            }
            None => {
                out.push_str("\"…");
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
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
