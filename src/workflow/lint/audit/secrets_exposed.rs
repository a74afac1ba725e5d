//! secrets-exposed: secrets within reach of a `pull_request_target` job that any fork's
//! pull request can start: read by the job's own strings (when its workflow has secrets
//! at all), or passed on to a reusable workflow it calls.

use github_actions_models::workflow::Workflow;
use github_actions_models::workflow::job::{Container, NormalJob, Secrets};

use super::{Audit, Emit};
use crate::workflow::lint::Rule;
use crate::workflow::lint::expr;
use crate::workflow::lint::facts::env::env_text;
use crate::workflow::lint::facts::job::{CallFacts, JobFacts};
use crate::workflow::lint::facts::steps::{StepBody, StepView};
use crate::workflow::lint::guard::Trigger;

pub(crate) struct SecretsExposed;

impl Audit for SecretsExposed {
    fn rule(&self) -> Rule {
        Rule::SecretsExposed
    }

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

/// Every string in a job that GitHub evaluates, for secret lookups.
fn job_strings(job: &NormalJob, workflow: &Workflow, steps: &[StepView<'_>]) -> Vec<String> {
    let mut out: Vec<String> = env_text(&job.env)
        .into_iter()
        .chain(env_text(&workflow.env))
        .map(|(_, v)| v)
        .collect();
    // A job container's and its services' credentials and variables.
    for c in job.container.iter().chain(job.services.values()) {
        if let Container::Container {
            credentials, env, ..
        } = c
        {
            out.extend(env_text(env).into_iter().map(|(_, v)| v));
            if let Some(creds) = credentials {
                out.extend(creds.username.iter().chain(&creds.password).cloned());
            }
        }
    }
    // The steps, `parallel:` blocks already flattened by `steps_of`.
    for step in steps {
        match step.body {
            StepBody::Uses(u) => out.extend(env_text(&u.with).into_iter().map(|(_, v)| v)),
            StepBody::Run(r) => out.push(r.run.clone()),
        }
        out.extend(env_text(step.env()).into_iter().map(|(_, v)| v));
    }
    out
}

/// The first secret (other than the job's own `GITHUB_TOKEN`) these strings read.
fn reads_secrets(texts: &[String]) -> Option<String> {
    for t in texts {
        for e in expr::embedded(t) {
            let Ok(parsed) = expr::parse(e.body) else {
                continue;
            };
            for p in expr::all_paths(&parsed) {
                if expr::under(&p, "secrets") && p != "secrets.github_token" {
                    return Some(p);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::SecretsExposed;
    use crate::workflow::lint::Rule;
    use crate::workflow::lint::audit::testing::{all_are, findings, lines};

    #[test]
    fn a_secret_read_in_a_step_under_pull_request_target() {
        let f = findings(
            &SecretsExposed,
            "on: pull_request_target\njobs:\n  deploy:\n    runs-on: ubuntu-latest\n    steps:\n      - run: ./deploy\n        env:\n          KEY: ${{ secrets.DEPLOY_KEY }}\n",
        );
        all_are(&f, Rule::SecretsExposed);
        assert_eq!(
            lines(&f),
            [
                "secrets-exposed 3:3 job deploy: reads `secrets.deploy_key` under pull_request_target without a guard: any fork's pull request can start it"
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
