//! wait-past-timeout (warning): a step runs cibox with a `--wait` as long as its job's
//! `timeout-minutes` or longer (GitHub's default of 360 where none is given). GitHub
//! kills the job while cibox still waits for GPUs: the batch never runs, and the run
//! says `cancelled` rather than that the GPUs were busy. Whoever starts the job.

use std::sync::LazyLock;

use github_actions_models::common::expr::LoE;
use regex::Regex;

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::shell::logical_lines;
use crate::workflow::lint::facts::steps::StepBody;
use crate::workflow::lint::rule::Severity;

pub(crate) struct WaitPastTimeout;

audit_meta!(
    WaitPastTimeout,
    "wait-past-timeout",
    Severity::Warning,
    "cibox waits for GPUs as long as its job may run, or longer",
    "A step runs cibox with --wait as long as its job's timeout-minutes or longer (GitHub's default is 360): GitHub kills the job while cibox still waits, so the batch never runs. Give the job timeout-minutes above the wait plus the batches' own timeouts, or wait less."
);

/// GitHub's `timeout-minutes` where a job gives none.
const GITHUB_DEFAULT_MINUTES: f64 = 360.0;

/// A cibox command line with its `--wait`: the duration is the first group.
static CIBOX_WAIT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"\bcibox\b.*?\s--wait(?:=|\s+)["']?([0-9][0-9a-z]*)["']?"#).expect("valid regex")
});

impl Audit for WaitPastTimeout {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        let (minutes, said) = match &job.job.timeout_minutes {
            Some(LoE::Literal(m)) => (m.floor(), format!("`timeout-minutes: {m}`")),
            // An expression: lint cannot tell.
            Some(LoE::Expr(_)) => return,
            None => (
                GITHUB_DEFAULT_MINUTES,
                "GitHub's default of 360 minutes (no `timeout-minutes`)".to_string(),
            ),
        };
        for step in &job.steps {
            let StepBody::Run(run) = step.body else {
                continue;
            };
            for line in logical_lines(run.run) {
                let Some(c) = CIBOX_WAIT.captures(&line) else {
                    continue;
                };
                let Ok(wait) = c[1].parse::<crate::units::Span>() else {
                    continue;
                };
                if wait.0.as_secs_f64() / 60.0 < minutes {
                    continue;
                }
                emit.step(
                    step,
                    step.text_at(job.wf.src, &["run"], &c[0]),
                    format!(
                        "`--wait {}` is as long as the job's {said} or longer: GitHub kills the job while cibox still waits for GPUs, and the batch never runs; give the job `timeout-minutes` above the wait plus the batches' timeouts, or wait less",
                        &c[1]
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WaitPastTimeout;
    use crate::workflow::lint::audit::testing::{all_are, findings, lines};

    #[test]
    fn a_wait_the_job_cannot_outlast() {
        let f = findings(
            &WaitPastTimeout,
            "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted, gpu]\n    timeout-minutes: 25\n    steps:\n      - run: cibox batch run unit --wait 1h --source .\n      - run: |\n          cibox layer run gpu \\\n            --wait=25m\n",
        );
        all_are(&f, WaitPastTimeout::RULE);
        assert_eq!(
            lines(&f),
            [
                "wait-past-timeout 7:14 job gpu: `--wait 1h` is as long as the job's `timeout-minutes: 25` or longer: GitHub kills the job while cibox still waits for GPUs, and the batch never runs; give the job `timeout-minutes` above the wait plus the batches' timeouts, or wait less",
                "wait-past-timeout 9:11 job gpu: `--wait 25m` is as long as the job's `timeout-minutes: 25` or longer: GitHub kills the job while cibox still waits for GPUs, and the batch never runs; give the job `timeout-minutes` above the wait plus the batches' timeouts, or wait less",
            ]
        );
        // No timeout-minutes: GitHub's six hours.
        let f = findings(
            &WaitPastTimeout,
            "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    steps: [{run: cibox batch run x --wait 6h}]\n",
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert!(f[0].message.contains("GitHub's default of 360 minutes"));
    }

    #[test]
    fn a_wait_inside_the_timeout_or_another_commands_wait_is_not_flagged() {
        for text in [
            "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    timeout-minutes: 85\n    steps: [{run: cibox batch run x --wait 1h}]\n",
            "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    timeout-minutes: 10\n    steps: [{run: kubectl wait --wait 2h}]\n",
            "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    timeout-minutes: ${{ inputs.t }}\n    steps: [{run: cibox batch run x --wait 2h}]\n",
        ] {
            let f = findings(&WaitPastTimeout, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
