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

use super::env::{env_text, env_value, env_value_ci};
use super::steps::{StepBody, StepView, is_action};
use crate::workflow::lint::expr;

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

/// A script line that fetches or checks out a pull request's head without naming it
/// through a context: `gh pr checkout 12`, `git fetch origin pull/12/head`,
/// `refs/pull/12/merge`.
static PR_REF_IN_SCRIPT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\b(gh|hub)\s+pr\s+(checkout|co)\b|\bhub\s+checkout\b|(^|[\s:/'\x22])(refs/)?pull/(\$\{\{[^}]*\}\}|[^\s/]+)/(head|merge)\b",
    )
        .expect("valid regex")
});
/// Commands that fetch code: a head context or variable on such a line is a checkout.
static FETCH_COMMAND: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b(git|gh|hub|curl|wget)\s+").expect("valid regex"));
static SHELL_VAR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)").expect("valid regex"));

/// The inputs of a reusable workflow that its caller fills with the pull request's head.
pub(crate) fn head_inputs(
    with: &LoE<Env>,
    inputs: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    env_text(with)
        .into_iter()
        .filter_map(|(k, v)| names_pr_head(&v, &[], inputs).map(|what| (k.to_lowercase(), what)))
        .collect()
}

/// Whether text names the pull request's head: a `refs/pull/…` ref, or an expression
/// reading the head's ref, sha or repository, directly, through `env.X`, or through an
/// input the caller fills with one.
fn names_pr_head(
    text: &str,
    envs: &[&LoE<Env>],
    inputs: &BTreeMap<String, String>,
) -> Option<String> {
    if text.contains("refs/pull/") {
        return Some("`refs/pull/…`".into());
    }
    for e in expr::embedded(text) {
        let Ok(parsed) = expr::parse(e.body) else {
            continue;
        };
        for p in expr::all_paths(&parsed) {
            if PR_HEAD.iter().any(|h| expr::under(&p, h)) {
                return Some(format!("`{p}`"));
            }
            if let Some(name) = p.strip_prefix("env.")
                && let Some(v) = envs.iter().find_map(|env| env_value_ci(env, name))
                && let Some(what) = names_pr_head(&v.to_string(), &[], inputs)
            {
                return Some(format!("`{p}`, set from {what}"));
            }
            if let Some(name) = p.strip_prefix("inputs.")
                && let Some(what) = inputs.get(name.split('.').next().unwrap_or(name))
            {
                return Some(format!("`{p}`, which the caller sets from {what}"));
            }
        }
    }
    None
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
fn logical_lines(script: &str) -> Vec<String> {
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
    inputs: &BTreeMap<String, String>,
) -> Option<String> {
    let envs = [step.env(), &job.env, &workflow.env];
    match step.body {
        StepBody::Uses(s) if is_action(&s.uses, "actions/checkout") => {
            for input in ["ref", "repository"] {
                if let Some(v) = env_value(&s.with, input) {
                    let v = v.to_string();
                    if let Some(what) = names_pr_head(&v, &envs, inputs) {
                        return Some(format!("actions/checkout with `{input}:` from {what}"));
                    }
                    if input == "ref"
                        && let Some(what) = computed_ref(&v)
                    {
                        return Some(format!("actions/checkout with `ref:` from {what}"));
                    }
                }
            }
            None
        }
        StepBody::Uses(_) => None,
        StepBody::Run(s) => {
            for line in logical_lines(&s.run) {
                if let Some(m) = PR_REF_IN_SCRIPT.find(&line) {
                    return Some(format!("`{}` in the script", expr::one_line(m.as_str())));
                }
                if !FETCH_COMMAND.is_match(&line) {
                    continue;
                }
                if let Some(what) = names_pr_head(&line, &envs, inputs) {
                    return Some(format!("a fetch or checkout on {what}"));
                }
                if line.contains("GITHUB_EVENT_PATH") {
                    return Some("a fetch or checkout on a value read from the event payload (`$GITHUB_EVENT_PATH`)".into());
                }
                // `git checkout "$HEAD_SHA"` with `HEAD_SHA: ${{ …head.sha }}` in env.
                for cap in SHELL_VAR.captures_iter(&line) {
                    let name = &cap[1];
                    let value = envs.iter().find_map(|env| env_value(env, name));
                    if let Some(v) = value
                        && let Some(what) = names_pr_head(&v.to_string(), &[], inputs)
                    {
                        return Some(format!("a fetch or checkout on `${name}`, set from {what}"));
                    }
                }
            }
            None
        }
    }
}
