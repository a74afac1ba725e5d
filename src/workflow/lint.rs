//! Refusing workflows that run untrusted pull-request code on self-hosted runners.

use std::path::Path;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub file: String,
    pub job: String,
    pub reason: String,
}

const GUARD: &str = "github.event.pull_request.head.repo.full_name == github.repository";
const GUARD_REVERSED: &str = "github.repository == github.event.pull_request.head.repo.full_name";

fn triggers(doc: &Value) -> Vec<String> {
    // `on` (some writers quote it, YAML 1.1 readers turn it into `true`).
    let on = doc
        .get("on")
        .or_else(|| doc.get("true"))
        .cloned()
        .unwrap_or(Value::Null);
    match on {
        Value::String(s) => vec![s],
        Value::Array(a) => a
            .into_iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        Value::Object(o) => o.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

fn self_hosted(job: &Value) -> bool {
    let labels = |v: &Value| -> Vec<String> {
        match v {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a
                .iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        }
    };
    let runs_on = job.get("runs-on").cloned().unwrap_or(Value::Null);
    let all = match &runs_on {
        Value::Object(o) => {
            // A runner group is self-hosted by definition.
            if o.contains_key("group") {
                return true;
            }
            o.get("labels").map(labels).unwrap_or_default()
        }
        other => labels(other),
    };
    // An expression could pick a self-hosted runner: fail closed.
    all.iter()
        .any(|l| l.eq_ignore_ascii_case("self-hosted") || l.contains("${{"))
}

fn normalise(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn has_guard(job: &Value) -> bool {
    let cond = match job.get("if") {
        Some(Value::String(s)) => normalise(s),
        _ => return false,
    };
    cond.contains(GUARD) || cond.contains(GUARD_REVERSED)
}

fn checks_out_pr_head(job: &Value) -> bool {
    let steps = job
        .get("steps")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    steps.iter().any(|s| {
        let uses = s.get("uses").and_then(Value::as_str).unwrap_or("");
        let r = s
            .get("with")
            .and_then(|w| w.get("ref"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let repo = s
            .get("with")
            .and_then(|w| w.get("repository"))
            .and_then(Value::as_str)
            .unwrap_or("");
        uses.starts_with("actions/checkout")
            && (r.contains("github.event.pull_request.head")
                || r.contains("github.head_ref")
                || r.contains("refs/pull/")
                || repo.contains("github.event.pull_request.head.repo"))
    })
}

fn reads_secrets(job: &Value) -> bool {
    let text = job.to_string();
    text.match_indices("secrets.")
        .any(|(i, _)| !text[i..].starts_with("secrets.GITHUB_TOKEN"))
        || text.contains("secrets[")
        || text.contains("secrets: inherit")
        || job
            .get("secrets")
            .is_some_and(|s| s.as_str() == Some("inherit"))
}

/// Lints one workflow document.
pub fn lint(file: &Path, doc: &Value) -> Vec<Finding> {
    let file = file.display().to_string();
    let on = triggers(doc);
    let pr = on
        .iter()
        .any(|t| t == "pull_request" || t == "pull_request_target");
    let prt = on.iter().any(|t| t == "pull_request_target");
    let mut out = Vec::new();
    let jobs = doc
        .get("jobs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (name, job) in &jobs {
        let mut push = |severity, reason: &str| {
            out.push(Finding {
                severity,
                file: file.clone(),
                job: name.clone(),
                reason: reason.to_string(),
            })
        };
        let hosted_here = self_hosted(job);
        if hosted_here && pr && !has_guard(job) {
            push(
                Severity::Error,
                &format!(
                    "runs on a self-hosted runner and can be triggered by a pull request from a fork: add `if: {GUARD}`"
                ),
            );
        }
        if prt && checks_out_pr_head(job) {
            push(
                Severity::Error,
                "checks out the pull request's head under pull_request_target: untrusted code with the base repository's permissions",
            );
        }
        if prt && reads_secrets(job) {
            push(
                Severity::Error,
                "reads secrets under pull_request_target, where untrusted code can reach them",
            );
        }
        if hosted_here && job.get("timeout-minutes").is_none() {
            push(
                Severity::Warning,
                "self-hosted job without `timeout-minutes`: a hung job holds the runner (and its GPUs) for 6 hours",
            );
        }
    }
    out
}
