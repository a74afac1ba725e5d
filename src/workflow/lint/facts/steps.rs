//! The steps of a job as the rules walk them: `parallel:` blocks flattened, each step
//! with its label (for findings) and its path (for positions).

use github_actions_models::common::expr::LoE;
use github_actions_models::common::{Env, If, Uses};
use github_actions_models::workflow::job::{NormalJob, ParallelStep, RunStep, Step, UsesStep};

use crate::workflow::lint::StepLabel;
use crate::workflow::lint::guard::{Condition, JobCondition, Reach, Trigger};

/// A step, flattened out of `parallel:` blocks, with where it is.
pub(crate) struct StepView<'a> {
    pub label: StepLabel,
    /// The step's path in the workflow (`jobs.ID.steps.N`, then `parallel.M`).
    pub path: Vec<String>,
    pub body: StepBody<'a>,
}

pub(crate) enum StepBody<'a> {
    Uses(&'a UsesStep),
    Run(&'a RunStep),
}

impl StepView<'_> {
    fn cond(&self) -> Option<&If> {
        match self.body {
            StepBody::Uses(s) => s.shared.r#if.as_ref(),
            StepBody::Run(s) => s.shared.r#if.as_ref(),
        }
    }

    /// What the step's own `if:` says about a trigger.
    pub fn condition(&self, trigger: Trigger, reach: Reach) -> Condition {
        JobCondition::new(self.cond()).for_trigger(trigger, reach)
    }

    /// Whether the step's own `if:` keeps all these triggers' untrusted runs out.
    pub fn guarded_for(&self, triggers: &[Trigger], reach: Reach) -> bool {
        let cond = JobCondition::new(self.cond());
        triggers
            .iter()
            .all(|t| cond.for_trigger(*t, reach) == Condition::Guards)
    }

    pub fn env(&self) -> &LoE<Env> {
        match self.body {
            StepBody::Uses(s) => &s.shared.env,
            StepBody::Run(s) => &s.shared.env,
        }
    }
}

/// The job's steps in order, `parallel:` blocks flattened in place.
pub(crate) fn steps_of<'a>(job_id: &str, job: &'a NormalJob) -> Vec<StepView<'a>> {
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

/// Whether `uses:` names this action (`owner/repo`, any version), as GitHub compares
/// repository names: case-insensitively.
pub(crate) fn is_action(uses: &Uses, slug: &str) -> bool {
    matches!(uses, Uses::Repository(r) if r.slug().eq_ignore_ascii_case(slug))
}
