//! What reaches a workflow and each of its jobs: the triggers, the ones each job is still
//! open to, its runner, its steps, the steps that check out the pull request's head, and
//! for a job that calls a reusable workflow, that workflow's own findings. Computed once
//! per workflow and per job; every rule reads them.

use std::collections::HashMap;

use github_actions_models::common::Uses;
use github_actions_models::workflow::Workflow;
use github_actions_models::workflow::job::{NormalJob, ReusableWorkflowCallJob};

use super::actions::Actions;
use super::checkout::{HeadCheckout, head_checkouts};
use super::flags::FlagOutputs;
use super::flow::{Flows, flows};
use super::runner::self_hosted;
use super::scope::Scope;
use super::steps::{Inputs, StepView, StepsContext, steps_of};
use super::taint::Taint;
use super::triggers::job_conditions;
use crate::workflow::lint::finding::Finding;
use crate::workflow::lint::guard::{Condition, JobCondition, Reach, Trigger};
use crate::workflow::lint::source::{Resolver, Source};
use crate::yaml::Mark;

/// What reaches one workflow, as linted in one scope (its own triggers, or a caller's).
pub(crate) struct WorkflowFacts<'a> {
    pub scope: &'a Scope,
    pub workflow: &'a Workflow,
    pub src: &'a Source<'a>,
    /// The untrusted triggers that reach the workflow: its own `on:`, or the caller's.
    pub triggers: Vec<Trigger>,
    /// What those triggers say beyond their names (a label's approval).
    pub reach: Reach,
    /// Whether any of those runs with the base repository's token and secrets.
    pub privileged_trigger: bool,
    /// Per job, the triggers that can still start it: not kept out by its `if:`, the
    /// jobs it needs, or the calling job.
    open: HashMap<String, Vec<Trigger>>,
    /// Per job, the triggers that start it only when a trusted person asked.
    approved: HashMap<String, Vec<Trigger>>,
    /// The local actions its steps use, read once.
    pub actions: Actions,
    /// Its jobs' outputs that can only be flags or counts.
    pub flags: FlagOutputs,
}

impl<'a> WorkflowFacts<'a> {
    /// The facts of `workflow` as `scope` reaches it; its local actions are read through
    /// `resolve`.
    pub fn new(
        scope: &'a Scope,
        workflow: &'a Workflow,
        src: &'a Source<'a>,
        resolve: Resolver<'_>,
    ) -> WorkflowFacts<'a> {
        let (triggers, reach) = match &scope.triggers {
            Some(t) => (t.clone(), scope.reach),
            None => (
                Trigger::of(&workflow.on.events),
                Reach::of(&workflow.on.events),
            ),
        };
        let mut open = HashMap::new();
        let mut approved = HashMap::new();
        for (id, conds) in job_conditions(workflow, &triggers, reach) {
            let of = |want: Condition| -> Vec<Trigger> {
                conds
                    .iter()
                    .filter(|(t, _)| !scope.guarded.contains(t))
                    .filter(|(t, c)| {
                        let c = if scope.approved.contains(t) {
                            (*c).max(Condition::Approved)
                        } else {
                            *c
                        };
                        c == want
                    })
                    .map(|(t, _)| *t)
                    .collect()
            };
            open.insert(id.clone(), of(Condition::Open));
            approved.insert(id, of(Condition::Approved));
        }
        let privileged_trigger = triggers.iter().any(|t| t.privileged());
        let (actions, flags) = if triggers.is_empty() {
            (Actions::default(), FlagOutputs::default())
        } else {
            (
                Actions::load(workflow, resolve),
                FlagOutputs::of(workflow, resolve),
            )
        };
        WorkflowFacts {
            scope,
            workflow,
            src,
            triggers,
            reach,
            privileged_trigger,
            open,
            approved,
            actions,
            flags,
        }
    }

    /// The triggers that can still start job `id`.
    fn open_for(&self, id: &str) -> &[Trigger] {
        self.open.get(id).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The triggers that start job `id` only when a trusted person asked.
    fn approved_for(&self, id: &str) -> &[Trigger] {
        self.approved.get(id).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Where findings about job `id` as a whole point: its key under `jobs:`.
    pub fn job_mark(&self, id: &str) -> Mark {
        self.src.key_at(&["jobs"], id)
    }
}

/// A job that runs steps, and what reaches it.
pub(crate) struct JobFacts<'a> {
    pub wf: &'a WorkflowFacts<'a>,
    pub id: &'a str,
    pub job: &'a NormalJob,
    /// The untrusted triggers that can start the job.
    pub open: &'a [Trigger],
    /// Of those, the ones that run with the base repository's token and secrets.
    pub open_privileged: Vec<Trigger>,
    /// How the job names a self-hosted runner; `None` on GitHub's own.
    pub runner: Option<String>,
    pub steps: Vec<StepView<'a>>,
    /// Which values an outsider writes, as the job's steps see them.
    pub taint: Taint<'a>,
    /// Attacker text its scripts carry from step to step.
    pub flows: Flows,
    /// ` (why)` when the job's `if:` could not be read, for messages; else empty.
    pub unreadable: String,
    /// The steps that check out the pull request's head under a privileged trigger
    /// without a guard, or after an approval that did not vouch for what they fetch. A
    /// fact rather than the pr-head-checkout rule's private finding: write-permissions
    /// reads it too (a job running the pull request's code must not hold write
    /// permissions).
    pub head_checkouts: Vec<HeadCheckout>,
}

impl<'a> JobFacts<'a> {
    pub fn new(wf: &'a WorkflowFacts<'a>, id: &'a str, job: &'a NormalJob) -> JobFacts<'a> {
        let open = wf.open_for(id);
        let open_privileged: Vec<Trigger> =
            open.iter().copied().filter(|t| t.privileged()).collect();
        let unreadable = JobCondition::new(job.r#if.as_ref())
            .unreadable
            .as_ref()
            .map(|why| format!(" ({why})"))
            .unwrap_or_default();
        let taint = Taint::new(wf.workflow, job, &wf.flags);
        let steps = steps_of(
            id,
            job,
            &StepsContext {
                actions: &wf.actions,
                taint: &taint,
                inputs: std::rc::Rc::new(Inputs {
                    tainted: text_inputs(wf.workflow, &wf.scope.tainted_inputs),
                    head: wf.scope.head_inputs.clone(),
                }),
            },
        );
        let flows = flows(job, wf.workflow, &steps, &taint);
        let approved = wf.approved_for(id);
        let head_checkouts = head_checkouts(
            wf.workflow,
            wf.reach,
            job,
            &steps,
            &open_privileged,
            approved,
        );
        JobFacts {
            wf,
            id,
            job,
            open,
            open_privileged,
            runner: self_hosted(job),
            steps,
            taint,
            flows,
            unreadable,
            head_checkouts,
        }
    }
}

/// Of the inputs a caller fills with untrusted values, those that can hold text: GitHub
/// refuses a call whose value for a `type: boolean` or `type: number` input is not one,
/// so such an input carries no attacker text whatever the caller fills it from.
fn text_inputs(
    workflow: &Workflow,
    tainted: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    use github_actions_models::workflow::event::{OptionalBody, WorkflowCallInputType};
    let OptionalBody::Body(call) = &workflow.on.events.workflow_call else {
        return tainted.clone();
    };
    tainted
        .iter()
        .filter(|(name, _)| {
            !call.inputs.iter().any(|(k, input)| {
                k.eq_ignore_ascii_case(name)
                    && matches!(
                        input.r#type,
                        WorkflowCallInputType::Boolean | WorkflowCallInputType::Number
                    )
            })
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A job that calls a reusable workflow, and what reaches it.
pub(crate) struct CallFacts<'a> {
    pub wf: &'a WorkflowFacts<'a>,
    pub id: &'a str,
    pub call: &'a ReusableWorkflowCallJob,
    /// The untrusted triggers that can start the job.
    pub open: &'a [Trigger],
    /// The triggers that start it only when a trusted person asked.
    pub approved: &'a [Trigger],
    /// The called workflow's findings (its callers naming this job), or why lint could
    /// not read it; `None` when no untrusted trigger reaches this workflow at all.
    pub linted: Option<Result<Vec<Finding>, String>>,
}

impl<'a> CallFacts<'a> {
    /// `lint_call` lints the called workflow as this job reaches it (see
    /// `lint::run::Linter::lint_called`); it is asked only when untrusted triggers
    /// reach this workflow at all.
    pub fn new(
        wf: &'a WorkflowFacts<'a>,
        id: &'a str,
        call: &'a ReusableWorkflowCallJob,
        lint_call: impl FnOnce(&[Trigger], &[Trigger], &str) -> Result<Vec<Finding>, String>,
    ) -> CallFacts<'a> {
        let open = wf.open_for(id);
        let approved = wf.approved_for(id);
        let linted = (!wf.triggers.is_empty()).then(|| match &call.uses {
            Uses::Local(local) => lint_call(open, approved, local.raw()),
            _ => Err("it is in another repository".to_string()),
        });
        CallFacts {
            wf,
            id,
            call,
            open,
            approved,
            linted,
        }
    }
}
