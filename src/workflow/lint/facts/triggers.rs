//! Which untrusted triggers can still start each job, or start it only when a trusted
//! person asked, once its `if:` and the jobs it needs are taken into account, and how
//! messages name them.

use std::collections::HashMap;

use github_actions_models::workflow::{Job, Workflow};

use crate::workflow::lint::guard::{Condition, JobCondition, Reach, Trigger};

/// What each job's `if:` and the jobs it needs say about each untrusted trigger (a
/// skipped needed job skips it, unless a status function overrides): the strongest of
/// its own condition and its needed jobs'.
pub(crate) fn job_conditions(
    workflow: &Workflow,
    triggers: &[Trigger],
    reach: Reach,
) -> HashMap<String, Vec<(Trigger, Condition)>> {
    // Each `if:` read once; conditions remembered per (job, trigger): a long `needs`
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
    struct Walk<'c, 'a> {
        conditions: &'c HashMap<&'a str, (JobCondition, &'a Vec<String>)>,
        memo: HashMap<&'a str, Condition>,
        t: Trigger,
        reach: Reach,
    }
    fn level<'a>(w: &mut Walk<'_, 'a>, id: &'a str, depth: usize) -> Condition {
        if let Some(known) = w.memo.get(id) {
            return *known;
        }
        let Some((cond, needs)) = w.conditions.get(id) else {
            return Condition::Open;
        };
        // A cycle (GitHub refuses those) or a chain deeper than any real one: open.
        w.memo.insert(id, Condition::Open);
        if depth > 256 {
            return Condition::Open;
        }
        let mut result = cond.for_trigger(w.t, w.reach);
        if !cond.overrides_needs() {
            for n in needs.iter() {
                if let Some((k, _)) = w.conditions.get_key_value(n.as_str()) {
                    result = result.max(level(w, k, depth + 1));
                }
            }
        }
        w.memo.insert(id, result);
        result
    }
    let mut out: HashMap<String, Vec<(Trigger, Condition)>> = workflow
        .jobs
        .keys()
        .map(|id| (id.clone(), Vec::new()))
        .collect();
    for t in triggers {
        let mut walk = Walk {
            conditions: &conditions,
            memo: HashMap::new(),
            t: *t,
            reach,
        };
        for id in workflow.jobs.keys() {
            let c = level(&mut walk, id.as_str(), 0);
            out.get_mut(id)
                .expect("every job has an entry")
                .push((*t, c));
        }
    }
    out
}

/// Triggers as messages list them: `pull_request_target, issue_comment`.
pub(crate) fn names(triggers: &[Trigger]) -> String {
    triggers
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}
