//! secrets-exposed: secrets within reach of a `pull_request_target` job that any fork's
//! pull request can start: read by the job's own strings (when its workflow has secrets
//! at all), or passed on to a reusable workflow it calls.

use github_actions_models::workflow::job::Secrets;

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::job::{CallFacts, JobFacts};
use crate::workflow::lint::facts::powers::{job_strings, reads_secrets};
use crate::workflow::lint::guard::Trigger;
use crate::workflow::lint::rule::Severity;

pub(crate) struct SecretsExposed;

audit_meta!(
    SecretsExposed,
    "secrets-exposed",
    Severity::Error,
    "Secrets in a pull_request_target job that any fork can start",
    "A pull_request_target job that any fork's pull request starts without a guard reads secrets (other than GITHUB_TOKEN), or passes them to a reusable workflow."
);

impl Audit for SecretsExposed {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        if !job.open.contains(&Trigger::PullRequestTarget) || !job.wf.scope.secrets_passed {
            return;
        }
        let Some(secret) = reads_secrets(&job_strings(job.job, job.wf.workflow, &job.steps)) else {
            return;
        };
        emit.job(
            job.wf.job_mark(job.id),
            format!(
                "reads `{secret}` under pull_request_target without a guard: any fork's pull request can start it"
            ),
        );
    }

    fn check_call(&self, call: &CallFacts<'_>, emit: &mut Emit<'_>) {
        if !call.open.contains(&Trigger::PullRequestTarget) {
            return;
        }
        let leaks = match &call.call.secrets {
            Some(Secrets::Inherit) => Some("secrets: inherit".to_string()),
            Some(Secrets::Env(env)) => {
                reads_secrets(&env.values().map(|v| v.to_string()).collect::<Vec<_>>())
            }
            None => None,
        };
        if let Some(what) = leaks {
            emit.job(
                call.wf.src.at(&["jobs", call.id, "secrets"]),
                format!(
                    "passes `{what}` under pull_request_target without a guard: any fork's pull request can start it"
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SecretsExposed;
    use crate::workflow::lint::audit::testing::{all_are, findings, lines};

    #[test]
    fn a_secret_read_in_a_step_under_pull_request_target() {
        let f = findings(
            &SecretsExposed,
            "on: pull_request_target\njobs:\n  deploy:\n    runs-on: ubuntu-latest\n    steps:\n      - run: ./deploy\n        env:\n          KEY: ${{ secrets.DEPLOY_KEY }}\n",
        );
        all_are(&f, SecretsExposed::RULE);
        assert_eq!(
            lines(&f),
            [
                "secrets-exposed 3:3 job deploy: reads `secrets.DEPLOY_KEY` under pull_request_target without a guard: any fork's pull request can start it"
            ]
        );
    }

    #[test]
    fn secrets_passed_to_a_called_workflow() {
        let f = findings(
            &SecretsExposed,
            "on: pull_request_target\njobs:\n  call:\n    uses: org/ci/.github/workflows/x.yml@v1\n    secrets: inherit\n",
        );
        assert_eq!(
            lines(&f),
            [
                "secrets-exposed 5:14 job call: passes `secrets: inherit` under pull_request_target without a guard: any fork's pull request can start it"
            ]
        );
    }

    #[test]
    fn the_token_guarded_jobs_and_other_triggers_are_not_flagged() {
        for text in [
            "on: pull_request_target\njobs:\n  label:\n    runs-on: ubuntu-latest\n    steps: [{run: \"gh pr edit --add-label x ${{ secrets.GITHUB_TOKEN }}\"}]\n",
            "on: pull_request_target\njobs:\n  deploy:\n    if: github.event.pull_request.head.repo.full_name == github.repository\n    runs-on: ubuntu-latest\n    steps: [{run: \"./deploy ${{ secrets.KEY }}\"}]\n",
            "on: pull_request\njobs:\n  deploy:\n    runs-on: ubuntu-latest\n    steps: [{run: \"./deploy ${{ secrets.KEY }}\"}]\n",
        ] {
            let f = findings(&SecretsExposed, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
