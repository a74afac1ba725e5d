//! Reusable workflows a job calls (`uses: ./.github/workflows/NAME`): linted as reached
//! by the calling job's triggers, their findings carried back with the caller named.

use github_actions_models::common::Env;
use github_actions_models::common::expr::LoE;

use super::facts::env::env_text;
use super::facts::head::head_inputs;
use super::facts::job::WorkflowFacts;
use super::facts::taint::tainted_inputs;
use super::guard::Trigger;
use super::{Finding, MAX_CALL_DEPTH, Rule, Scope};

/// How the calling job is reached: the triggers that start it unguarded, and those that
/// start it only when a trusted person asked.
pub(crate) struct Reached<'a> {
    pub open: &'a [Trigger],
    pub approved: &'a [Trigger],
}

/// Lints the workflow a job calls (`uses: ./.github/workflows/NAME`) as reached by the
/// caller's triggers, once per file and reach (the cache), and returns its findings with
/// the calling job prepended to their callers; or why it could not be linted.
pub(crate) fn lint_called(
    wf: &WorkflowFacts<'_>,
    here: Reached<'_>,
    id: &str,
    uses: &str,
    with: &LoE<Env>,
    secrets_passed: bool,
) -> Result<Vec<Finding>, String> {
    let (scope, triggers) = (wf.scope, wf.triggers.as_slice());
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
        .filter(|t| !here.open.contains(t) && !here.approved.contains(t))
        .collect();
    let approved = here.approved.to_vec();
    let tainted = tainted_inputs(with, &scope.tainted_inputs);
    let given: Vec<(String, String)> = env_text(with)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let head = head_inputs(&given, &scope.head_inputs);
    let reach = wf.reach;
    let key = format!(
        "{callee}\n{triggers:?}\n{reach:?}\n{guarded:?}\n{approved:?}\n{tainted:?}\n{head:?}\n{secrets_passed}"
    );
    let cached = scope.cache.borrow().get(&key).cloned();
    let findings = match cached {
        Some(f) => f,
        None => {
            let mut chain = scope.chain.clone();
            chain.push(callee.clone());
            let inner = Scope {
                file: callee,
                triggers: Some(triggers.to_vec()),
                reach,
                guarded,
                approved,
                tainted_inputs: tainted,
                head_inputs: head,
                secrets_passed,
                chain,
                resolve: scope.resolve,
                cache: scope.cache,
                audits: scope.audits,
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
