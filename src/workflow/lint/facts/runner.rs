//! Whether a job runs on a self-hosted runner, and how its `runs-on:` says so.

use std::sync::LazyLock;

use github_actions_models::common::expr::LoE;
use github_actions_models::workflow::job::{NormalJob, RunsOn};
use regex::Regex;

use crate::workflow::lint::expr;

/// Labels of GitHub's own runners. Anything else (a custom label alone, a group, an
/// expression) is taken as self-hosted: a larger hosted runner with a custom name is a
/// false alarm we accept over missing a GPU box.
static HOSTED_LABEL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)^(ubuntu-(latest|slim|\d+\.\d+)(-arm)?|windows-(latest|\d{4}|11-arm)|macos-(latest|\d+)(-(large|xlarge|intel))?)$",
    )
    .expect("valid regex")
});

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

/// How the job names a self-hosted runner (for the message), or `None` on GitHub's own.
pub(crate) fn self_hosted(job: &NormalJob) -> Option<String> {
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
