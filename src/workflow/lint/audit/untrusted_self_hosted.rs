//! untrusted-self-hosted: a self-hosted job that an outsider's event starts without a
//! guard. The finding suggests the guard that fits the first trigger.

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::triggers::names;
use crate::workflow::lint::guard::Trigger;
use crate::workflow::lint::rule::Severity;

pub(crate) struct UntrustedSelfHosted;

audit_meta!(
    UntrustedSelfHosted,
    "untrusted-self-hosted",
    Severity::Error,
    "A self-hosted runner that outsiders' events reach",
    "A job on a self-hosted runner (any label that is not a GitHub-hosted one, a runner group, an expression) that an event outsiders can cause (a fork's pull request, a comment, an issue, a run of another workflow, a star, a status) starts without a guard. Guard it with the same-repository check, the commenter's association, or for outsiders' pull requests the approved-commit pattern (pull_request_target on labeled only, a label check, a checkout of github.event.pull_request.head.sha)."
);

impl Audit for UntrustedSelfHosted {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        let Some(runner) = &job.runner else {
            return;
        };
        if job.open.is_empty() {
            return;
        }
        emit.job(
            job.wf.src.at(&["jobs", job.id, "runs-on"]),
            format!(
                "runs on a self-hosted runner ({runner}) and {} can start it without a guard{}: add {}",
                names(job.open),
                job.unreadable,
                suggested_guard(job.open)
            ),
        );
    }
}

/// The guard to suggest for the triggers that reach a job.
fn suggested_guard(open: &[Trigger]) -> &'static str {
    let first = open.first().copied().unwrap_or(Trigger::PullRequest);
    match first {
        Trigger::PullRequest | Trigger::PullRequestReview | Trigger::PullRequestReviewComment => {
            "`if: github.event.pull_request.head.repo.full_name == github.repository`"
        }
        Trigger::PullRequestTarget => {
            "`if: github.event.pull_request.head.repo.full_name == github.repository`, or for outsiders' pull requests the approved-commit pattern (`types: [labeled]` only, `if: github.event.label.name == 'LABEL'`, a checkout of `github.event.pull_request.head.sha`)"
        }
        Trigger::WorkflowRun => {
            "`if: github.event.workflow_run.head_repository.full_name == github.repository`"
        }
        Trigger::IssueComment | Trigger::DiscussionComment => {
            "`if: contains(fromJSON('[\"OWNER\", \"MEMBER\", \"COLLABORATOR\"]'), github.event.comment.author_association)`"
        }
        Trigger::Issues => {
            "`if: contains(fromJSON('[\"OWNER\", \"MEMBER\", \"COLLABORATOR\"]'), github.event.issue.author_association)`"
        }
        Trigger::Discussion => {
            "`if: contains(fromJSON('[\"OWNER\", \"MEMBER\", \"COLLABORATOR\"]'), github.event.discussion.author_association)`"
        }
        Trigger::Fork
        | Trigger::Watch
        | Trigger::Gollum
        | Trigger::Status
        | Trigger::CheckRun
        | Trigger::CheckSuite => {
            "a condition on `github.event_name` that leaves it out (anyone can star or fork, edit a public wiki, or get a CI app to report on a fork's commit), or move the job to a GitHub-hosted runner"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::UntrustedSelfHosted;
    use crate::workflow::lint::audit::testing::{all_are, findings, lines};

    #[test]
    fn a_gpu_runner_under_pull_request_without_a_guard() {
        let f = findings(
            &UntrustedSelfHosted,
            "on: pull_request\njobs:\n  gpu:\n    runs-on: [self-hosted, gpu]\n    steps: [{run: make}]\n",
        );
        all_are(&f, UntrustedSelfHosted::RULE);
        assert_eq!(
            lines(&f),
            [
                "untrusted-self-hosted 4:14 job gpu: runs on a self-hosted runner (labels `self-hosted`, `gpu`) and pull_request can start it without a guard: add `if: github.event.pull_request.head.repo.full_name == github.repository`"
            ]
        );
    }

    #[test]
    fn the_suggested_guard_fits_the_trigger() {
        let f = findings(
            &UntrustedSelfHosted,
            "on: issue_comment\njobs:\n  gpu:\n    runs-on: gpu-box\n    steps: [{run: make}]\n",
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert!(
            f[0].message
                .contains("github.event.comment.author_association"),
            "{:#?}",
            lines(&f)
        );
    }

    #[test]
    fn hosted_runners_guarded_jobs_and_trusted_triggers_are_not_flagged() {
        for text in [
            "on: pull_request\njobs:\n  cpu:\n    runs-on: ubuntu-latest\n    steps: [{run: make}]\n",
            "on: pull_request\njobs:\n  gpu:\n    if: github.event.pull_request.head.repo.full_name == github.repository\n    runs-on: [self-hosted]\n    steps: [{run: make}]\n",
            "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    steps: [{run: make}]\n",
        ] {
            let f = findings(&UntrustedSelfHosted, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
