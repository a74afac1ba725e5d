//! How `if:` conditions are judged: guards, approvals, and what does not count.

use super::*;
use github_actions_models::common::If;

fn condition(cond: &str, t: Trigger, reach: Reach) -> Condition {
    JobCondition::new(Some(&If::Expr(cond.to_string()))).for_trigger(t, reach)
}

fn guards(cond: &str, t: Trigger) -> bool {
    condition(cond, t, Reach::default()) == Condition::Guards
}

#[test]
fn the_same_repository_guard_must_be_a_conjunct_that_holds() {
    let pr = Trigger::PullRequest;
    let g = "github.event.pull_request.head.repo.full_name == github.repository";
    assert!(guards(g, pr));
    assert!(guards(&format!("${{{{ {g} }}}}"), pr));
    assert!(guards(
        "github.repository == github.event.pull_request.head.repo.full_name && contains(github.event.pull_request.labels.*.name, 'gpu')",
        pr
    ));
    assert!(!guards(&format!("!({g})"), pr));
    assert!(!guards(
        &format!("{g} || github.event_name == 'pull_request'"),
        pr
    ));
    assert!(guards(&format!("{g} || github.event_name == 'push'"), pr));
    assert!(!guards(
        "contains(github.event.pull_request.labels.*.name, 'run-ci')",
        pr
    ));
    assert!(!guards(
        "${{ github.event.pull_request.head.repo.full_name }} == github.repository",
        pr
    ));
    // The field is null for a comment: the guard keeps those runs out too.
    assert!(guards(g, Trigger::IssueComment));
}

#[test]
fn other_guards_by_meaning() {
    let pr = Trigger::PullRequest;
    // A deleted fork's head repository is null: `!null` and `null == false` hold.
    for fork in [
        "!github.event.pull_request.head.repo.fork",
        "github.event.pull_request.head.repo.fork == false",
        "github.event.pull_request.head.repo.fork != true",
    ] {
        assert!(!guards(fork, pr), "{fork}");
    }
    for same in [
        "github.event.pull_request.head.repo.full_name == github.event.repository.full_name",
        "github.event.pull_request.head.repo.id == github.event.pull_request.base.repo.id",
        "github.event.pull_request.head.repo.owner.login == github.repository_owner",
    ] {
        assert!(guards(same, pr), "{same}");
    }
    assert!(!guards(
        "github.event.pull_request.base.repo.full_name == github.repository",
        pr
    ));
    // For a comment both sides are null, and null == null.
    let both = "github.event.pull_request.head.repo.full_name == github.event.pull_request.base.repo.full_name";
    assert!(guards(both, pr));
    assert!(!guards(both, Trigger::IssueComment));
    assert!(guards(
        "github.event.pull_request.head.repo.full_name == github.repository",
        Trigger::IssueComment
    ));
    // Who vouches: the commenter for a comment, the author for a pull request; a
    // member's review, or a member's issue commented on by a stranger, does not.
    let t = |c: &str, t: Trigger| guards(c, t);
    assert!(!t(
        "github.event.review.author_association == 'MEMBER'",
        Trigger::PullRequestReview
    ));
    assert!(t(
        "github.event.pull_request.author_association == 'MEMBER'",
        Trigger::PullRequestReview
    ));
    assert!(!t(
        "github.event.issue.author_association == 'MEMBER'",
        Trigger::IssueComment
    ));
    assert!(t(
        "github.event.issue.author_association == 'MEMBER'",
        Trigger::Issues
    ));
    // A field the event lacks is null: never equal, so the job never runs for it.
    assert!(t("github.event.comment.author_association == 'MEMBER'", pr));
    assert!(guards(
        "github.event.action == 'closed' && github.event.pull_request.merged == true",
        Trigger::PullRequestTarget
    ));
    assert!(guards("github.event.pull_request.merged", pr));
    assert!(guards("github.event_name == 'push'", pr));
    assert!(guards("github.event_name != 'pull_request'", pr));
    assert!(!guards("github.event_name != 'push'", pr));
    assert!(!guards(
        "startsWith(github.event.comment.body, '/run')",
        Trigger::IssueComment
    ));
    assert!(guards(
        "github.event.workflow_run.event == 'push'",
        Trigger::WorkflowRun
    ));
    assert!(!guards(
        "github.event.workflow_run.event == 'pull_request'",
        Trigger::WorkflowRun
    ));
    assert!(guards(
        "github.event.workflow_run.head_repository.full_name == github.repository",
        Trigger::WorkflowRun
    ));
    assert!(guards("false", pr));
}

/// A member's comment asks for a run of a pull request whose author may be anyone:
/// approved, not trusted; the pull request's author being a member too trusts it.
#[test]
fn a_members_comment_approves_and_the_authors_association_trusts() {
    let ic = Trigger::IssueComment;
    let c = |s: &str| condition(s, ic, Reach::default());
    let member =
        "contains(fromJSON('[\"OWNER\", \"MEMBER\"]'), github.event.comment.author_association)";
    assert_eq!(c(member), Condition::Approved);
    assert_eq!(
        c(
            "github.event.comment.author_association == 'MEMBER' && startsWith(github.event.comment.body, '/run')"
        ),
        Condition::Approved
    );
    assert_eq!(
        c("contains(fromJSON('[\"OWNER\", \"NONE\"]'), github.event.comment.author_association)"),
        Condition::Open
    );
    let author = "github.event.issue.author_association == 'MEMBER'";
    assert_eq!(c(author), Condition::Open);
    assert_eq!(c(&format!("{member} && {author}")), Condition::Guards);
    assert_eq!(c(&format!("{member} || {author}")), Condition::Open);
    // Under a pull-request event the author's association is who and what at once.
    assert_eq!(
        condition(
            "github.event.pull_request.author_association == 'OWNER'",
            Trigger::PullRequestTarget,
            Reach::default()
        ),
        Condition::Guards
    );
}

/// A label on `pull_request_target` approves only when the workflow runs on
/// `labeled` alone, and only the label just put on; never for `pull_request` (the
/// fork's own workflow file runs). A label that is merely on the pull request does not:
/// the next `labeled` event (another label, a bot's after a push) would run a head
/// nobody approved.
#[test]
fn a_label_approves_pull_request_target_on_labeled_only() {
    let prt = Trigger::PullRequestTarget;
    let labeled = Reach {
        labels_approve: true,
    };
    let on = "github.event.label.name == 'run-gpu'";
    let has = "contains(github.event.pull_request.labels.*.name, 'run-gpu')";
    for cond in [on, &format!("{on} && github.event.action == 'labeled'")] {
        assert_eq!(condition(cond, prt, labeled), Condition::Approved, "{cond}");
        assert_eq!(
            condition(cond, prt, Reach::default()),
            Condition::Open,
            "{cond}"
        );
        assert_eq!(
            condition(cond, Trigger::PullRequest, labeled),
            Condition::Open,
            "{cond}"
        );
    }
    for weak in [
        has,
        "github.event.label.name != 'run-gpu'",
        "!contains(github.event.pull_request.labels.*.name, 'run-gpu')",
        "github.event.label.name == 'run-gpu' || github.event.action == 'synchronize'",
        "contains(github.event.pull_request.labels.*.name, github.event.pull_request.title)",
    ] {
        assert_eq!(condition(weak, prt, labeled), Condition::Open, "{weak}");
    }
    // A same-repository guard beside it still trusts.
    assert_eq!(
        condition(
            &format!("{on} && github.event.pull_request.head.repo.full_name == github.repository"),
            prt,
            labeled
        ),
        Condition::Guards
    );
}

#[test]
fn the_reach_of_a_workflows_triggers() {
    let reach = |on: &str| {
        let w: github_actions_models::workflow::Workflow = serde_yaml_on(on);
        Reach::of(&w.on.events).labels_approve
    };
    assert!(reach("pull_request_target: {types: [labeled]}"));
    assert!(reach("pull_request_target: {types: labeled}"));
    assert!(!reach(
        "pull_request_target: {types: [labeled, synchronize]}"
    ));
    assert!(!reach("pull_request_target: {types: [opened]}"));
    assert!(!reach("pull_request_target:"));
    assert!(!reach("[pull_request_target]"));
}

fn serde_yaml_on(on: &str) -> github_actions_models::workflow::Workflow {
    let text = format!("on:\n  {on}\njobs: {{}}\n");
    let text = if on.starts_with('[') {
        format!("on: {on}\njobs: {{}}\n")
    } else {
        text
    };
    let node = crate::yaml::parse(&text).unwrap().unwrap();
    serde_json::from_value(node.to_json()).unwrap()
}

#[test]
fn status_functions_override_needs() {
    let c = |s: &str| JobCondition::new(Some(&If::Expr(s.to_string())));
    assert!(c("always()").overrides_needs());
    assert!(c("${{ !cancelled() && x }}").overrides_needs());
    assert!(c("success() || needs.guard.result == 'skipped'").overrides_needs());
    assert!(!c("success() && x").overrides_needs());
    assert!(!c("x == 'y'").overrides_needs());
    assert!(c("${{ a }} || b").unreadable.is_some());
    assert!(c("${{ a == b }}\n").unreadable.is_some());
    assert!(
        c("a &&")
            .unreadable
            .unwrap()
            .contains("not a valid expression")
    );
}
