//! The steps of a job as the rules walk them: `parallel:` blocks flattened, the steps of
//! local composite actions put in place of the step that uses them (they run in the
//! job, with its token and secrets), each step with its label (for findings), its path
//! and file (for positions), the conditions and `env:` maps around it, and what its
//! `inputs.X` hold.

use std::collections::BTreeMap;
use std::rc::Rc;

use github_actions_models::action;
use github_actions_models::common::expr::LoE;
use github_actions_models::common::{Env, If, Uses};
use github_actions_models::workflow::job::{NormalJob, ParallelStep, Step};

use super::actions::{Actions, LocalAction, MAX_ACTION_DEPTH};
use super::env::env_text;
use super::head::{HeadRef, head_inputs};
use super::taint::Taint;
use crate::workflow::lint::finding::StepLabel;
use crate::workflow::lint::guard::{Condition, JobCondition, Reach, Trigger};
use crate::workflow::lint::source::Source;
use crate::yaml::Mark;

/// A step, flattened out of `parallel:` blocks and composite actions, with where it is.
pub(crate) struct StepView<'a> {
    pub label: StepLabel,
    /// The step's path in its file (`jobs.ID.steps.N`, then `parallel.M`; in an action,
    /// `runs.steps.N`).
    pub path: Vec<String>,
    pub body: StepBody<'a>,
    /// The local action whose file holds the step; `None` for the workflow's own.
    pub origin: Option<&'a LocalAction>,
    /// Its `if:`, after those of the `uses:` steps it is inside (a skipped composite
    /// action runs none of its steps).
    conds: Vec<Option<&'a If>>,
    /// Its `env:`, then those of the `uses:` steps it is inside, innermost first.
    envs: Vec<&'a LoE<Env>>,
    /// What its `inputs.X` hold: the reusable workflow's (from the caller), or the
    /// composite action's (from the `with:` that calls it).
    pub inputs: Rc<Inputs>,
}

/// The inputs a step's `inputs.X` reads that hold untrusted values (lower-case name →
/// why) or the pull request's head.
#[derive(Debug, Default)]
pub(crate) struct Inputs {
    pub tainted: BTreeMap<String, String>,
    pub head: BTreeMap<String, HeadRef>,
}

/// A step's body, whichever kind of file it is in.
#[derive(Clone, Copy)]
pub(crate) enum StepBody<'a> {
    Uses(UsesRef<'a>),
    Run(RunRef<'a>),
}

#[derive(Clone, Copy)]
pub(crate) struct UsesRef<'a> {
    pub uses: &'a Uses,
    pub with: &'a LoE<Env>,
}

#[derive(Clone, Copy)]
pub(crate) struct RunRef<'a> {
    pub run: &'a str,
}

impl StepView<'_> {
    /// What the step's `if:` (and those around it) say about a trigger.
    pub fn condition(&self, trigger: Trigger, reach: Reach) -> Condition {
        self.conds
            .iter()
            .map(|c| JobCondition::new(*c).for_trigger(trigger, reach))
            .max()
            .unwrap_or(Condition::Open)
    }

    /// Whether the step's own `if:` keeps all these triggers' untrusted runs out.
    pub fn guarded_for(&self, triggers: &[Trigger], reach: Reach) -> bool {
        triggers
            .iter()
            .all(|t| self.condition(*t, reach) == Condition::Guards)
    }

    /// Its own `env:`.
    pub fn env(&self) -> &LoE<Env> {
        self.envs[0]
    }

    /// Its `env:` and those of the `uses:` steps it is inside, innermost first.
    pub fn envs(&self) -> &[&LoE<Env>] {
        &self.envs
    }

    /// The file the step is in, when it is not the workflow (a local action's).
    pub fn file(&self) -> Option<&str> {
        self.origin.map(|a| a.file.as_str())
    }

    /// The position of `sub` below the step (the step itself when empty), in its file.
    pub fn at(&self, workflow: &Source<'_>, sub: &[&str]) -> Mark {
        let mut path = self.path.clone();
        path.extend(sub.iter().map(|s| s.to_string()));
        match self.origin {
            Some(a) => a.source().at(&path),
            None => workflow.at(&path),
        }
    }

    /// Where `needle` first appears at or below `sub` of the step, in its file.
    pub fn text_at(&self, workflow: &Source<'_>, sub: &[&str], needle: &str) -> Mark {
        let mut path = self.path.clone();
        path.extend(sub.iter().map(|s| s.to_string()));
        match self.origin {
            Some(a) => a.source().text_at(&path, needle),
            None => workflow.text_at(&path, needle),
        }
    }
}

/// What `steps_of` needs besides the job: the local actions read for the workflow, the
/// taint of values (for what a `with:` passes into an action), and the inputs of the
/// workflow's own steps.
pub(crate) struct StepsContext<'a, 'b> {
    pub actions: &'a Actions,
    pub taint: &'b Taint<'a>,
    pub inputs: Rc<Inputs>,
}

/// A short name for a step without `name:` or `id:`.
fn describe(body: &StepBody<'_>) -> String {
    match body {
        StepBody::Uses(u) => u.uses.raw().to_string(),
        StepBody::Run(r) => {
            let first = r.run.lines().next().unwrap_or("").trim();
            let short: String = first.chars().take(40).collect();
            if short.len() < first.len() {
                format!("{short}…")
            } else {
                short
            }
        }
    }
}

/// The job's steps in order, `parallel:` blocks flattened in place, and after each
/// `uses:` of a local composite action, that action's steps.
pub(crate) fn steps_of<'a>(
    job_id: &str,
    job: &'a NormalJob,
    cx: &StepsContext<'a, '_>,
) -> Vec<StepView<'a>> {
    let mut out = Vec::new();
    for (i, step) in job.steps.iter().enumerate() {
        let base = vec![
            "jobs".to_string(),
            job_id.to_string(),
            "steps".to_string(),
            i.to_string(),
        ];
        let mut bodies: Vec<(
            Vec<String>,
            StepBody<'a>,
            &'a github_actions_models::workflow::job::SharedStepFields,
        )> = Vec::new();
        match step {
            Step::Uses(s) => bodies.push((
                base,
                StepBody::Uses(UsesRef {
                    uses: &s.uses,
                    with: &s.with,
                }),
                &s.shared,
            )),
            Step::Run(s) => bodies.push((base, StepBody::Run(RunRef { run: &s.run }), &s.shared)),
            Step::Parallel { parallel } => {
                for (j, inner) in parallel.iter().enumerate() {
                    let mut path = base.clone();
                    path.extend(["parallel".to_string(), j.to_string()]);
                    match inner {
                        ParallelStep::Uses(s) => bodies.push((
                            path,
                            StepBody::Uses(UsesRef {
                                uses: &s.uses,
                                with: &s.with,
                            }),
                            &s.shared,
                        )),
                        ParallelStep::Run(s) => {
                            bodies.push((path, StepBody::Run(RunRef { run: &s.run }), &s.shared))
                        }
                    }
                }
            }
            _ => {}
        }
        for (path, body, shared) in bodies {
            let name = shared
                .name
                .as_ref()
                .or(shared.id.as_ref())
                .cloned()
                .unwrap_or_else(|| describe(&body));
            let view = StepView {
                label: StepLabel {
                    number: i + 1,
                    name,
                },
                path,
                body,
                origin: None,
                conds: vec![shared.r#if.as_ref()],
                envs: vec![&shared.env],
                inputs: cx.inputs.clone(),
            };
            push_with_action(view, cx, 1, &mut out);
        }
    }
    out
}

/// Pushes a step, then, when it uses a local composite action, that action's steps.
fn push_with_action<'a>(
    step: StepView<'a>,
    cx: &StepsContext<'a, '_>,
    depth: usize,
    out: &mut Vec<StepView<'a>>,
) {
    let action = match step.body {
        StepBody::Uses(u) if depth <= MAX_ACTION_DEPTH => match cx.actions.get(u.uses) {
            Some(Ok(a)) => a.composite_steps().map(|steps| (a, u, steps)),
            _ => None,
        },
        _ => None,
    };
    let Some((a, u, steps)) = action else {
        out.push(step);
        return;
    };
    let inputs = Rc::new(action_inputs(a, u.with, &step, cx.taint));
    let (outer_label, outer_conds, outer_envs) =
        (step.label.clone(), step.conds.clone(), step.envs.clone());
    out.push(step);
    for (m, s) in steps.iter().enumerate() {
        let body = match &s.body {
            action::StepBody::Uses { uses, with } => StepBody::Uses(UsesRef { uses, with }),
            action::StepBody::Run { run, .. } => StepBody::Run(RunRef { run }),
        };
        let inner = s.name.as_ref().or(s.id.as_ref()).cloned();
        let inner = inner.unwrap_or_else(|| describe(&body));
        let mut conds = vec![s.r#if.as_ref()];
        conds.extend(outer_conds.iter().copied());
        let mut envs = vec![&s.env];
        envs.extend(outer_envs.iter().copied());
        let view = StepView {
            label: StepLabel {
                number: outer_label.number,
                name: format!("{} › {} step {} ({inner})", outer_label.name, a.file, m + 1),
            },
            path: vec!["runs".into(), "steps".into(), m.to_string()],
            body,
            origin: Some(a),
            conds,
            envs,
            inputs: inputs.clone(),
        };
        push_with_action(view, cx, depth + 1, out);
    }
}

/// What a composite action's `inputs.X` hold when `with` calls it from `caller`: the
/// values given, else the action's defaults (read in the same contexts).
fn action_inputs(
    a: &LocalAction,
    with: &LoE<Env>,
    caller: &StepView<'_>,
    taint: &Taint<'_>,
) -> Inputs {
    let mut given: Vec<(String, String)> = env_text(with)
        .into_iter()
        .map(|(k, v)| (k.to_lowercase(), v))
        .collect();
    for (name, input) in &a.action.inputs {
        let name = name.to_lowercase();
        if let Some(default) = &input.default
            && !given.iter().any(|(k, _)| *k == name)
        {
            given.push((name, default.clone()));
        }
    }
    let tainted = given
        .iter()
        .filter_map(|(k, v)| {
            taint
                .why_in_text(v, caller.envs(), &caller.inputs.tainted)
                .map(|why| (k.clone(), why))
        })
        .collect();
    let head = head_inputs(&given, &caller.inputs.head);
    Inputs { tainted, head }
}

/// Whether `uses:` names this action (`owner/repo`, any version), as GitHub compares
/// repository names: case-insensitively.
pub(crate) fn is_action(uses: &Uses, slug: &str) -> bool {
    matches!(uses, Uses::Repository(r) if r.slug().eq_ignore_ascii_case(slug))
}
