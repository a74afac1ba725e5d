//! unchecked-call: a reusable workflow that lint cannot read (another repository, a
//! missing file, too deep a chain of calls), or a local action whose `action.yml` it
//! cannot read, called where outsiders can reach it.

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::job::{CallFacts, JobFacts};
use crate::workflow::lint::facts::steps::StepBody;
use crate::workflow::lint::facts::triggers::names;
use crate::workflow::lint::rule::Severity;

pub(crate) struct UncheckedCall;

audit_meta!(
    UncheckedCall,
    "unchecked-call",
    Severity::Warning,
    "A reusable workflow or local action that lint cannot check",
    "A reusable workflow in another repository (or missing, broken, or deeper than GitHub allows), or a local action whose action.yml lint cannot read, used by a job outsiders can start. Lint it where it lives, or guard the job."
);

impl Audit for UncheckedCall {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        if job.open.is_empty() {
            return;
        }
        for step in &job.steps {
            let StepBody::Uses(u) = step.body else {
                continue;
            };
            let Some(Err(why)) = job.wf.actions.get(u.uses) else {
                continue;
            };
            emit.step(
                step,
                step.at(job.wf.src, &["uses"]),
                format!(
                    "{} can start this job, whose step uses the local action `{}`, which lint cannot check ({why})",
                    names(job.open),
                    u.uses.raw()
                ),
            );
        }
    }

    fn check_call(&self, call: &CallFacts<'_>, emit: &mut Emit<'_>) {
        // A called workflow lint could not read matters only if an outsider can start
        // the call; the rest is the caller's own business.
        let Some(Err(why)) = &call.linted else {
            return;
        };
        // An approved run too: what the called workflow does with the pull request's
        // head is what lint cannot see.
        let reach: Vec<_> = call.open.iter().chain(call.approved).copied().collect();
        if reach.is_empty() {
            return;
        }
        emit.job(
            call.wf.src.at(&["jobs", call.id, "uses"]),
            format!(
                "{} can start this call of `{}`, which lint cannot check ({why}): lint that workflow where it lives, or guard this job",
                names(&reach),
                call.call.uses.raw()
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::UncheckedCall;
    use crate::workflow::lint::audit::testing::{all_are, findings, findings_with, lines};

    #[test]
    fn a_call_into_another_repository_under_pull_request() {
        let f = findings(
            &UncheckedCall,
            "on: pull_request\njobs:\n  gpu:\n    uses: org/ci/.github/workflows/gpu.yml@v1\n",
        );
        all_are(&f, UncheckedCall::RULE);
        assert_eq!(
            lines(&f),
            [
                "unchecked-call 4:11 job gpu: pull_request can start this call of `org/ci/.github/workflows/gpu.yml@v1`, which lint cannot check (it is in another repository): lint that workflow where it lives, or guard this job"
            ]
        );
    }

    #[test]
    fn a_local_action_lint_cannot_read() {
        let f = findings(
            &UncheckedCall,
            "on: pull_request\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n      - uses: ./.github/actions/gone\n",
        );
        assert_eq!(
            lines(&f),
            [
                "unchecked-call 7:15 job t: pull_request can start this job, whose step uses the local action `./.github/actions/gone`, which lint cannot check (no readable `.github/actions/gone/action.yml` in the repository)"
            ]
        );
        let read = findings_with(
            &UncheckedCall,
            "on: pull_request\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps: [{uses: ./.github/actions/x}]\n",
            &[(
                ".github/actions/x/action.yml",
                "runs:\n  using: composite\n  steps: [{run: make, shell: bash}]\n",
            )],
        );
        assert!(read.is_empty(), "{:#?}", lines(&read));
    }

    #[test]
    fn a_missing_local_workflow_is_named() {
        let f = findings(
            &UncheckedCall,
            "on: issue_comment\njobs:\n  gpu:\n    uses: ./.github/workflows/gone.yml\n",
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert!(
            f[0].message
                .contains("(it is not a readable file in this folder)"),
            "{:#?}",
            lines(&f)
        );
    }

    #[test]
    fn a_readable_call_a_guarded_call_or_a_trusted_trigger_is_not_flagged() {
        let callee = "on: workflow_call\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps: [{run: make}]\n";
        let readable = findings_with(
            &UncheckedCall,
            "on: pull_request\njobs:\n  gpu:\n    uses: ./.github/workflows/x.yml\n",
            &[("x.yml", callee)],
        );
        assert!(readable.is_empty(), "{:#?}", lines(&readable));
        let guarded = findings(
            &UncheckedCall,
            "on: pull_request\njobs:\n  gpu:\n    if: github.event.pull_request.head.repo.full_name == github.repository\n    uses: org/ci/.github/workflows/gpu.yml@v1\n",
        );
        assert!(guarded.is_empty(), "{:#?}", lines(&guarded));
        let push = findings(
            &UncheckedCall,
            "on: push\njobs:\n  gpu:\n    uses: org/ci/.github/workflows/gpu.yml@v1\n",
        );
        assert!(push.is_empty(), "{:#?}", lines(&push));
    }
}
