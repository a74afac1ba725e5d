//! The pull request's head (its code) named in text: the contexts that hold its ref,
//! sha or repository, the refs built from its number, and the inputs a caller fills with
//! one. Which steps go on to fetch or check it out is [`super::checkout`]'s.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use github_actions_models::common::Env;
use github_actions_models::common::expr::LoE;
use regex::Regex;

use super::env::env_value_ci;
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

/// The pull request's head, named in text: how, and whether it is the commit a
/// maintainer's label approved (`github.event.pull_request.head.sha`, a sha in the event)
/// rather than whatever the head is when the step runs (a branch, `refs/pull/N/…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeadRef {
    pub what: String,
    pub pinned: bool,
}

impl HeadRef {
    pub(crate) fn new(what: String, pinned: bool) -> HeadRef {
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
pub(crate) fn names_pr_head(
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
