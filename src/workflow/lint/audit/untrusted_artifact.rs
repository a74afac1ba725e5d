//! untrusted-artifact: under `workflow_run`, a step that downloads what the triggering
//! run uploaded (a fork's pull request made that run) into a job where running it costs
//! something: a self-hosted runner, or on GitHub's runners a job holding secrets or a
//! token that can write code, workflows or packages.

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::env::env_value;
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::powers::holds;
use crate::workflow::lint::facts::steps::{StepBody, StepView, is_action};
use crate::workflow::lint::guard::Trigger;
use crate::workflow::lint::rule::Severity;

pub(crate) struct UntrustedArtifact;

audit_meta!(
    UntrustedArtifact,
    "untrusted-artifact",
    Severity::Error,
    "A fork's artifact downloaded where running it costs something",
    "Under workflow_run, a step downloads what the triggering run uploaded (a fork's pull request made that run) on a self-hosted runner, or into a job holding secrets or a token that writes code, workflows or packages. Handle such files as data, in a job without secrets or write permissions."
);

impl Audit for UntrustedArtifact {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        if !job.open.contains(&Trigger::WorkflowRun) {
            return;
        }
        // On GitHub's runner the machine is thrown away: what matters is what the job
        // holds when the artifact's code runs (a script in it, a file it unpacks over
        // the checkout, a poisoned cache of tools).
        let held = match job.runner {
            Some(_) => None,
            None => match holds(job.job, job.wf.workflow, &job.steps) {
                Some(what) => Some(what),
                None => return,
            },
        };
        for step in &job.steps {
            if step.guarded_for(&[Trigger::WorkflowRun], job.wf.reach) {
                continue;
            }
            let Some(how) = downloads_run_artifact(step) else {
                continue;
            };
            let message = match &held {
                None => format!(
                    "downloads what the triggering run uploaded ({how}) on a self-hosted runner: a fork's pull request made that run, so treat the files as hostile, never run them"
                ),
                Some(what) => format!(
                    "downloads what the triggering run uploaded ({how}) into a job holding {what}: a fork's pull request made that run, and whatever the job runs from the files (a script, a file unpacked over the checkout) gets {what}: handle the files in a job without secrets or write permissions, as data"
                ),
            };
            emit.step(step, step.at(job.wf.src, &[]), message);
        }
    }
}

/// A step that downloads what the triggering run (a pull request's code) uploaded.
fn downloads_run_artifact(step: &StepView<'_>) -> Option<&'static str> {
    match step.body {
        StepBody::Uses(s) if is_action(s.uses, "actions/download-artifact") => {
            let from_run = env_value(s.with, "run-id")
                .is_some_and(|v| v.to_string().contains("github.event.workflow_run"));
            from_run.then_some("actions/download-artifact of the triggering run")
        }
        StepBody::Uses(s) if is_action(s.uses, "dawidd6/action-download-artifact") => {
            Some("dawidd6/action-download-artifact")
        }
        StepBody::Uses(s) if is_action(s.uses, "actions/github-script") => {
            env_value(s.with, "script")
                .is_some_and(|v| {
                    let v = v.to_string();
                    v.contains("downloadArtifact") || v.contains("listWorkflowRunArtifacts")
                })
                .then_some("actions/github-script downloading artifacts")
        }
        StepBody::Run(s) if s.run.contains("gh run download") => Some("`gh run download`"),
        // `gh api …/actions/runs/${{ github.event.workflow_run.id }}/artifacts`, curl.
        StepBody::Run(s)
            if s.run.contains("artifacts")
                && (s.run.contains("workflow_run") || s.run.contains("GITHUB_EVENT_PATH")) =>
        {
            Some("a script fetching the triggering run's artifacts through the API")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::UntrustedArtifact;
    use crate::workflow::lint::audit::testing::{all_are, findings, lines};

    #[test]
    fn the_triggering_runs_artifact_on_a_gpu_runner() {
        let f = findings(
            &UntrustedArtifact,
            "on:\n  workflow_run:\n    workflows: [ci]\njobs:\n  bench:\n    runs-on: [self-hosted, gpu]\n    steps:\n      - uses: actions/download-artifact@v4\n        with:\n          run-id: ${{ github.event.workflow_run.id }}\n      - run: gh run download\n      - run: gh api \"repos/o/r/actions/runs/${{ github.event.workflow_run.id }}/artifacts\" > a.json\n",
        );
        all_are(&f, UntrustedArtifact::RULE);
        assert_eq!(
            lines(&f),
            [
                "untrusted-artifact 8:9 job bench: downloads what the triggering run uploaded (actions/download-artifact of the triggering run) on a self-hosted runner: a fork's pull request made that run, so treat the files as hostile, never run them",
                "untrusted-artifact 11:9 job bench: downloads what the triggering run uploaded (`gh run download`) on a self-hosted runner: a fork's pull request made that run, so treat the files as hostile, never run them",
                "untrusted-artifact 12:9 job bench: downloads what the triggering run uploaded (a script fetching the triggering run's artifacts through the API) on a self-hosted runner: a fork's pull request made that run, so treat the files as hostile, never run them",
            ]
        );
    }

    #[test]
    fn on_githubs_runner_with_a_secret_or_a_strong_token() {
        let f = findings(
            &UntrustedArtifact,
            "on:\n  workflow_run:\n    workflows: [ci]\njobs:\n  publish:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/download-artifact@v4\n        with:\n          run-id: ${{ github.event.workflow_run.id }}\n      - run: bash ./dist/upload.sh\n        env:\n          TOKEN: ${{ secrets.PYPI_TOKEN }}\n",
        );
        assert_eq!(
            lines(&f),
            [
                "untrusted-artifact 8:9 job publish: downloads what the triggering run uploaded (actions/download-artifact of the triggering run) into a job holding `secrets.PYPI_TOKEN`: a fork's pull request made that run, and whatever the job runs from the files (a script, a file unpacked over the checkout) gets `secrets.PYPI_TOKEN`: handle the files in a job without secrets or write permissions, as data"
            ]
        );
        let f = findings(
            &UntrustedArtifact,
            "on:\n  workflow_run:\n    workflows: [ci]\npermissions: {contents: write}\njobs:\n  docs:\n    runs-on: ubuntu-latest\n    steps: [{run: gh run download}]\n",
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert!(
            f[0].message.contains("a token with `contents: write`"),
            "{:#?}",
            lines(&f)
        );
    }

    #[test]
    fn hosted_runners_own_artifacts_and_guarded_steps_are_not_flagged() {
        for text in [
            "on:\n  workflow_run:\n    workflows: [ci]\njobs:\n  bench:\n    runs-on: ubuntu-latest\n    steps: [{run: gh run download}]\n",
            // Commenting the results back needs `pull-requests: write` only.
            "on:\n  workflow_run:\n    workflows: [ci]\njobs:\n  report:\n    runs-on: ubuntu-latest\n    permissions: {pull-requests: write}\n    steps: [{run: \"gh run download && gh pr comment 1 --body-file report.md\"}]\n",
            "on:\n  workflow_run:\n    workflows: [ci]\njobs:\n  bench:\n    runs-on: [self-hosted]\n    steps: [{uses: actions/download-artifact@v4}]\n",
            "on:\n  workflow_run:\n    workflows: [ci]\njobs:\n  bench:\n    runs-on: [self-hosted]\n    steps:\n      - if: github.event.workflow_run.head_repository.full_name == github.repository\n        run: gh run download\n",
        ] {
            let f = findings(&UntrustedArtifact, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
