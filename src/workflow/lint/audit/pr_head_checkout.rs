//! pr-head-checkout: the pull request's code checked out where the base repository's
//! token and secrets are: under a privileged trigger with no guard, or after an approval
//! that did not vouch for it (a member's comment names no commit; a label approves the
//! event's head sha, not a branch that moves). Which steps do so is a shared fact
//! ([`JobFacts::head_checkouts`]); this rule reports them.

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::checkout::HeadCheckout;
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::triggers::names;
use crate::workflow::lint::guard::Trigger;
use crate::workflow::lint::rule::Severity;

pub(crate) struct PrHeadCheckout;

audit_meta!(
    PrHeadCheckout,
    "pr-head-checkout",
    Severity::Error,
    "The pull request's code checked out where the base repository's token and secrets are",
    "A step fetches or checks out the pull request's code (its head or merge ref, its sha, its branch, refs/pull/N/..., gh pr checkout) under a trigger that runs with the base repository's token and secrets, without a guard; or after an approval that does not vouch for what it fetches: a member's comment names no commit, and a label approves the event's head sha, not a branch that moves."
);

impl Audit for PrHeadCheckout {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        for checkout in &job.head_checkouts {
            let step = &job.steps[checkout.step];
            emit.step(
                step,
                step.at(job.wf.src, &[]),
                message(checkout, &job.unreadable),
            );
        }
    }
}

fn message(c: &HeadCheckout, unreadable: &str) -> String {
    let (how, under) = (&c.how, names(&c.triggers));
    if !c.approved {
        return format!(
            "checks out the pull request's code ({how}) under {under}, with the base repository's token and secrets, and no guard{unreadable}"
        );
    }
    if c.triggers.contains(&Trigger::PullRequestTarget) {
        format!(
            "checks out the pull request's code ({how}) under {under} after a maintainer's label: the label approved the commit `github.event.pull_request.head.sha` names, and this can be a later one the author pushed since (time of check to time of use): check out `${{{{ github.event.pull_request.head.sha }}}}`"
        )
    } else {
        format!(
            "checks out the pull request's code ({how}) under {under} after a member asked for it: the author can push between the request and the checkout (time of check to time of use), and nothing in the event names the commit that was looked at: run outsiders' pull requests through the approved-commit pattern (`pull_request_target` on `labeled` only, a label check, a checkout of `github.event.pull_request.head.sha`), or require the pull request's author to be a member too (`github.event.issue.author_association`)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::PrHeadCheckout;
    use crate::workflow::lint::audit::testing::{all_are, findings, lines};

    #[test]
    fn checkout_of_the_head_under_pull_request_target() {
        let f = findings(
            &PrHeadCheckout,
            "on: pull_request_target\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n        with:\n          ref: ${{ github.event.pull_request.head.sha }}\n      - run: make\n",
        );
        all_are(&f, PrHeadCheckout::RULE);
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

    /// SGLang's cancel-pr-workflows-on-close.yml: the head branch as a query field of
    /// `gh api` lists runs, it fetches no code; an endpoint that returns code does.
    #[test]
    fn gh_api_with_the_head_as_a_query_field_fetches_no_code() {
        let job = |run: &str| {
            format!(
                "on:\n  pull_request_target:\n    types: [closed]\njobs:\n  cancel:\n    runs-on: ubuntu-latest\n    steps:\n      - env:\n          HEAD_BRANCH: ${{{{ github.event.pull_request.head.ref }}}}\n        run: |\n          ids=$(gh api -X GET \"repos/$REPO/actions/runs\" \\\n            --paginate \\\n            -f branch=\"$HEAD_BRANCH\" \\\n            --jq '.workflow_runs[].id')\n          {run}\n"
            )
        };
        let f = findings(&PrHeadCheckout, &job("gh run cancel \"$ID\""));
        assert!(f.is_empty(), "{:#?}", lines(&f));
        let f = findings(
            &PrHeadCheckout,
            &job("gh api \"repos/$REPO/tarball/$HEAD_BRANCH\" > src.tgz"),
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert!(f[0].message.contains("`$HEAD_BRANCH`"), "{:#?}", lines(&f));
    }

    /// A member's comment asked for the run; the head is fetched afterwards.
    #[test]
    fn a_members_comment_does_not_vouch_for_a_later_push() {
        let f = findings(
            &PrHeadCheckout,
            "on: issue_comment\njobs:\n  t:\n    if: github.event.comment.author_association == 'MEMBER'\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n        with: {ref: \"refs/pull/${{ github.event.issue.number }}/head\"}\n",
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert!(
            f[0].message
                .contains("under issue_comment after a member asked for it: the author can push between the request and the checkout"),
            "{:#?}",
            lines(&f)
        );
        // The pull request's author a member too: nothing to report.
        let trusted = findings(
            &PrHeadCheckout,
            "on: issue_comment\njobs:\n  t:\n    if: github.event.comment.author_association == 'MEMBER' && github.event.issue.author_association == 'OWNER'\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n        with: {ref: \"refs/pull/${{ github.event.issue.number }}/head\"}\n",
        );
        assert!(trusted.is_empty(), "{:#?}", lines(&trusted));
    }

    /// After a label on `labeled` alone: the event's head sha is the approved commit;
    /// anything that names a moving head is not.
    #[test]
    fn a_label_approves_the_events_head_sha_only() {
        let with = |types: &str, cond: &str, with: &str| {
            findings(
                &PrHeadCheckout,
                &format!(
                    "on:\n  pull_request_target:\n    types: {types}\njobs:\n  t:\n    if: {cond}\n    runs-on: [self-hosted]\n    steps:\n      - uses: actions/checkout@v4\n        with: {with}\n"
                ),
            )
        };
        let label = "github.event.label.name == 'run-gpu'";
        let sha = "{ref: \"${{ github.event.pull_request.head.sha }}\"}";
        assert!(with("[labeled]", label, sha).is_empty());
        let fork_sha = "{repository: \"${{ github.event.pull_request.head.repo.full_name }}\", ref: \"${{ github.event.pull_request.head.sha }}\"}";
        assert!(with("[labeled]", label, fork_sha).is_empty());
        for moving in [
            "{ref: \"${{ github.event.pull_request.head.ref }}\"}",
            "{ref: \"${{ format('refs/{0}/{1}/merge', 'pull', github.event.number) }}\"}",
            "{ref: \"refs/pull/${{ github.event.pull_request.number }}/merge\"}",
            "{ref: \"${{ github.event.pull_request.merge_commit_sha }}\"}",
            "{repository: \"${{ github.event.pull_request.head.repo.full_name }}\"}",
        ] {
            let f = with("[labeled]", label, moving);
            assert_eq!(f.len(), 1, "{moving}: {:#?}", lines(&f));
            assert!(
                f[0].message.contains("after a maintainer's label"),
                "{:#?}",
                lines(&f)
            );
        }
        // With `synchronize` too, the label approves nothing: no guard at all.
        let f = with("[labeled, synchronize]", label, sha);
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert!(f[0].message.contains("and no guard"), "{:#?}", lines(&f));
    }

    /// The ref GitHub's checkout of a classic pwn request builds with format().
    #[test]
    fn a_pull_request_ref_put_together_by_format() {
        let f = findings(
            &PrHeadCheckout,
            "on: pull_request_target\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n        with:\n          ref: ${{ format('refs/{0}/{1}/merge', 'pull', github.event.number) }}\n",
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
        assert!(
            f[0].message.contains("a pull request's ref"),
            "{:#?}",
            lines(&f)
        );
    }

    /// The pull request's changes applied to the base checkout, and a fetch from
    /// github-script's JavaScript.
    #[test]
    fn a_diff_a_patch_and_github_script() {
        for step in [
            "run: gh pr diff ${{ github.event.number }} | git apply",
            "run: curl -L https://github.com/o/r/pull/${{ github.event.number }}.diff | patch -p1",
            "run: wget https://patch-diff.githubusercontent.com/raw/o/r/pull/$PR.patch",
            "{uses: actions/github-script@v7, with: {script: \"await exec.exec('git', ['fetch', 'origin', `pull/${context.issue.number}/head`])\"}}",
        ] {
            let f = findings(
                &PrHeadCheckout,
                &format!(
                    "on: pull_request_target\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - {step}\n"
                ),
            );
            assert_eq!(f.len(), 1, "{step}: {:#?}", lines(&f));
        }
        let base = findings(
            &PrHeadCheckout,
            "on: pull_request_target\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - run: gh pr view ${{ github.event.number }} --json files\n",
        );
        assert!(base.is_empty(), "{:#?}", lines(&base));
    }
}
