//! no-timeout: a self-hosted job without `timeout-minutes`, whoever can start it: a hung
//! job holds the runner (and its GPUs) for GitHub's default of six hours.

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::rule::Severity;

pub(crate) struct NoTimeout;

audit_meta!(
    NoTimeout,
    "no-timeout",
    Severity::Warning,
    "A self-hosted job without timeout-minutes",
    "A self-hosted job without timeout-minutes: a hung job holds the runner and its GPUs for GitHub's default of six hours."
);

impl Audit for NoTimeout {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        if job.runner.is_some() && job.job.timeout_minutes.is_none() {
            emit.job(
                job.wf.job_mark(job.id),
                "self-hosted job without `timeout-minutes`: a hung job holds the runner (and its GPUs) for 6 hours".into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NoTimeout;
    use crate::workflow::lint::audit::testing::{findings, lines};
    use crate::workflow::lint::rule::Severity;

    #[test]
    fn a_self_hosted_job_without_a_timeout_even_on_push() {
        let f = findings(
            &NoTimeout,
            "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted, gpu]\n    steps: [{run: make}]\n",
        );
        assert_eq!(
            lines(&f),
            [
                "no-timeout 3:3 job gpu: self-hosted job without `timeout-minutes`: a hung job holds the runner (and its GPUs) for 6 hours"
            ]
        );
        assert_eq!(f[0].rule, NoTimeout::RULE);
        assert_eq!(f[0].severity, Severity::Warning);
    }

    #[test]
    fn a_timeout_or_a_hosted_runner_is_not_flagged() {
        for text in [
            "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    timeout-minutes: 30\n    steps: [{run: make}]\n",
            "on: push\njobs:\n  cpu:\n    runs-on: ubuntu-24.04\n    steps: [{run: make}]\n",
        ] {
            let f = findings(&NoTimeout, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
