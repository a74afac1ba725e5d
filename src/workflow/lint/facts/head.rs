//! The pull request's head (its code): where text names it, and which steps fetch or
//! check it out. The checkout is a fact, not only a finding: a job that runs the pull
//! request's code must not also hold write permissions.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use github_actions_models::common::Env;
use github_actions_models::common::expr::LoE;
use github_actions_models::workflow::Workflow;
use github_actions_models::workflow::job::NormalJob;
use regex::Regex;

use super::env::{env_value, env_value_ci};
use super::job::WorkflowFacts;
use super::steps::{StepBody, StepView, is_action};
use crate::workflow::lint::expr;
use crate::workflow::lint::guard::{Condition, Trigger};

/// Contexts that name the pull request's head (its code).
const PR_HEAD: &[&str] = &[
    "github.head_ref",
    "github.event.pull_request.head",
    "github.event.pull_request.merge_commit_sha",
    "github.event.workflow_run.head_sha",
    "github.event.workflow_run.head_commit",
    // `synchronize`'s new head.
    "github.event.after",
    // A status or check reported on a fork's commit.
    "github.event.sha",
    "github.event.check_suite.head_sha",
    "github.event.check_suite.head_branch",
    "github.event.check_run.head_sha",
    "github.event.check_run.check_suite.head_sha",
    "github.event.workflow_run.head_branch",
    "github.event.workflow_run.head_repository",
    "github.event.workflow_run.pull_requests",
];

/// A script line that fetches or checks out a pull request's head, or applies its
/// changes, without naming it through a context: `gh pr checkout 12`, `git fetch origin
/// pull/12/head`, `refs/pull/12/merge`, `gh pr diff 12 | git apply`, a pull request's
/// `.patch` or `.diff` (`…/pull/12.patch`).
static PR_REF_IN_SCRIPT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"\b(gh|hub)\s+pr\s+(checkout|co|diff)\b|\bhub\s+checkout\b",
        r"|(^|[\s:/'\x22`])(refs/)?pull/(\$\{\{[^}]*\}\}|[^\s/]+)/(head|merge)\b",
        r"|/pulls?/(\$\{\{[^}]*\}\}|\$\{?\w+\}?|\d+)\.(patch|diff)\b",
    ))
    .expect("valid regex")
});
/// Commands that fetch code: a head context or variable on such a line is a checkout.
static FETCH_COMMAND: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b(git|gh|hub|curl|wget)\s+").expect("valid regex"));
pub(crate) static SHELL_VAR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)").expect("valid regex"));

/// The pull request's head, named in text: how, and whether it is the commit a
/// maintainer's label approved (`github.event.pull_request.head.sha`, a sha in the event)
/// rather than whatever the head is when the step runs (a branch, `refs/pull/N/…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeadRef {
    pub what: String,
    pub pinned: bool,
}

impl HeadRef {
    fn new(what: String, pinned: bool) -> HeadRef {
        HeadRef { what, pinned }
    }
}

/// The sha of the pull request's head in the event: fixed when the event happened.
const PINNED_HEAD: &str = "github.event.pull_request.head.sha";

/// Contexts that hold the pull request's number: a ref built from one is one of the
/// pull request's refs (`refs/pull/N/merge`), however the text builds it.
const PR_NUMBER: &[&str] = &[
    "github.event.number",
    "github.event.pull_request.number",
    "github.event.issue.number",
];

/// `pull/N/head` or `pull/N/merge` in the shape of an expression (see [`expr::shape`]).
static PR_REF_SHAPE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(^|[^A-Za-z0-9_])pull/[^/]+/(head|merge)\b").expect("valid regex")
});

/// The inputs of a reusable workflow or composite action that its caller fills with the
/// pull request's head, from the (name, value) pairs it passes.
pub(crate) fn head_inputs(
    given: &[(String, String)],
    inputs: &BTreeMap<String, HeadRef>,
) -> BTreeMap<String, HeadRef> {
    given
        .iter()
        .filter_map(|(k, v)| names_pr_head(v, &[], inputs, false).map(|h| (k.to_lowercase(), h)))
        .collect()
}

/// Whether text names the pull request's head: a `refs/pull/…` ref (written out or
/// built by `format()`), or an expression reading the head's ref, sha or repository,
/// directly, through `env.X`, or through an input the caller fills with one; with
/// `numbers` (a checkout's `ref:`), also one reading the pull request's number. Pinned
/// only when every mention is the event's head sha.
fn names_pr_head(
    text: &str,
    envs: &[&LoE<Env>],
    inputs: &BTreeMap<String, HeadRef>,
    numbers: bool,
) -> Option<HeadRef> {
    let mut found: Option<HeadRef> = None;
    let mut pinned = true;
    let mut note = |h: HeadRef| {
        pinned &= h.pinned;
        found.get_or_insert(h);
    };
    if text.contains("refs/pull/") {
        note(HeadRef::new("`refs/pull/…`".into(), false));
    }
    for e in expr::embedded(text) {
        let Ok(parsed) = expr::parse(e.body) else {
            continue;
        };
        if PR_REF_SHAPE.is_match(&expr::shape(&parsed)) {
            note(HeadRef::new(
                format!("`{}`, a pull request's ref", expr::one_line(e.raw)),
                false,
            ));
        }
        for p in expr::all_paths(&parsed) {
            if PR_HEAD.iter().any(|h| expr::under(&p, h)) {
                note(HeadRef::new(format!("`{p}`"), p == PINNED_HEAD));
            } else if numbers && PR_NUMBER.contains(&p.as_str()) {
                note(HeadRef::new(
                    format!(
                        "`{p}`, the pull request's number (a ref made from it is the pull request's)"
                    ),
                    false,
                ));
            } else if let Some(name) = p.strip_prefix("env.")
                && let Some(v) = envs.iter().find_map(|env| env_value_ci(env, name))
                && let Some(h) = names_pr_head(&v.to_string(), &[], inputs, numbers)
            {
                note(HeadRef::new(
                    format!("`{p}`, set from {}", h.what),
                    h.pinned,
                ));
            } else if let Some(name) = p.strip_prefix("inputs.")
                && let Some(h) = inputs.get(name.split('.').next().unwrap_or(name))
            {
                note(HeadRef::new(
                    format!("`{p}`, which the caller sets from {}", h.what),
                    h.pinned,
                ));
            }
        }
    }
    found.map(|h| HeadRef { pinned, ..h })
}

/// A ref an earlier step or job computed: under `issue_comment` and the like, that is
/// how the pull request's head is usually found (`gh pr view`), and lint cannot tell.
fn computed_ref(text: &str) -> Option<String> {
    for e in expr::embedded(text) {
        let Ok(parsed) = expr::parse(e.body) else {
            continue;
        };
        for p in expr::all_paths(&parsed) {
            if expr::under(&p, "steps.*.outputs") || expr::under(&p, "needs.*.outputs") {
                return Some(format!(
                    "`{p}`, computed by an earlier step (lint cannot tell it is not the pull request's head)"
                ));
            }
        }
    }
    None
}

/// The script's lines with `\`-continued lines joined, as the shell reads them.
pub(crate) fn logical_lines(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in script.lines() {
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// How a step checks out or fetches the pull request's code, if it does.
pub(crate) fn checks_out_pr_head(
    step: &StepView<'_>,
    job: &NormalJob,
    workflow: &Workflow,
) -> Option<HeadRef> {
    let inputs = &step.inputs.head;
    let envs: Vec<&LoE<Env>> = step
        .envs()
        .iter()
        .copied()
        .chain([&job.env, &workflow.env])
        .collect();
    match step.body {
        StepBody::Uses(s) if is_action(s.uses, "actions/checkout") => {
            let input = |name: &str| env_value(s.with, name).map(|v| v.to_string());
            // A sha pins the code whichever repository it is fetched from; a repository
            // alone is its default branch, which its owner moves at will.
            if let Some(v) = input("ref") {
                if let Some(h) = names_pr_head(&v, &envs, inputs, true) {
                    return Some(HeadRef::new(
                        format!("actions/checkout with `ref:` from {}", h.what),
                        h.pinned,
                    ));
                }
                if let Some(what) = computed_ref(&v) {
                    return Some(HeadRef::new(
                        format!("actions/checkout with `ref:` from {what}"),
                        false,
                    ));
                }
            }
            let repo = input("repository")?;
            let h = names_pr_head(&repo, &envs, inputs, false)?;
            Some(HeadRef::new(
                format!("actions/checkout with `repository:` from {}", h.what),
                false,
            ))
        }
        // The JavaScript of github-script runs commands too (`exec.exec('git', …)`).
        StepBody::Uses(s) if is_action(s.uses, "actions/github-script") => {
            let script = env_value(s.with, "script")?.to_string();
            script_head(&script, &envs, inputs)
        }
        StepBody::Uses(_) => None,
        StepBody::Run(s) => script_head(s.run, &envs, inputs),
    }
}

/// How a script fetches or checks out the pull request's code, if it does: pinned only
/// when every line that does names the event's head sha.
fn script_head(
    script: &str,
    envs: &[&LoE<Env>],
    inputs: &BTreeMap<String, HeadRef>,
) -> Option<HeadRef> {
    let mut found: Option<HeadRef> = None;
    let mut pinned = true;
    for line in logical_lines(script) {
        if let Some(h) = script_line_head(&line, envs, inputs) {
            pinned &= h.pinned;
            found.get_or_insert(h);
        }
    }
    found.map(|h| HeadRef { pinned, ..h })
}

/// How one script line fetches or checks out the pull request's code, if it does.
fn script_line_head(
    line: &str,
    envs: &[&LoE<Env>],
    inputs: &BTreeMap<String, HeadRef>,
) -> Option<HeadRef> {
    if let Some(m) = PR_REF_IN_SCRIPT.find(line) {
        return Some(HeadRef::new(
            format!("`{}` in the script", expr::one_line(m.as_str())),
            false,
        ));
    }
    if !FETCH_COMMAND.is_match(line) {
        return None;
    }
    if let Some(h) = names_pr_head(line, envs, inputs, false) {
        return Some(HeadRef::new(
            format!("a fetch or checkout on {}", h.what),
            h.pinned,
        ));
    }
    if line.contains("GITHUB_EVENT_PATH") {
        return Some(HeadRef::new(
            "a fetch or checkout on a value read from the event payload (`$GITHUB_EVENT_PATH`)"
                .into(),
            false,
        ));
    }
    // `git checkout "$HEAD_SHA"` with `HEAD_SHA: ${{ …head.sha }}` in env.
    for cap in SHELL_VAR.captures_iter(line) {
        let name = &cap[1];
        let value = envs.iter().find_map(|env| env_value(env, name));
        if let Some(v) = value
            && let Some(h) = names_pr_head(&v.to_string(), &[], inputs, false)
        {
            return Some(HeadRef::new(
                format!("a fetch or checkout on `${name}`, set from {}", h.what),
                h.pinned,
            ));
        }
    }
    None
}

/// A step that checks out the pull request's head where that is not safe: under a
/// privileged trigger with no guard, or after an approval (a member's comment, a
/// maintainer's label) that did not vouch for what the step fetches.
pub(crate) struct HeadCheckout {
    /// Its index in the job's steps.
    pub step: usize,
    pub how: String,
    /// The triggers under which it does so.
    pub triggers: Vec<Trigger>,
    /// Whether those triggers are approved ones: the step fetches a head that can have
    /// moved since the approval (time of check to time of use).
    pub approved: bool,
}

/// The steps of a job that check out the pull request's head unsafely (see
/// [`HeadCheckout`]): `open` are the job's privileged triggers without a guard,
/// `approved` those it runs only when a trusted person asked.
pub(crate) fn head_checkouts(
    wf: &WorkflowFacts<'_>,
    job: &NormalJob,
    steps: &[StepView<'_>],
    open: &[Trigger],
    approved: &[Trigger],
) -> Vec<HeadCheckout> {
    let reachable: Vec<(Trigger, Condition)> = open
        .iter()
        .filter(|t| t.privileged())
        .map(|t| (*t, Condition::Open))
        .chain(
            approved
                .iter()
                .filter(|t| t.privileged())
                .map(|t| (*t, Condition::Approved)),
        )
        .collect();
    if reachable.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let Some(head) = checks_out_pr_head(step, job, wf.workflow) else {
            continue;
        };
        let (mut unguarded, mut toctou) = (Vec::new(), Vec::new());
        for (t, at_job) in &reachable {
            match (*at_job).max(step.condition(*t, wf.reach)) {
                Condition::Open => unguarded.push(*t),
                // A label approved the event's head sha: fetching that one is safe.
                Condition::Approved if !(*t == Trigger::PullRequestTarget && head.pinned) => {
                    toctou.push(*t)
                }
                _ => {}
            }
        }
        let (triggers, approved) = if unguarded.is_empty() {
            (toctou, true)
        } else {
            (unguarded, false)
        };
        if !triggers.is_empty() {
            out.push(HeadCheckout {
                step: i,
                how: head.what,
                triggers,
                approved,
            });
        }
    }
    out
}
