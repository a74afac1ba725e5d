//! What a job holds that an outsider would want: the secrets its strings read, the
//! write permissions its token has.

use github_actions_models::common::{BasePermission, Permission, Permissions};
use github_actions_models::workflow::Workflow;
use github_actions_models::workflow::job::{Container, NormalJob};

use super::env::env_text;
use super::steps::{StepBody, StepView};
use crate::workflow::lint::expr;

/// Every string in a job that GitHub evaluates, for secret lookups.
pub(crate) fn job_strings(
    job: &NormalJob,
    workflow: &Workflow,
    steps: &[StepView<'_>],
) -> Vec<String> {
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
            StepBody::Uses(u) => out.extend(env_text(u.with).into_iter().map(|(_, v)| v)),
            StepBody::Run(r) => out.push(r.run.to_string()),
        }
        out.extend(env_text(step.env()).into_iter().map(|(_, v)| v));
    }
    out
}

/// The first secret (other than the job's own `GITHUB_TOKEN`) these strings read.
pub(crate) fn reads_secrets(texts: &[String]) -> Option<String> {
    for t in texts {
        for e in expr::embedded(t) {
            let Ok(parsed) = expr::parse(e.body) else {
                continue;
            };
            for p in expr::all_paths(&parsed) {
                if expr::under(&p, "secrets") && p != "secrets.github_token" {
                    return Some(as_written(e.body, &p));
                }
            }
        }
    }
    None
}

/// `path` (lower-cased, as expressions compare names) as the expression spells it,
/// `secrets.HF_TOKEN` rather than `secrets.hf_token`; as given where it is not there
/// whole (`secrets['HF_TOKEN']`).
fn as_written(body: &str, path: &str) -> String {
    let lower = body.to_ascii_lowercase();
    let mut from = 0;
    while let Some(at) = lower[from..].find(path).map(|i| i + from) {
        let end = at + path.len();
        let ends_there = !lower[end..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if ends_there && body.is_char_boundary(at) && body.is_char_boundary(end) {
            return body[at..end].to_string();
        }
        from = end;
    }
    path.to_string()
}

/// The write permissions granted, as the message names them; `None` when none is.
pub(crate) fn writes(perms: &Permissions) -> Option<String> {
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

/// The permissions a job's token has: its own, else the workflow's.
pub(crate) fn job_permissions<'a>(job: &'a NormalJob, workflow: &'a Workflow) -> &'a Permissions {
    if matches!(job.permissions, Permissions::Base(BasePermission::Default)) {
        &workflow.permissions
    } else {
        &job.permissions
    }
}

/// Scopes whose write access lets whoever runs code in the job change the repository or
/// act beyond it: push code or tags, run or change workflows, publish packages, mint
/// cloud credentials, deploy. (Writing comments, labels or statuses is what a job
/// reporting on a pull request needs.)
const STRONG_SCOPES: &[&str] = &[
    "contents",
    "actions",
    "packages",
    "id-token",
    "deployments",
    "pages",
    "security-events",
    "attestations",
];

/// What of value a job holds: the first secret it reads (not `GITHUB_TOKEN`), or a
/// strong write permission (see [`STRONG_SCOPES`]); `None` when it holds neither.
pub(crate) fn holds(
    job: &NormalJob,
    workflow: &Workflow,
    steps: &[StepView<'_>],
) -> Option<String> {
    if let Some(secret) = reads_secrets(&job_strings(job, workflow, steps)) {
        return Some(format!("`{secret}`"));
    }
    match job_permissions(job, workflow) {
        Permissions::Base(BasePermission::WriteAll) => Some("a `write-all` token".into()),
        Permissions::Base(_) => None,
        Permissions::Explicit(map) => {
            let strong: Vec<&str> = map
                .iter()
                .filter(|(k, p)| **p == Permission::Write && STRONG_SCOPES.contains(&k.as_str()))
                .map(|(k, _)| k.as_str())
                .collect();
            (!strong.is_empty()).then(|| format!("a token with `{}: write`", strong.join(", ")))
        }
    }
}
