//! Reusable workflows a job calls (`uses: ./.github/workflows/NAME`): the scope a called
//! workflow is linted in (the caller's reach, inputs and secrets), and its findings
//! carried back with the caller named. The linting itself, and its cache, is
//! [`super::run`]'s.

use github_actions_models::common::Env;
use github_actions_models::common::expr::LoE;

use super::facts::env::env_text;
use super::facts::head::head_inputs;
use super::facts::job::WorkflowFacts;
use super::facts::scope::Scope;
use super::facts::taint::tainted_inputs;
use super::finding::Finding;
use super::guard::Trigger;
use super::rule::Rule;

/// GitHub nests reusable workflows at most ten deep (the caller and nine below).
pub(crate) const MAX_CALL_DEPTH: usize = 10;

/// How the calling job is reached: the triggers that start it unguarded, and those that
/// start it only when a trusted person asked.
pub(crate) struct Reached<'a> {
    pub open: &'a [Trigger],
    pub approved: &'a [Trigger],
}

/// The scope the workflow in file `callee` is linted in when a job of `wf` calls it:
/// reached by the caller's triggers less those the calling job keeps out, with the
/// inputs it fills from `with` and, when `secrets_passed`, its secrets.
pub(crate) fn callee_scope(
    wf: &WorkflowFacts<'_>,
    here: Reached<'_>,
    callee: String,
    with: &LoE<Env>,
    secrets_passed: bool,
) -> Scope {
    let scope = wf.scope;
    let guarded: Vec<Trigger> = wf
        .triggers
        .iter()
        .copied()
        .filter(|t| !here.open.contains(t) && !here.approved.contains(t))
        .collect();
    let tainted = tainted_inputs(&wf.flags, with, &scope.tainted_inputs);
    let given: Vec<(String, String)> = env_text(with)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let head = head_inputs(&given, &scope.head_inputs);
    let mut chain = scope.chain.clone();
    chain.push(callee.clone());
    Scope {
        file: callee,
        triggers: Some(wf.triggers.clone()),
        reach: wf.reach,
        guarded,
        approved: here.approved.to_vec(),
        tainted_inputs: tainted,
        head_inputs: head,
        secrets_passed,
        chain,
    }
}

/// A called workflow's findings as its caller reports them: `caller` (`FILE job JOB`)
/// prepended to their callers; or, when the workflow is not one lint can read, why.
pub(crate) fn carried_back(findings: Vec<Finding>, caller: &str) -> Result<Vec<Finding>, String> {
    if let Some(bad) = findings.iter().find(|f| f.rule == Rule::Unparsable) {
        return Err(format!(
            "it is not a readable workflow ({}:{}: {})",
            bad.file, bad.line, bad.message
        ));
    }
    Ok(findings
        .into_iter()
        .map(|mut f| {
            if f.called_by.is_empty() {
                f.called_by = vec![caller.to_string()];
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
