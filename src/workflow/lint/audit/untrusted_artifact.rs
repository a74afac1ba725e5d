//! untrusted-artifact: on a self-hosted runner under `workflow_run`, a step that
//! downloads what the triggering run uploaded (a fork's pull request made that run).

use super::{Audit, Emit};
use crate::workflow::lint::Rule;
use crate::workflow::lint::facts::env::env_value;
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::steps::{StepBody, StepView, is_action};
use crate::workflow::lint::guard::Trigger;

pub(crate) struct UntrustedArtifact;

impl Audit for UntrustedArtifact {
    fn rule(&self) -> Rule {
        Rule::UntrustedArtifact
    }

    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        if job.runner.is_none() || !job.open.contains(&Trigger::WorkflowRun) {
            return;
        }
        for step in &job.steps {
            if step.guarded_for(&[Trigger::WorkflowRun], job.wf.reach) {
                continue;
            }
            if let Some(how) = downloads_run_artifact(step) {
                emit.step(
                    &step.label,
                    job.wf.src.at(&step.path),
                    format!(
                        "downloads what the triggering run uploaded ({how}) on a self-hosted runner: a fork's pull request made that run, so treat the files as hostile, never run them"
                    ),
                );
            }
        }
    }
}

/// A step that downloads what the triggering run (a pull request's code) uploaded.
fn downloads_run_artifact(step: &StepView<'_>) -> Option<&'static str> {
    match step.body {
        StepBody::Uses(s) if is_action(&s.uses, "actions/download-artifact") => {
            let from_run = env_value(&s.with, "run-id")
                .is_some_and(|v| v.to_string().contains("github.event.workflow_run"));
            from_run.then_some("actions/download-artifact of the triggering run")
        }
        StepBody::Uses(s) if is_action(&s.uses, "dawidd6/action-download-artifact") => {
            Some("dawidd6/action-download-artifact")
        }
        StepBody::Uses(s) if is_action(&s.uses, "actions/github-script") => {
            env_value(&s.with, "script")
                .is_some_and(|v| {
                    let v = v.to_string();
                    v.contains("downloadArtifact") || v.contains("listWorkflowRunArtifacts")
                })
                .then_some("actions/github-script downloading artifacts")
        }
        StepBody::Run(s) if s.run.contains("gh run download") => Some("`gh run download`"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::UntrustedArtifact;
    use crate::workflow::lint::Rule;
    use crate::workflow::lint::audit::testing::{all_are, findings, lines};

    #[test]
    fn the_triggering_runs_artifact_on_a_gpu_runner() {
        let f = findings(
            &UntrustedArtifact,
            "on:\n  workflow_run:\n    workflows: [ci]\njobs:\n  bench:\n    runs-on: [self-hosted, gpu]\n    steps:\n      - uses: actions/download-artifact@v4\n        with:\n          run-id: ${{ github.event.workflow_run.id }}\n      - run: gh run download\n",
        );
        all_are(&f, Rule::UntrustedArtifact);
        assert_eq!(
            lines(&f),
            [
                "untrusted-artifact 8:9 job bench: downloads what the triggering run uploaded (actions/download-artifact of the triggering run) on a self-hosted runner: a fork's pull request made that run, so treat the files as hostile, never run them",
                "untrusted-artifact 11:9 job bench: downloads what the triggering run uploaded (`gh run download`) on a self-hosted runner: a fork's pull request made that run, so treat the files as hostile, never run them",
            ]
        );
    }

    #[test]
    fn hosted_runners_own_artifacts_and_guarded_steps_are_not_flagged() {
        for text in [
            "on:\n  workflow_run:\n    workflows: [ci]\njobs:\n  bench:\n    runs-on: ubuntu-latest\n    steps: [{run: gh run download}]\n",
            "on:\n  workflow_run:\n    workflows: [ci]\njobs:\n  bench:\n    runs-on: [self-hosted]\n    steps: [{uses: actions/download-artifact@v4}]\n",
            "on:\n  workflow_run:\n    workflows: [ci]\njobs:\n  bench:\n    runs-on: [self-hosted]\n    steps:\n      - if: github.event.workflow_run.head_repository.full_name == github.repository\n        run: gh run download\n",
        ] {
            let f = findings(&UntrustedArtifact, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
