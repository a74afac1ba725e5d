//! pr-head-checkout: the pull request's code checked out where the base repository's
//! token and secrets are (a privileged trigger, no guard). Which steps do so is a shared
//! fact ([`JobFacts::head_checkouts`]); this rule reports them.

use super::{Audit, Emit};
use crate::workflow::lint::Rule;
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::triggers::names;

pub(crate) struct PrHeadCheckout;

impl Audit for PrHeadCheckout {
    fn rule(&self) -> Rule {
        Rule::PrHeadCheckout
    }

    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        for (i, how) in &job.head_checkouts {
            let step = &job.steps[*i];
            emit.step(
                &step.label,
                job.wf.src.at(&step.path),
                format!(
                    "checks out the pull request's code ({how}) under {}, with the base repository's token and secrets, and no guard{}",
                    names(&job.open_privileged),
                    job.unreadable
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PrHeadCheckout;
    use crate::workflow::lint::Rule;
    use crate::workflow::lint::audit::testing::{all_are, findings, lines};

    #[test]
    fn checkout_of_the_head_under_pull_request_target() {
        let f = findings(
            &PrHeadCheckout,
            "on: pull_request_target\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n        with:\n          ref: ${{ github.event.pull_request.head.sha }}\n      - run: make\n",
        );
        all_are(&f, Rule::PrHeadCheckout);
        assert_eq!(
            lines(&f),
            [
                "pr-head-checkout 6:9 job test: checks out the pull request's code (actions/checkout with `ref:` from `github.event.pull_request.head.sha`) under pull_request_target, with the base repository's token and secrets, and no guard"
            ]
        );
        assert_eq!(f[0].step.as_ref().map(|s| s.number), Some(1));
    }

    #[test]
    fn a_script_that_fetches_the_head_under_issue_comment() {
        let f = findings(
            &PrHeadCheckout,
            "on: issue_comment\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - run: make\n      - name: Get the PR\n        run: gh pr checkout ${{ github.event.issue.number }}\n",
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert_eq!(
            f[0].step.as_ref().map(|s| s.name.as_str()),
            Some("Get the PR")
        );
        assert!(
            f[0].message.contains("`gh pr checkout` in the script"),
            "{:#?}",
            lines(&f)
        );
    }

    #[test]
    fn unprivileged_triggers_guarded_steps_and_base_checkouts_are_not_flagged() {
        for text in [
            // pull_request runs a fork's code with a read-only token: nothing to steal.
            "on: pull_request\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n        with:\n          ref: ${{ github.event.pull_request.head.sha }}\n",
            "on: pull_request_target\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - if: github.event.pull_request.head.repo.full_name == github.repository\n        uses: actions/checkout@v4\n        with:\n          ref: ${{ github.event.pull_request.head.sha }}\n",
            "on: pull_request_target\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n",
        ] {
            let f = findings(&PrHeadCheckout, text);
            assert!(f.is_empty(), "{text}\n{:#?}", lines(&f));
        }
    }
}
