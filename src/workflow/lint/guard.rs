//! Which events let someone outside the project start a job, and whether a job's `if:`
//! keeps them out, decided from the parsed expression rather than its text.

use github_actions_expressions::{
    Expr, SpannedExpr,
    call::{Call, Function},
    literal::Literal,
    op::{BinExpr, BinOp, UnOp},
};
use github_actions_models::workflow::event::Events;

use super::expr;

/// An event that someone without write access can cause: a fork's pull request, a
/// comment, an issue, a run of another workflow made by a fork's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    PullRequest,
    PullRequestReview,
    PullRequestReviewComment,
    PullRequestTarget,
    IssueComment,
    Issues,
    WorkflowRun,
    Discussion,
    DiscussionComment,
}

impl Trigger {
    pub const ALL: [Trigger; 9] = [
        Trigger::PullRequest,
        Trigger::PullRequestReview,
        Trigger::PullRequestReviewComment,
        Trigger::PullRequestTarget,
        Trigger::IssueComment,
        Trigger::Issues,
        Trigger::WorkflowRun,
        Trigger::Discussion,
        Trigger::DiscussionComment,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Trigger::PullRequest => "pull_request",
            Trigger::PullRequestReview => "pull_request_review",
            Trigger::PullRequestReviewComment => "pull_request_review_comment",
            Trigger::PullRequestTarget => "pull_request_target",
            Trigger::IssueComment => "issue_comment",
            Trigger::Issues => "issues",
            Trigger::WorkflowRun => "workflow_run",
            Trigger::Discussion => "discussion",
            Trigger::DiscussionComment => "discussion_comment",
        }
    }

    /// Runs with the base repository's token and secrets, whoever caused it. The
    /// pull-request events of a fork run with a read-only token and no secrets.
    pub fn privileged(self) -> bool {
        !matches!(
            self,
            Trigger::PullRequest | Trigger::PullRequestReview | Trigger::PullRequestReviewComment
        )
    }

    /// Carries `github.event.pull_request` (so its head repository can be tested).
    fn has_pull_request(self) -> bool {
        matches!(
            self,
            Trigger::PullRequest
                | Trigger::PullRequestReview
                | Trigger::PullRequestReviewComment
                | Trigger::PullRequestTarget
        )
    }

    /// The untrusted events a workflow's `on:` lists.
    pub fn of(events: &Events) -> Vec<Trigger> {
        let on = |t: Trigger| match t {
            Trigger::PullRequest => events.pull_request.is_present(),
            Trigger::PullRequestReview => events.pull_request_review.is_present(),
            Trigger::PullRequestReviewComment => events.pull_request_review_comment.is_present(),
            Trigger::PullRequestTarget => events.pull_request_target.is_present(),
            Trigger::IssueComment => events.issue_comment.is_present(),
            Trigger::Issues => events.issues.is_present(),
            Trigger::WorkflowRun => events.workflow_run.is_present(),
            Trigger::Discussion => events.discussion.is_present(),
            Trigger::DiscussionComment => events.discussion_comment.is_present(),
        };
        Trigger::ALL.into_iter().filter(|t| on(*t)).collect()
    }
}

/// What a job's own `if:` says about one trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// The job cannot run for this trigger unless the code or the person is trusted.
    Guards,
    /// It can, as far as the expression shows.
    Open,
}

/// A parsed `if:` (absent means `success()`).
pub struct JobCondition {
    /// The expression source (without `${{ }}`), or `None` when there is no `if:` or it
    /// is a constant.
    source: Option<String>,
    constant: Option<bool>,
    /// The `if:` could not be read as one expression: it counts as always true.
    pub unreadable: bool,
}

impl JobCondition {
    pub fn new(cond: Option<&github_actions_models::common::If>) -> JobCondition {
        use github_actions_models::common::If;
        match cond {
            None => JobCondition {
                source: None,
                constant: None,
                unreadable: false,
            },
            Some(If::Bool(b)) => JobCondition {
                source: None,
                constant: Some(*b),
                unreadable: false,
            },
            Some(If::Expr(text)) => match expr::condition_body(text) {
                Some(body) if Expr::parse(body).is_ok() => JobCondition {
                    source: Some(body.to_string()),
                    constant: None,
                    unreadable: false,
                },
                _ => JobCondition {
                    source: None,
                    constant: Some(true),
                    unreadable: true,
                },
            },
        }
    }

    /// Whether the condition keeps `trigger`'s untrusted runs out.
    pub fn for_trigger(&self, trigger: Trigger) -> Condition {
        if self.constant == Some(false) {
            return Condition::Guards;
        }
        let Some(src) = &self.source else {
            return Condition::Open;
        };
        match Expr::parse(src) {
            Ok(e) if only_if_trusted(&e, false, trigger) => Condition::Guards,
            _ => Condition::Open,
        }
    }

    /// Whether the job runs even when a job it needs was skipped: a status function
    /// other than `success()` replaces the implied `success() &&`.
    pub fn overrides_needs(&self) -> bool {
        let Some(src) = &self.source else {
            return false;
        };
        Expr::parse(src).is_ok_and(|e| uses_status_override(&e))
    }
}

fn uses_status_override(e: &SpannedExpr<'_>) -> bool {
    match &e.inner {
        Expr::Call(Call { func, args }) => {
            matches!(
                func,
                Function::Always | Function::Failure | Function::Cancelled
            ) || args.iter().any(uses_status_override)
        }
        Expr::BinExpr(BinExpr { lhs, rhs, .. }) => {
            uses_status_override(lhs) || uses_status_override(rhs)
        }
        Expr::UnExpr { expr, .. } => uses_status_override(expr),
        Expr::Index(i) => uses_status_override(i),
        Expr::Context(c) => c.parts.iter().any(uses_status_override),
        _ => false,
    }
}

const SAME_REPO: [&str; 2] = [
    "github.event.pull_request.head.repo.full_name",
    "github.event.workflow_run.head_repository.full_name",
];
const TRUSTED_ROLES: [&str; 3] = ["OWNER", "MEMBER", "COLLABORATOR"];

/// Whether `e` (negated when `negated`) can only be true when `trigger`'s run is not
/// driven by an outsider. Negation is pushed down (De Morgan), so a guard counts only as
/// a conjunct that has to hold: `guard && x` counts, `guard || x` only if `x` counts too,
/// `!(guard)` does not.
fn only_if_trusted(e: &SpannedExpr<'_>, negated: bool, trigger: Trigger) -> bool {
    match &e.inner {
        Expr::BinExpr(BinExpr { lhs, op, rhs }) => match (op, negated) {
            (BinOp::And, false) | (BinOp::Or, true) => {
                only_if_trusted(lhs, negated, trigger) || only_if_trusted(rhs, negated, trigger)
            }
            (BinOp::Or, false) | (BinOp::And, true) => {
                only_if_trusted(lhs, negated, trigger) && only_if_trusted(rhs, negated, trigger)
            }
            (BinOp::Eq, _) => comparison(lhs, rhs, !negated, trigger),
            (BinOp::Neq, _) => comparison(lhs, rhs, negated, trigger),
            _ => false,
        },
        Expr::UnExpr {
            op: UnOp::Not,
            expr,
        } => only_if_trusted(expr, !negated, trigger),
        // `if: false`, or `!true`: the job never runs.
        Expr::Literal(Literal::Boolean(b)) => *b == negated,
        Expr::Literal(Literal::Null) => !negated,
        Expr::Context(_) => {
            let Some(p) = expr::context_path(&e.inner) else {
                return false;
            };
            if negated {
                // `!github.event.pull_request.head.repo.fork`
                trigger.has_pull_request() && p == "github.event.pull_request.head.repo.fork"
                    || trigger == Trigger::WorkflowRun
                        && p == "github.event.workflow_run.head_repository.fork"
            } else {
                // A merged pull request's code was accepted by a maintainer.
                p == "github.event.pull_request.merged"
            }
        }
        Expr::Call(Call {
            func: Function::Contains,
            args,
        }) if !negated && args.len() == 2 => {
            // `contains(fromJSON('["OWNER","MEMBER"]'), github.event.comment.author_association)`
            let needle_is_role = expr::context_path(&args[1].inner)
                .is_some_and(|p| expr::under(&p, "github.event.*.author_association"));
            needle_is_role && literal_roles(&args[0]).is_some_and(|r| !r.is_empty())
        }
        _ => false,
    }
}

/// The roles a `fromJSON('[…]')` literal lists, if all are trusted ones.
fn literal_roles(e: &SpannedExpr<'_>) -> Option<Vec<String>> {
    let Expr::Call(Call {
        func: Function::FromJSON,
        args,
    }) = &e.inner
    else {
        return None;
    };
    let [arg] = args.as_slice() else { return None };
    let Expr::Literal(Literal::String(text)) = &arg.inner else {
        return None;
    };
    let roles: Vec<String> = serde_json::from_str(text).ok()?;
    roles
        .iter()
        .all(|r| TRUSTED_ROLES.iter().any(|t| t.eq_ignore_ascii_case(r)))
        .then_some(roles)
}

fn string_literal<'a>(e: &'a SpannedExpr<'_>) -> Option<&'a str> {
    match &e.inner {
        Expr::Literal(Literal::String(s)) => Some(s),
        _ => None,
    }
}

/// A comparison that must hold (`equal`: `==`, else `!=`).
fn comparison(a: &SpannedExpr<'_>, b: &SpannedExpr<'_>, equal: bool, trigger: Trigger) -> bool {
    let (pa, pb) = (expr::context_path(&a.inner), expr::context_path(&b.inner));
    let sides = [(pa.as_deref(), b), (pb.as_deref(), a)];
    for (path, other) in sides {
        let Some(path) = path else { continue };
        let other_path = expr::context_path(&other.inner);
        let other_lit = string_literal(other);
        let other_bool = match &other.inner {
            Expr::Literal(Literal::Boolean(v)) => Some(*v),
            _ => None,
        };
        // The head repository is the base repository. Where the event has no such field
        // the left side is null and never equal, so this keeps every trigger out.
        if equal && SAME_REPO.contains(&path) && other_path.as_deref() == Some("github.repository")
        {
            return true;
        }
        // `head.repo.fork == false` / `!= true`. Only for the events that have the field:
        // elsewhere it is null, and null == false in GitHub's loose equality.
        let fork = trigger.has_pull_request() && path == "github.event.pull_request.head.repo.fork"
            || trigger == Trigger::WorkflowRun
                && path == "github.event.workflow_run.head_repository.fork";
        if fork && other_bool == Some(!equal) {
            return true;
        }
        if path == "github.event.pull_request.merged" && other_bool == Some(equal) {
            return true;
        }
        if path == "github.event_name"
            && let Some(lit) = other_lit
        {
            let is_this = lit.eq_ignore_ascii_case(trigger.name());
            // `event_name == 'push'` keeps this trigger out; so does `!= 'this'`.
            return if equal { !is_this } else { is_this };
        }
        if equal
            && path == "github.event.workflow_run.event"
            && let Some(lit) = other_lit
            && (trigger != Trigger::WorkflowRun
                || !Trigger::ALL
                    .iter()
                    .any(|t| t.name().eq_ignore_ascii_case(lit)))
        {
            return true;
        }
        if equal
            && expr::under(path, "github.event.*.author_association")
            && path.split('.').count() == 4
            && other_lit.is_some_and(|l| TRUSTED_ROLES.iter().any(|r| r.eq_ignore_ascii_case(l)))
        {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use github_actions_models::common::If;

    fn guards(cond: &str, t: Trigger) -> bool {
        JobCondition::new(Some(&If::Expr(cond.to_string()))).for_trigger(t) == Condition::Guards
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
        assert!(guards("!github.event.pull_request.head.repo.fork", pr));
        assert!(guards(
            "github.event.pull_request.head.repo.fork == false",
            pr
        ));
        assert!(guards(
            "github.event.pull_request.head.repo.fork != true",
            pr
        ));
        assert!(!guards("github.event.pull_request.head.repo.fork", pr));
        assert!(!guards(
            "github.event.pull_request.head.repo.fork == false",
            Trigger::IssueComment
        ));
        assert!(guards(
            "github.event.action == 'closed' && github.event.pull_request.merged == true",
            Trigger::PullRequestTarget
        ));
        assert!(guards("github.event.pull_request.merged", pr));
        assert!(guards("github.event_name == 'push'", pr));
        assert!(guards("github.event_name != 'pull_request'", pr));
        assert!(!guards("github.event_name != 'push'", pr));
        assert!(guards(
            "contains(fromJSON('[\"OWNER\", \"MEMBER\"]'), github.event.comment.author_association)",
            Trigger::IssueComment
        ));
        assert!(!guards(
            "contains(fromJSON('[\"OWNER\", \"NONE\"]'), github.event.comment.author_association)",
            Trigger::IssueComment
        ));
        assert!(guards(
            "github.event.comment.author_association == 'MEMBER' && startsWith(github.event.comment.body, '/run')",
            Trigger::IssueComment
        ));
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

    #[test]
    fn status_functions_override_needs() {
        let c = |s: &str| JobCondition::new(Some(&If::Expr(s.to_string())));
        assert!(c("always()").overrides_needs());
        assert!(c("${{ !cancelled() && x }}").overrides_needs());
        assert!(!c("success() && x").overrides_needs());
        assert!(c("${{ a }} || b").unreadable);
    }
}
