//! Which untrusted triggers can still start each job once its `if:` and the jobs it
//! needs are taken into account, and how messages name them.

use std::collections::HashMap;

use github_actions_models::workflow::{Job, Workflow};

use crate::workflow::lint::guard::{Condition, JobCondition, Trigger};

/// The untrusted triggers each job can still be started by, after its own `if:` and the
/// jobs it needs (a skipped needed job skips it, unless a status function overrides).
pub(crate) fn open_triggers(
    workflow: &Workflow,
    triggers: &[Trigger],
) -> HashMap<String, Vec<Trigger>> {
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

/// Triggers as messages list them: `pull_request_target, issue_comment`.
pub(crate) fn names(triggers: &[Trigger]) -> String {
    triggers
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}
