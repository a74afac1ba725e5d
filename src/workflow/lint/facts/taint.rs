//! Taint: which context values someone outside the project writes (event text, outputs
//! computed from it, inputs a caller fills with it), directly or through `env:` and a
//! computed matrix.

use std::collections::{BTreeMap, BTreeSet};

use github_actions_models::common::Env;
use github_actions_models::common::expr::LoE;
use github_actions_models::workflow::Workflow;
use github_actions_models::workflow::job::NormalJob;

use super::env::env_text;
use super::flags::{FlagOutputs, step_output};
use crate::workflow::lint::expr;

/// Fields of an event that whoever caused it writes freely: inlined into a script, they
/// are code.
const ATTACKER_TEXT: &[&str] = &[
    "github.head_ref",
    "github.event.pull_request.title",
    "github.event.pull_request.body",
    "github.event.pull_request.head.ref",
    "github.event.pull_request.head.label",
    "github.event.pull_request.head.repo.description",
    "github.event.pull_request.head.repo.homepage",
    "github.event.pull_request.head.repo.default_branch",
    "github.event.issue.title",
    "github.event.issue.body",
    "github.event.comment.body",
    "github.event.review.body",
    "github.event.review_comment.body",
    "github.event.discussion.title",
    "github.event.discussion.body",
    "github.event.pages.*.page_name",
    "github.event.commits.*.message",
    "github.event.commits.*.author.email",
    "github.event.commits.*.author.name",
    "github.event.head_commit.message",
    "github.event.head_commit.author.email",
    "github.event.head_commit.author.name",
    "github.event.workflow_run.head_branch",
    "github.event.workflow_run.display_title",
    "github.event.workflow_run.head_commit.message",
    "github.event.workflow_run.head_commit.author.email",
    "github.event.workflow_run.head_commit.author.name",
    "github.event.workflow_run.head_repository.description",
    "github.event.workflow_run.pull_requests.*.head.ref",
    // The previous title or body of an `edited` event.
    "github.event.changes",
    // A review comment's file and diff, a wiki page's title and summary, a fork's text.
    "github.event.comment.path",
    "github.event.comment.diff_hunk",
    "github.event.pages.*.title",
    "github.event.pages.*.summary",
    "github.event.forkee.description",
    "github.event.forkee.homepage",
    // A status's description and the commit behind it.
    "github.event.description",
    "github.event.commit.commit.message",
    "github.event.check_suite.head_branch",
    "github.event.check_run.output",
];

/// The untrusted data a job's contexts can carry: which matrix keys are built from
/// expressions, and which environment variables hold attacker text.
pub(crate) struct Taint<'a> {
    workflow: &'a Workflow,
    job: &'a NormalJob,
    /// The job outputs of the workflow that can only be flags.
    flags: &'a FlagOutputs,
    /// `None`: every key is dynamic (the matrix is one expression).
    dynamic_matrix: Option<BTreeSet<String>>,
}

fn json_has_expression(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains("${{"),
        serde_json::Value::Array(a) => a.iter().any(json_has_expression),
        serde_json::Value::Object(o) => o.values().any(json_has_expression),
        _ => false,
    }
}

impl<'a> Taint<'a> {
    pub fn new(workflow: &'a Workflow, job: &'a NormalJob, flags: &'a FlagOutputs) -> Taint<'a> {
        let dynamic_matrix = match job.strategy.as_ref().and_then(|s| s.matrix.as_ref()) {
            None => Some(BTreeSet::new()),
            Some(LoE::Expr(_)) => None,
            Some(LoE::Literal(m)) => {
                let mut keys = BTreeSet::new();
                let mut all = false;
                match &m.dimensions {
                    LoE::Expr(_) => all = true,
                    LoE::Literal(dims) => {
                        for (k, v) in dims {
                            let dynamic = match v {
                                LoE::Expr(_) => true,
                                LoE::Literal(vals) => serde_json::to_value(vals)
                                    .map(|j| json_has_expression(&j))
                                    .unwrap_or(true),
                            };
                            if dynamic {
                                keys.insert(k.to_lowercase());
                            }
                        }
                    }
                }
                match &m.include {
                    LoE::Expr(_) => all = true,
                    LoE::Literal(entries) => {
                        for entry in entries {
                            for (k, v) in entry {
                                if serde_json::to_value(v)
                                    .map(|j| json_has_expression(&j))
                                    .unwrap_or(true)
                                {
                                    keys.insert(k.to_lowercase());
                                }
                            }
                        }
                    }
                }
                (!all).then_some(keys)
            }
        };
        Taint {
            workflow,
            job,
            flags,
            dynamic_matrix,
        }
    }

    /// What makes the first untrusted value an expression in `text` can take untrusted,
    /// or `None`.
    pub fn why_in_text(
        &self,
        text: &str,
        envs: &[&LoE<Env>],
        inputs: &BTreeMap<String, String>,
    ) -> Option<String> {
        expr::embedded(text).into_iter().find_map(|e| {
            let parsed = expr::parse(e.body).ok()?;
            expr::value_paths(&parsed)
                .iter()
                .find_map(|p| self.why(p, envs, inputs, 4))
        })
    }

    /// What makes a context path untrusted, or `None`: as a step sees it, whose `env:`
    /// maps (its own, then those around it) are `envs` and whose `inputs.X` are
    /// `inputs`. `depth` bounds the `env.X` chain.
    pub fn why(
        &self,
        path: &str,
        envs: &[&LoE<Env>],
        inputs: &BTreeMap<String, String>,
        depth: u8,
    ) -> Option<String> {
        if let Some(why) = untrusted_value(self.flags, path, inputs) {
            return Some(why);
        }
        if expr::under(path, "steps.*.outputs") && !step_output(self.job, path) {
            return Some(
                "a step's output can carry anything its inputs held (file names, branch names)"
                    .into(),
            );
        }
        if expr::under(path, "matrix") {
            let key = path.split('.').nth(1);
            let dynamic = match (&self.dynamic_matrix, key) {
                (None, _) => true,
                (Some(keys), Some("*")) | (Some(keys), None) => !keys.is_empty(),
                (Some(keys), Some(k)) => keys.contains(k),
            };
            if dynamic {
                return Some(
                    "this matrix value is computed (for example from changed file names)".into(),
                );
            }
        }
        if depth > 0
            && let Some(name) = path.strip_prefix("env.")
        {
            let name = name.split('.').next().unwrap_or(name);
            let all_env = envs
                .iter()
                .copied()
                .chain([&self.job.env, &self.workflow.env]);
            // The innermost definition wins, as on GitHub (names compare case-insensitively
            // on the runner only on Windows; we compare as written, lower-cased paths).
            let value = all_env.into_iter().find_map(|env| match env {
                LoE::Literal(map) => map
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.to_string()),
                LoE::Expr(_) => None,
            })?;
            for e in expr::embedded(&value) {
                let Ok(parsed) = expr::parse(e.body) else {
                    continue;
                };
                for inner in expr::value_paths(&parsed) {
                    if let Some(why) = self.why(&inner, &[], inputs, depth - 1) {
                        return Some(format!("`env.{name}` is set from `{inner}`: {why}"));
                    }
                }
            }
        }
        None
    }
}

/// Untrusted values any job can see: attacker text, job outputs, a caller's inputs
/// filled from those.
fn untrusted_value(
    flags: &FlagOutputs,
    path: &str,
    inputs: &BTreeMap<String, String>,
) -> Option<String> {
    if let Some(p) = ATTACKER_TEXT.iter().find(|p| expr::related(path, p)) {
        return Some(format!("`{p}` is written by whoever opened the event"));
    }
    if expr::under(path, "needs.*.outputs") && !flags.job_output(path) {
        return Some(
            "a job's output can carry anything its steps saw (file names, branch names)".into(),
        );
    }
    if let Some(name) = path.strip_prefix("inputs.") {
        let name = name.split('.').next().unwrap_or(name);
        if let Some(why) = inputs.get(name) {
            return Some(format!("the caller fills `inputs.{name}` from {why}"));
        }
    }
    None
}

/// The inputs of a reusable workflow that its caller fills with untrusted values.
pub(crate) fn tainted_inputs(
    flags: &FlagOutputs,
    with: &LoE<Env>,
    inputs: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in env_text(with) {
        for e in expr::embedded(&v) {
            let Ok(parsed) = expr::parse(e.body) else {
                continue;
            };
            if let Some(p) = expr::value_paths(&parsed)
                .into_iter()
                .find(|p| untrusted_value(flags, p, inputs).is_some())
            {
                out.insert(k.to_lowercase(), format!("`{p}`"));
            }
        }
    }
    out
}
