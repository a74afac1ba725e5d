//! What a job may not do when someone outside the project can start it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::LazyLock;

use github_actions_models::common::expr::LoE;
use github_actions_models::common::{
    BasePermission, Env, EnvValue, If, Permission, Permissions, Uses,
};
use github_actions_models::workflow::job::{
    Container, NormalJob, ParallelStep, RunStep, RunsOn, Secrets, Step, UsesStep,
};
use github_actions_models::workflow::{Job, Workflow};
use regex::Regex;

use super::expr;
use super::guard::{Condition, JobCondition, Trigger};
use super::{Finding, MAX_CALL_DEPTH, Rule, Scope, Source, StepLabel};

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

/// Labels of GitHub's own runners. Anything else (a custom label alone, a group, an
/// expression) is taken as self-hosted: a larger hosted runner with a custom name is a
/// false alarm we accept over missing a GPU box.
static HOSTED_LABEL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)^(ubuntu-(latest|slim|\d+\.\d+)(-arm)?|windows-(latest|\d{4}|11-arm)|macos-(latest|\d+)(-(large|xlarge|intel))?)$",
    )
    .expect("valid regex")
});

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

/// A step, flattened out of `parallel:` blocks, with where it is.
struct StepView<'a> {
    label: StepLabel,
    path: Vec<String>,
    body: StepBody<'a>,
}

impl StepView<'_> {
    fn cond(&self) -> Option<&If> {
        match self.body {
            StepBody::Uses(s) => s.shared.r#if.as_ref(),
            StepBody::Run(s) => s.shared.r#if.as_ref(),
        }
    }

    /// Whether the step's own `if:` keeps all these triggers' untrusted runs out.
    fn guarded_for(&self, triggers: &[Trigger]) -> bool {
        let cond = JobCondition::new(self.cond());
        triggers
            .iter()
            .all(|t| cond.for_trigger(*t) == Condition::Guards)
    }
}

enum StepBody<'a> {
    Uses(&'a UsesStep),
    Run(&'a RunStep),
}

impl StepView<'_> {
    fn env(&self) -> &LoE<Env> {
        match self.body {
            StepBody::Uses(s) => &s.shared.env,
            StepBody::Run(s) => &s.shared.env,
        }
    }
}

fn steps_of<'a>(job_id: &str, job: &'a NormalJob) -> Vec<StepView<'a>> {
    let label = |n: usize, name: Option<&String>, id: Option<&String>, what: String| StepLabel {
        number: n,
        name: name.or(id).cloned().unwrap_or(what),
    };
    let describe_uses = |s: &UsesStep| s.uses.raw().to_string();
    let describe_run = |s: &RunStep| {
        let first = s.run.lines().next().unwrap_or("").trim();
        let short: String = first.chars().take(40).collect();
        if short.len() < first.len() {
            format!("{short}…")
        } else {
            short
        }
    };
    let mut out = Vec::new();
    for (i, step) in job.steps.iter().enumerate() {
        let base = vec![
            "jobs".to_string(),
            job_id.to_string(),
            "steps".to_string(),
            i.to_string(),
        ];
        let mut push = |path: Vec<String>, body: StepBody<'a>| {
            let l = match &body {
                StepBody::Uses(s) => label(
                    i + 1,
                    s.shared.name.as_ref(),
                    s.shared.id.as_ref(),
                    describe_uses(s),
                ),
                StepBody::Run(s) => label(
                    i + 1,
                    s.shared.name.as_ref(),
                    s.shared.id.as_ref(),
                    describe_run(s),
                ),
            };
            out.push(StepView {
                label: l,
                path,
                body,
            });
        };
        match step {
            Step::Uses(s) => push(base, StepBody::Uses(s)),
            Step::Run(s) => push(base, StepBody::Run(s)),
            Step::Parallel { parallel } => {
                for (j, inner) in parallel.iter().enumerate() {
                    let mut path = base.clone();
                    path.extend(["parallel".to_string(), j.to_string()]);
                    match inner {
                        ParallelStep::Uses(s) => push(path, StepBody::Uses(s)),
                        ParallelStep::Run(s) => push(path, StepBody::Run(s)),
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn is_action(uses: &Uses, slug: &str) -> bool {
    matches!(uses, Uses::Repository(r) if r.slug().eq_ignore_ascii_case(slug))
}

/// The values a literal matrix gives `key` (its dimension and its `include` entries), or
/// `None` when any comes from an expression.
fn matrix_values(job: &NormalJob, key: &str) -> Option<Vec<serde_json::Value>> {
    let Some(LoE::Literal(m)) = job.strategy.as_ref().and_then(|s| s.matrix.as_ref()) else {
        return None;
    };
    let mut out = Vec::new();
    match &m.dimensions {
        LoE::Expr(_) => return None,
        LoE::Literal(dims) => {
            for (k, v) in dims {
                if k.eq_ignore_ascii_case(key) {
                    match v {
                        LoE::Expr(_) => return None,
                        LoE::Literal(vals) => {
                            for v in vals {
                                out.push(serde_json::to_value(v).ok()?);
                            }
                        }
                    }
                }
            }
        }
    }
    match &m.include {
        LoE::Expr(_) => return None,
        LoE::Literal(entries) => {
            for e in entries {
                for (k, v) in e {
                    if k.eq_ignore_ascii_case(key) {
                        out.push(serde_json::to_value(v).ok()?);
                    }
                }
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

fn self_hosted(job: &NormalJob) -> Option<String> {
    match &job.runs_on {
        // `runs-on: ${{ matrix.os }}` over a literal list of GitHub's runners.
        LoE::Expr(e)
            if expr::parse(e.as_bare())
                .ok()
                .and_then(|x| expr::context_path(&x.inner))
                .and_then(|p| p.strip_prefix("matrix.").map(str::to_string))
                .and_then(|key| matrix_values(job, &key))
                .is_some_and(|vals| {
                    vals.iter()
                        .all(|v| v.as_str().is_some_and(|l| HOSTED_LABEL.is_match(l.trim())))
                }) =>
        {
            None
        }
        LoE::Expr(e) => Some(format!("`{}`, an expression", e.as_curly())),
        LoE::Literal(RunsOn::Group { group, labels }) => Some(match group {
            Some(g) => format!("runner group `{g}`"),
            None => format!("labels {}", labels.join(", ")),
        }),
        LoE::Literal(RunsOn::Target(labels)) => {
            let custom: Vec<&String> = labels
                .iter()
                .filter(|l| !HOSTED_LABEL.is_match(l.trim()))
                .collect();
            (!custom.is_empty() || labels.is_empty()).then(|| {
                if labels.is_empty() {
                    "no label".to_string()
                } else {
                    format!(
                        "label{} {}",
                        if custom.len() > 1 { "s" } else { "" },
                        custom
                            .iter()
                            .map(|l| format!("`{l}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            })
        }
    }
}

fn env_text(env: &LoE<Env>) -> Vec<(&str, String)> {
    match env {
        LoE::Expr(_) => Vec::new(),
        LoE::Literal(map) => map
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_string()))
            .collect(),
    }
}

fn env_value<'a>(env: &'a LoE<Env>, name: &str) -> Option<&'a EnvValue> {
    match env {
        LoE::Expr(_) => None,
        LoE::Literal(map) => map.get(name),
    }
}

/// An env value by name, as `env.NAME` finds it (context paths are lower-cased).
fn env_value_ci<'a>(env: &'a LoE<Env>, name: &str) -> Option<&'a EnvValue> {
    match env {
        LoE::Expr(_) => None,
        LoE::Literal(map) => map
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v),
    }
}

/// The untrusted data a job's contexts can carry: which matrix keys are built from
/// expressions, and which environment variables hold attacker text.
struct Taint<'a> {
    workflow: &'a Workflow,
    job: &'a NormalJob,
    /// Inputs a caller fills with untrusted values.
    inputs: &'a BTreeMap<String, String>,
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
    fn new(
        workflow: &'a Workflow,
        job: &'a NormalJob,
        inputs: &'a BTreeMap<String, String>,
    ) -> Taint<'a> {
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
            inputs,
            dynamic_matrix,
        }
    }

    /// What makes a context path untrusted, or `None`. `depth` bounds the `env.X` chain.
    fn why(&self, path: &str, step_env: &LoE<Env>, depth: u8) -> Option<String> {
        if let Some(why) = untrusted_value(path, self.inputs) {
            return Some(why);
        }
        if expr::under(path, "steps.*.outputs") {
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
            let all_env = [step_env, &self.job.env, &self.workflow.env];
            // The innermost definition wins, as on GitHub (names compare case-insensitively
            // on the runner only on Windows; we compare as written, lower-cased paths).
            let value = all_env.iter().find_map(|env| match env {
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
                    if let Some(why) = self.why(&inner, &LoE::Literal(Env::default()), depth - 1) {
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
fn untrusted_value(path: &str, inputs: &BTreeMap<String, String>) -> Option<String> {
    if let Some(p) = ATTACKER_TEXT.iter().find(|p| expr::related(path, p)) {
        return Some(format!("`{p}` is written by whoever opened the event"));
    }
    if expr::under(path, "needs.*.outputs") {
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
fn tainted_inputs(with: &LoE<Env>, inputs: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in env_text(with) {
        for e in expr::embedded(&v) {
            let Ok(parsed) = expr::parse(e.body) else {
                continue;
            };
            if let Some(p) = expr::value_paths(&parsed)
                .into_iter()
                .find(|p| untrusted_value(p, inputs).is_some())
            {
                out.insert(k.to_lowercase(), format!("`{p}`"));
            }
        }
    }
    out
}

/// The inputs of a reusable workflow that its caller fills with the pull request's head.
fn head_inputs(with: &LoE<Env>, inputs: &BTreeMap<String, String>) -> BTreeMap<String, String> {
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
fn checks_out_pr_head(
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

/// A step that downloads what the triggering run (a pull request's code) uploaded.
fn downloads_run_artifact(step: &StepView<'_>) -> Option<&'static str> {
    match step.body {
        StepBody::Uses(s) if is_action(&s.uses, "actions/download-artifact") => {
            let from_run = env_value(&s.with, "run-id")
                .is_some_and(|v| v.to_string().contains("github.event.workflow_run"));
            from_run.then_some("actions/download-artifact of the triggering run")
        }
        StepBody::Uses(s) if is_action(&s.uses, "dawidd6/action-download-artifact") => {
            Some("dawidd6/action-download-artifact")
        }
        StepBody::Uses(s) if is_action(&s.uses, "actions/github-script") => {
            env_value(&s.with, "script")
                .is_some_and(|v| {
                    let v = v.to_string();
                    v.contains("downloadArtifact") || v.contains("listWorkflowRunArtifacts")
                })
                .then_some("actions/github-script downloading artifacts")
        }
        StepBody::Run(s) if s.run.contains("gh run download") => Some("`gh run download`"),
        _ => None,
    }
}

fn writes(perms: &Permissions) -> Option<String> {
    match perms {
        Permissions::Base(BasePermission::WriteAll) => Some("write-all".into()),
        Permissions::Base(_) => None,
        Permissions::Explicit(map) => {
            let w: Vec<&str> = map
                .iter()
                .filter(|(_, p)| **p == Permission::Write)
                .map(|(k, _)| k.as_str())
                .collect();
            (!w.is_empty()).then(|| format!("{}: write", w.join(", ")))
        }
    }
}

/// Every string in a job that GitHub evaluates, for secret lookups.
fn job_strings(job: &NormalJob, workflow: &Workflow, steps: &[StepView<'_>]) -> Vec<String> {
    let mut out: Vec<String> = env_text(&job.env)
        .into_iter()
        .chain(env_text(&workflow.env))
        .map(|(_, v)| v)
        .collect();
    // A job container's and its services' credentials and variables.
    for c in job.container.iter().chain(job.services.values()) {
        if let Container::Container {
            credentials, env, ..
        } = c
        {
            out.extend(env_text(env).into_iter().map(|(_, v)| v));
            if let Some(creds) = credentials {
                out.extend(creds.username.iter().chain(&creds.password).cloned());
            }
        }
    }
    // The steps, `parallel:` blocks already flattened by `steps_of`.
    for step in steps {
        match step.body {
            StepBody::Uses(u) => out.extend(env_text(&u.with).into_iter().map(|(_, v)| v)),
            StepBody::Run(r) => out.push(r.run.clone()),
        }
        out.extend(env_text(step.env()).into_iter().map(|(_, v)| v));
    }
    out
}

fn reads_secrets(texts: &[String]) -> Option<String> {
    for t in texts {
        for e in expr::embedded(t) {
            let Ok(parsed) = expr::parse(e.body) else {
                continue;
            };
            for p in expr::all_paths(&parsed) {
                if expr::under(&p, "secrets") && p != "secrets.github_token" {
                    return Some(p);
                }
            }
        }
    }
    None
}

/// The untrusted triggers each job can still be started by, after its own `if:` and the
/// jobs it needs (a skipped needed job skips it, unless a status function overrides).
fn open_triggers(workflow: &Workflow, triggers: &[Trigger]) -> HashMap<String, Vec<Trigger>> {
    // Each `if:` read once; guardedness remembered per (job, trigger): a long `needs`
    // chain would otherwise be walked again for every job (hours for a hostile file).
    let conditions: HashMap<&str, (JobCondition, &Vec<String>)> = workflow
        .jobs
        .iter()
        .map(|(id, job)| {
            let (cond, needs) = match job {
                Job::NormalJob(j) => (&j.r#if, &j.needs),
                Job::ReusableWorkflowCallJob(j) => (&j.r#if, &j.needs),
            };
            (id.as_str(), (JobCondition::new(cond.as_ref()), needs))
        })
        .collect();
    fn guarded<'a>(
        id: &'a str,
        t: Trigger,
        conditions: &HashMap<&'a str, (JobCondition, &'a Vec<String>)>,
        memo: &mut HashMap<&'a str, bool>,
        depth: usize,
    ) -> bool {
        if let Some(known) = memo.get(id) {
            return *known;
        }
        let Some((cond, needs)) = conditions.get(id) else {
            return false;
        };
        // A cycle (GitHub refuses those) or a chain deeper than any real one: not guarded.
        memo.insert(id, false);
        if depth > 256 {
            return false;
        }
        let result = cond.for_trigger(t) == Condition::Guards
            || (!cond.overrides_needs()
                && needs.iter().any(|n| {
                    conditions
                        .get_key_value(n.as_str())
                        .is_some_and(|(k, _)| guarded(k, t, conditions, memo, depth + 1))
                }));
        memo.insert(id, result);
        result
    }
    let mut open: HashMap<String, Vec<Trigger>> = workflow
        .jobs
        .keys()
        .map(|id| (id.clone(), Vec::new()))
        .collect();
    for t in triggers {
        let mut memo = HashMap::new();
        for id in workflow.jobs.keys() {
            if !guarded(id.as_str(), *t, &conditions, &mut memo, 0) {
                open.get_mut(id).expect("every job has an entry").push(*t);
            }
        }
    }
    open
}

fn names(triggers: &[Trigger]) -> String {
    triggers
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The guard to suggest for the triggers that reach a job.
fn suggested_guard(open: &[Trigger]) -> &'static str {
    let first = open.first().copied().unwrap_or(Trigger::PullRequest);
    match first {
        Trigger::PullRequest
        | Trigger::PullRequestReview
        | Trigger::PullRequestReviewComment
        | Trigger::PullRequestTarget => {
            "`if: github.event.pull_request.head.repo.full_name == github.repository`"
        }
        Trigger::WorkflowRun => {
            "`if: github.event.workflow_run.head_repository.full_name == github.repository`"
        }
        Trigger::IssueComment | Trigger::DiscussionComment => {
            "`if: contains(fromJSON('[\"OWNER\", \"MEMBER\", \"COLLABORATOR\"]'), github.event.comment.author_association)`"
        }
        Trigger::Issues => {
            "`if: contains(fromJSON('[\"OWNER\", \"MEMBER\", \"COLLABORATOR\"]'), github.event.issue.author_association)`"
        }
        Trigger::Discussion => {
            "`if: contains(fromJSON('[\"OWNER\", \"MEMBER\", \"COLLABORATOR\"]'), github.event.discussion.author_association)`"
        }
        Trigger::Fork
        | Trigger::Watch
        | Trigger::Gollum
        | Trigger::Status
        | Trigger::CheckRun
        | Trigger::CheckSuite => {
            "a condition on `github.event_name` that leaves it out (anyone can star or fork, edit a public wiki, or get a CI app to report on a fork's commit), or move the job to a GitHub-hosted runner"
        }
    }
}

/// Lints the workflow a job calls (`uses: ./.github/workflows/NAME`) as reached by the
/// caller's triggers, once per file and reach (the cache), and returns its findings with
/// the calling job prepended to their callers; or why it could not be linted.
#[allow(clippy::too_many_arguments)]
fn lint_called(
    scope: &Scope<'_>,
    triggers: &[Trigger],
    open_here: &[Trigger],
    id: &str,
    uses: &str,
    with: &LoE<Env>,
    secrets_passed: bool,
) -> Result<Vec<Finding>, String> {
    if scope.chain.len() >= MAX_CALL_DEPTH {
        return Err(format!(
            "it is more than {MAX_CALL_DEPTH} calls deep, further than GitHub goes"
        ));
    }
    let (callee, text) = (scope.resolve)(uses)
        .ok_or_else(|| "it is not a readable file in this folder".to_string())?;
    if scope.chain.contains(&callee) {
        // A workflow calling itself: GitHub refuses to run it.
        return Ok(Vec::new());
    }
    let guarded: Vec<Trigger> = triggers
        .iter()
        .copied()
        .filter(|t| !open_here.contains(t))
        .collect();
    let tainted = tainted_inputs(with, &scope.tainted_inputs);
    let head = head_inputs(with, &scope.head_inputs);
    let key =
        format!("{callee}\n{triggers:?}\n{guarded:?}\n{tainted:?}\n{head:?}\n{secrets_passed}");
    let cached = scope.cache.borrow().get(&key).cloned();
    let findings = match cached {
        Some(f) => f,
        None => {
            let mut chain = scope.chain.clone();
            chain.push(callee.clone());
            let inner = Scope {
                file: callee,
                triggers: Some(triggers.to_vec()),
                guarded,
                tainted_inputs: tainted,
                head_inputs: head,
                secrets_passed,
                chain,
                resolve: scope.resolve,
                cache: scope.cache,
            };
            let f = super::lint_in(&inner, &text);
            scope.cache.borrow_mut().insert(key, f.clone());
            f
        }
    };
    if let Some(bad) = findings.iter().find(|f| f.rule == Rule::Unparsable) {
        return Err(format!(
            "it is not a readable workflow ({}:{}: {})",
            bad.file, bad.line, bad.message
        ));
    }
    let caller = format!("{} job {id}", scope.file);
    Ok(findings
        .into_iter()
        .map(|mut f| {
            if f.called_by.is_empty() {
                f.called_by = vec![caller.clone()];
                f.called_by_count = 1;
            } else {
                for c in &mut f.called_by {
                    *c = format!("{caller} → {c}");
                }
            }
            f
        })
        .collect())
}

pub(super) fn check(scope: &Scope<'_>, workflow: &Workflow, src: &Source<'_>) -> Vec<Finding> {
    let file = scope.file.as_str();
    let triggers = match &scope.triggers {
        Some(t) => t.clone(),
        None => Trigger::of(&workflow.on.events),
    };
    let mut open = open_triggers(workflow, &triggers);
    for list in open.values_mut() {
        list.retain(|t| !scope.guarded.contains(t));
    }
    let privileged_trigger = triggers.iter().any(|t| t.privileged());
    let mut out = Vec::new();
    let mut called = Vec::new();
    for (id, job) in &workflow.jobs {
        let open_here: &[Trigger] = open.get(id).map(Vec::as_slice).unwrap_or(&[]);
        let open_privileged: Vec<Trigger> = open_here
            .iter()
            .copied()
            .filter(|t| t.privileged())
            .collect();
        let job_mark = src.key_at(&["jobs"], id);
        let mut push =
            |rule: Rule, mark: crate::yaml::Mark, step: Option<&StepLabel>, message: String| {
                out.push(Finding {
                    severity: rule.severity(),
                    rule,
                    file: file.to_string(),
                    line: mark.line,
                    col: mark.col,
                    job: Some(id.clone()),
                    step: step.cloned(),
                    message,
                    called_by: Vec::new(),
                    called_by_count: 0,
                })
            };
        let job = match job {
            Job::NormalJob(j) => j,
            Job::ReusableWorkflowCallJob(call) => {
                if !triggers.is_empty() {
                    let linted = match &call.uses {
                        Uses::Local(local) => lint_called(
                            scope,
                            &triggers,
                            open_here,
                            id,
                            local.raw(),
                            &call.with,
                            call.secrets.is_some(),
                        ),
                        _ => Err("it is in another repository".to_string()),
                    };
                    match linted {
                        Ok(findings) => called.extend(findings),
                        Err(why) if !open_here.is_empty() => push(
                            Rule::UncheckedCall,
                            src.at(&["jobs", id, "uses"]),
                            None,
                            format!(
                                "{} can start this call of `{}`, which lint cannot check ({why}): lint that workflow where it lives, or guard this job",
                                names(open_here),
                                call.uses.raw()
                            ),
                        ),
                        Err(_) => {}
                    }
                }
                if open_here.contains(&Trigger::PullRequestTarget) {
                    let leaks = match &call.secrets {
                        Some(Secrets::Inherit) => Some("secrets: inherit".to_string()),
                        Some(Secrets::Env(env)) => {
                            reads_secrets(&env.values().map(|v| v.to_string()).collect::<Vec<_>>())
                        }
                        None => None,
                    };
                    if let Some(what) = leaks {
                        push(
                            Rule::SecretsExposed,
                            src.at(&["jobs", id, "secrets"]),
                            None,
                            format!(
                                "passes `{what}` under pull_request_target without a guard: any fork's pull request can start it"
                            ),
                        );
                    }
                }
                continue;
            }
        };
        let cond = JobCondition::new(job.r#if.as_ref());
        let unreadable = cond
            .unreadable
            .as_ref()
            .map(|why| format!(" ({why})"))
            .unwrap_or_default();
        let runner = self_hosted(job);
        let steps = steps_of(id, job);

        if let Some(runner) = &runner
            && !open_here.is_empty()
        {
            push(
                Rule::UntrustedSelfHosted,
                src.at(&["jobs", id, "runs-on"]),
                None,
                format!(
                    "runs on a self-hosted runner ({runner}) and {} can start it without a guard{unreadable}: add {}",
                    names(open_here),
                    suggested_guard(open_here)
                ),
            );
        }

        let mut checks_out_head = false;
        if !open_privileged.is_empty() {
            for step in &steps {
                if step.guarded_for(&open_privileged) {
                    continue;
                }
                if let Some(how) = checks_out_pr_head(step, job, workflow, &scope.head_inputs) {
                    checks_out_head = true;
                    push(
                        Rule::PrHeadCheckout,
                        src.at(&step.path),
                        Some(&step.label),
                        format!(
                            "checks out the pull request's code ({how}) under {}, with the base repository's token and secrets, and no guard{unreadable}",
                            names(&open_privileged)
                        ),
                    );
                }
            }
        }

        if !open_privileged.is_empty() && (runner.is_some() || checks_out_head) {
            let perms = match &job.permissions {
                Permissions::Base(BasePermission::Default) => &workflow.permissions,
                p => p,
            };
            if let Some(w) = writes(perms) {
                let at = if matches!(job.permissions, Permissions::Base(BasePermission::Default)) {
                    src.key_at(&[], "permissions")
                } else {
                    src.key_at(&["jobs", id], "permissions")
                };
                push(
                    Rule::WritePermissions,
                    at,
                    None,
                    format!(
                        "has `{w}` while {} lets outsiders drive it: give it `permissions: {{contents: read}}` and move writes to a job that runs no outside code",
                        names(&open_privileged)
                    ),
                );
            }
        }

        if open_here.contains(&Trigger::PullRequestTarget)
            && scope.secrets_passed
            && let Some(secret) = reads_secrets(&job_strings(job, workflow, &steps))
        {
            push(
                Rule::SecretsExposed,
                job_mark,
                None,
                format!(
                    "reads `{secret}` under pull_request_target without a guard: any fork's pull request can start it"
                ),
            );
        }

        if runner.is_some() && open_here.contains(&Trigger::WorkflowRun) {
            for step in &steps {
                if step.guarded_for(&[Trigger::WorkflowRun]) {
                    continue;
                }
                if let Some(how) = downloads_run_artifact(step) {
                    push(
                        Rule::UntrustedArtifact,
                        src.at(&step.path),
                        Some(&step.label),
                        format!(
                            "downloads what the triggering run uploaded ({how}) on a self-hosted runner: a fork's pull request made that run, so treat the files as hostile, never run them"
                        ),
                    );
                }
            }
        }

        // Injection: reported on self-hosted runners, and anywhere under a privileged
        // trigger, whatever the guard (a guard limits who, not what a value holds).
        if !triggers.is_empty() && (runner.is_some() || privileged_trigger) {
            let taint = Taint::new(workflow, job, &scope.tainted_inputs);
            for step in &steps {
                // A shell script, or the JavaScript of actions/github-script.
                let (script, key) = match step.body {
                    StepBody::Run(run) => (run.run.clone(), "run"),
                    StepBody::Uses(u) if is_action(&u.uses, "actions/github-script") => {
                        match env_value(&u.with, "script") {
                            Some(v) => (v.to_string(), "with"),
                            None => continue,
                        }
                    }
                    StepBody::Uses(_) => continue,
                };
                let use_instead = if key == "run" {
                    "\"$VAR\""
                } else {
                    "process.env.VAR"
                };
                let mut seen = BTreeSet::new();
                for e in expr::embedded(&script) {
                    let why = match expr::parse(e.body) {
                        Ok(parsed) => expr::value_paths(&parsed)
                            .iter()
                            .find_map(|p| taint.why(p, step.env(), 4)),
                        // Fail closed: what we cannot read, we cannot call safe.
                        Err(expr::Unparsed::TooLong) => Some(format!(
                            "it is longer than {} bytes, too long to check",
                            expr::MAX_EXPRESSION_BYTES
                        )),
                        Err(expr::Unparsed::Invalid(_)) => None,
                    };
                    if let Some(why) = why
                        && seen.insert(e.raw)
                    {
                        let mut run_path = step.path.clone();
                        run_path.push(key.into());
                        let shown: String = expr::one_line(e.raw);
                        push(
                            Rule::ScriptInjection,
                            src.text_at(&run_path, e.raw.lines().next().unwrap_or(e.raw)),
                            Some(&step.label),
                            format!(
                                "`{shown}` is pasted into the script: {why}; pass it through `env:` and use {use_instead}"
                            ),
                        );
                    }
                }
            }
        }

        if runner.is_some() && job.timeout_minutes.is_none() {
            push(
                Rule::NoTimeout,
                job_mark,
                None,
                "self-hosted job without `timeout-minutes`: a hung job holds the runner (and its GPUs) for 6 hours".into(),
            );
        }
    }
    out.sort_by_key(|f| (f.line, f.col, f.rule));
    out.extend(called);
    out
}
