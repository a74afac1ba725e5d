//! Which steps fetch or check out the pull request's head (its code), and which of them
//! do so where that is not safe. The checkout is a fact, not only a finding: a job that
//! runs the pull request's code must not also hold write permissions.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use github_actions_models::common::Env;
use github_actions_models::common::expr::LoE;
use github_actions_models::workflow::Workflow;
use github_actions_models::workflow::job::NormalJob;
use regex::Regex;

use super::env::env_value;
use super::head::{HeadRef, names_pr_head};
use super::shell::{SHELL_VAR, logical_lines};
use super::steps::{StepBody, StepView, is_action};
use crate::workflow::lint::expr;
use crate::workflow::lint::guard::{Condition, Reach, Trigger};

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

/// `gh api` on an endpoint that returns no code: the head's branch or sha given as a
/// query field (`-f branch="$HEAD_BRANCH"`, listing runs) fetches nothing of it.
static GH_API: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\bgh\s+api\b").expect("valid regex"));
/// What of a `gh api` line can fetch code: the endpoints that return files or commits,
/// or another fetching command on the line.
static CODE_ENDPOINT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"tarball|zipball|/contents\b|/git/|\.(patch|diff)\b|\b(git|hub|curl|wget)\s+|\bgh\s+(pr|repo|run)\b")
        .expect("valid regex")
});

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

/// How a step checks out or fetches the pull request's code, if it does.
fn checks_out_pr_head(
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
    if !FETCH_COMMAND.is_match(line) || (GH_API.is_match(line) && !CODE_ENDPOINT.is_match(line)) {
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
/// `approved` those it runs only when a trusted person asked; `reach` is what the
/// workflow's triggers say beyond their names (a label's approval).
pub(crate) fn head_checkouts(
    workflow: &Workflow,
    reach: Reach,
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
        let Some(head) = checks_out_pr_head(step, job, workflow) else {
            continue;
        };
        let (mut unguarded, mut toctou) = (Vec::new(), Vec::new());
        for (t, at_job) in &reachable {
            match (*at_job).max(step.condition(*t, reach)) {
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
