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
/// comment, an issue, a run of another workflow made by a fork's code, a star, a fork, a
/// wiki edit, a status or check reported on a fork's commit by a CI app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    Fork,
    Watch,
    Gollum,
    Status,
    CheckRun,
    CheckSuite,
}

impl Trigger {
    pub const ALL: [Trigger; 15] = [
        Trigger::PullRequest,
        Trigger::PullRequestReview,
        Trigger::PullRequestReviewComment,
        Trigger::PullRequestTarget,
        Trigger::IssueComment,
        Trigger::Issues,
        Trigger::WorkflowRun,
        Trigger::Discussion,
        Trigger::DiscussionComment,
        Trigger::Fork,
        Trigger::Watch,
        Trigger::Gollum,
        Trigger::Status,
        Trigger::CheckRun,
        Trigger::CheckSuite,
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
            Trigger::Fork => "fork",
            Trigger::Watch => "watch",
            Trigger::Gollum => "gollum",
            Trigger::Status => "status",
            Trigger::CheckRun => "check_run",
            Trigger::CheckSuite => "check_suite",
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

    /// Whether the event's payload has `github.event.<root>` (`pull_request`, `comment`,
    /// …). Where it has not, a comparison of one of its fields with a string is false.
    fn has(self, root: &str) -> bool {
        use Trigger::*;
        match root {
            "pull_request" => matches!(
                self,
                PullRequest | PullRequestReview | PullRequestReviewComment | PullRequestTarget
            ),
            "comment" => matches!(
                self,
                IssueComment | DiscussionComment | PullRequestReviewComment
            ),
            "review" => self == PullRequestReview,
            "issue" => matches!(self, Issues | IssueComment),
            "discussion" => matches!(self, Discussion | DiscussionComment),
            "workflow_run" => self == WorkflowRun,
            "check_run" => self == CheckRun,
            "check_suite" => self == CheckSuite,
            "repository" => true,
            // Fields we do not know: assume present (fail closed).
            _ => true,
        }
    }

    /// The `author_association` that says who is behind this event's code or request:
    /// the commenter who asked for a run, the pull request's author (not a reviewer:
    /// a member's review of a fork's pull request does not vouch for its code).
    fn vouching_field(self) -> Option<&'static str> {
        use Trigger::*;
        match self {
            PullRequest | PullRequestReview | PullRequestReviewComment | PullRequestTarget => {
                Some("github.event.pull_request.author_association")
            }
            IssueComment | DiscussionComment => Some("github.event.comment.author_association"),
            Issues => Some("github.event.issue.author_association"),
            Discussion => Some("github.event.discussion.author_association"),
            WorkflowRun | Fork | Watch | Gollum | Status | CheckRun | CheckSuite => None,
        }
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
            Trigger::Fork => events.fork.is_present(),
            Trigger::Watch => events.watch.is_present(),
            Trigger::Gollum => events.gollum.is_present(),
            Trigger::Status => events.status.is_present(),
            Trigger::CheckRun => events.check_run.is_present(),
            Trigger::CheckSuite => events.check_suite.is_present(),
        };
        Trigger::ALL.into_iter().filter(|t| on(*t)).collect()
    }
}

/// What a job's own `if:` says about one trigger, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Condition {
    /// It can run for an outsider, as far as the expression shows.
    Open,
    /// It runs only when a trusted person asked for it (a member's comment, a
    /// maintainer's label on `pull_request_target`), but on code an outsider wrote: what
    /// was vouched for is the pull request at that moment, not whatever its head is when
    /// the job fetches it.
    Approved,
    /// It cannot run for this trigger unless the code and the person are trusted.
    Guards,
}

/// What a condition vouches for: who started the run, and who wrote the code it is
/// about. `a && b` vouches for what either side does; `a || b` for what both do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Vouch {
    starter: bool,
    code: bool,
}

impl Vouch {
    const NONE: Vouch = Vouch {
        starter: false,
        code: false,
    };
    const BOTH: Vouch = Vouch {
        starter: true,
        code: true,
    };
    const STARTER: Vouch = Vouch {
        starter: true,
        code: false,
    };
    const CODE: Vouch = Vouch {
        starter: false,
        code: true,
    };

    fn and(self, o: Vouch) -> Vouch {
        Vouch {
            starter: self.starter || o.starter,
            code: self.code || o.code,
        }
    }

    fn or(self, o: Vouch) -> Vouch {
        Vouch {
            starter: self.starter && o.starter,
            code: self.code && o.code,
        }
    }

    fn condition(self) -> Condition {
        match (self.starter, self.code) {
            (true, true) => Condition::Guards,
            (true, false) => Condition::Approved,
            _ => Condition::Open,
        }
    }
}

/// What the workflow's triggers say beyond their names: whether its
/// `pull_request_target` runs only on `labeled`, so that a label check is a
/// maintainer's approval of the pull request's head at that moment (who may label is
/// the repository's triage role). With other types (`synchronize`, `opened`, the
/// defaults) a label already on the pull request lets every new push run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Reach {
    pub labels_approve: bool,
}

impl Reach {
    /// The reach of a workflow's own `on:`.
    pub fn of(events: &Events) -> Reach {
        use github_actions_models::workflow::event::OptionalBody;
        let labels_approve = match &events.pull_request_target {
            OptionalBody::Body(b) => !b.types.is_empty() && b.types.iter().all(|t| t == "labeled"),
            _ => false,
        };
        Reach { labels_approve }
    }
}

/// A parsed `if:` (absent means `success()`).
pub struct JobCondition {
    /// The expression source (without `${{ }}`), or `None` when there is no `if:` or it
    /// is a constant.
    source: Option<String>,
    constant: Option<bool>,
    /// Why the `if:` counts as always true although it is there, for messages.
    pub unreadable: Option<String>,
}

impl JobCondition {
    pub fn new(cond: Option<&github_actions_models::common::If>) -> JobCondition {
        use github_actions_models::common::If;
        let constant = |b: bool, why: Option<String>| JobCondition {
            source: None,
            constant: Some(b),
            unreadable: why,
        };
        match cond {
            None => JobCondition {
                source: None,
                constant: None,
                unreadable: None,
            },
            Some(If::Bool(b)) => constant(*b, None),
            Some(If::Expr(text)) => match expr::condition_body(text) {
                None => constant(
                    true,
                    Some("its `if:` holds text besides one `${{ }}` (a `|` block adds a newline), which makes it a string: always true".into()),
                ),
                Some(body) => match expr::parse(body) {
                    Ok(_) => JobCondition {
                        source: Some(body.to_string()),
                        constant: None,
                        unreadable: None,
                    },
                    Err(expr::Unparsed::TooLong) => constant(
                        true,
                        Some(format!("its `if:` is longer than {} bytes, not checked", expr::MAX_EXPRESSION_BYTES)),
                    ),
                    Err(expr::Unparsed::Invalid(e)) => constant(
                        true,
                        Some(format!("its `if:` is not a valid expression ({e})")),
                    ),
                },
            },
        }
    }

    /// Whether the condition keeps `trigger`'s untrusted runs out, or lets in only those
    /// a trusted person asked for.
    pub fn for_trigger(&self, trigger: Trigger, reach: Reach) -> Condition {
        if self.constant == Some(false) {
            return Condition::Guards;
        }
        let Some(src) = &self.source else {
            return Condition::Open;
        };
        match expr::parse(src) {
            Ok(e) => vouch(&e, false, trigger, reach).condition(),
            Err(_) => Condition::Open,
        }
    }

    /// Whether the job may run when a job it needs was skipped. Any status function
    /// (`success()` too) replaces the implied `success() &&`; only a `success()` that
    /// must hold keeps the needed jobs' guard (`success() || x` does not).
    pub fn overrides_needs(&self) -> bool {
        let Some(src) = &self.source else {
            return false;
        };
        match expr::parse(src) {
            Ok(e) => uses_status_function(&e) && !requires_success(&e),
            Err(_) => true,
        }
    }
}

fn uses_status_function(e: &SpannedExpr<'_>) -> bool {
    match &e.inner {
        Expr::Call(Call { func, args }) => {
            matches!(
                func,
                Function::Always | Function::Failure | Function::Cancelled | Function::Success
            ) || args.iter().any(uses_status_function)
        }
        Expr::BinExpr(BinExpr { lhs, rhs, .. }) => {
            uses_status_function(lhs) || uses_status_function(rhs)
        }
        Expr::UnExpr { expr, .. } => uses_status_function(expr),
        Expr::Index(i) => uses_status_function(i),
        Expr::Context(c) => c.parts.iter().any(uses_status_function),
        _ => false,
    }
}

/// `success()` as a conjunct that has to hold.
fn requires_success(e: &SpannedExpr<'_>) -> bool {
    match &e.inner {
        Expr::Call(Call {
            func: Function::Success,
            ..
        }) => true,
        Expr::BinExpr(BinExpr {
            lhs,
            op: BinOp::And,
            rhs,
        }) => requires_success(lhs) || requires_success(rhs),
        Expr::BinExpr(BinExpr {
            lhs,
            op: BinOp::Or,
            rhs,
        }) => requires_success(lhs) && requires_success(rhs),
        _ => false,
    }
}

/// Pairs whose equality means the pull request's head repository is the base one. A
/// fork cannot live under the same owner as its parent, so equal owners count too.
/// (`head.repo.fork` does not: a deleted fork's `head.repo` is null, and `!null`, like
/// `null == false`, is true.)
const SAME_REPO: &[(&str, &[&str])] = &[
    (
        "github.event.pull_request.head.repo.full_name",
        &[
            "github.repository",
            "github.event.repository.full_name",
            "github.event.pull_request.base.repo.full_name",
        ],
    ),
    (
        "github.event.pull_request.head.repo.id",
        &[
            "github.repository_id",
            "github.event.repository.id",
            "github.event.pull_request.base.repo.id",
        ],
    ),
    (
        "github.event.pull_request.head.repo.owner.login",
        &["github.repository_owner"],
    ),
    (
        "github.event.workflow_run.head_repository.full_name",
        &["github.repository", "github.event.repository.full_name"],
    ),
];
const TRUSTED_ROLES: [&str; 3] = ["OWNER", "MEMBER", "COLLABORATOR"];

/// The `github.event.<root>` of a path, when it is one.
fn event_root(path: &str) -> Option<&str> {
    path.strip_prefix("github.event.")?.split('.').next()
}

/// What `e` (negated when `negated`) vouches for when it is true for a run of
/// `trigger`. Negation is pushed down (De Morgan), so a guard counts only as a conjunct
/// that has to hold: `guard && x` counts, `guard || x` only if `x` counts too,
/// `!(guard)` does not.
fn vouch(e: &SpannedExpr<'_>, negated: bool, trigger: Trigger, reach: Reach) -> Vouch {
    match &e.inner {
        Expr::BinExpr(BinExpr { lhs, op, rhs }) => match (op, negated) {
            (BinOp::And, false) | (BinOp::Or, true) => {
                vouch(lhs, negated, trigger, reach).and(vouch(rhs, negated, trigger, reach))
            }
            (BinOp::Or, false) | (BinOp::And, true) => {
                vouch(lhs, negated, trigger, reach).or(vouch(rhs, negated, trigger, reach))
            }
            (BinOp::Eq, _) => comparison(lhs, rhs, !negated, trigger, reach),
            (BinOp::Neq, _) => comparison(lhs, rhs, negated, trigger, reach),
            _ => Vouch::NONE,
        },
        Expr::UnExpr {
            op: UnOp::Not,
            expr,
        } => vouch(expr, !negated, trigger, reach),
        // `if: false`, or `!true`: the job never runs.
        Expr::Literal(Literal::Boolean(b)) if *b == negated => Vouch::BOTH,
        Expr::Literal(Literal::Null) if !negated => Vouch::BOTH,
        // A merged pull request's code was accepted by a maintainer (and the field is
        // null, so false, for events without a pull request).
        Expr::Context(_)
            if !negated
                && expr::context_path(&e.inner).as_deref()
                    == Some("github.event.pull_request.merged") =>
        {
            Vouch::BOTH
        }
        Expr::Call(Call {
            func: Function::Contains,
            args,
        }) if !negated && args.len() == 2 => {
            // `contains(fromJSON('["OWNER","MEMBER"]'), github.event.comment.author_association)`
            let by_role = match expr::context_path(&args[1].inner) {
                Some(p) if literal_roles(&args[0]).is_some_and(|r| !r.is_empty()) => {
                    vouches_for(&p, trigger)
                }
                _ => Vouch::NONE,
            };
            // `contains(github.event.pull_request.labels.*.name, 'run-gpu')` approves
            // nothing: once the label is on, any later `labeled` event (another label,
            // put on by a person or by a bot after a push) runs whatever head the pull
            // request has then, which nobody approved.
            by_role
        }
        _ => Vouch::NONE,
    }
}

/// Whether a label check approves `trigger`'s run (see [`Reach`]).
fn label_approves(trigger: Trigger, reach: Reach) -> bool {
    trigger == Trigger::PullRequestTarget && reach.labels_approve
}

/// What a trusted `author_association` in this field vouches for in `trigger`'s runs:
/// the field that names who is behind them (the pull request's author for pull-request
/// events: both who and what; for a comment on a pull request, the commenter asked for
/// the run but the pull request's author wrote the code), or, where the payload has no
/// such field, everything (null never equals a role).
fn vouches_for(path: &str, trigger: Trigger) -> Vouch {
    if !expr::under(path, "github.event.*.author_association") || path.split('.').count() != 4 {
        return Vouch::NONE;
    }
    if event_root(path).is_some_and(|r| !trigger.has(r)) {
        return Vouch::BOTH;
    }
    match (trigger, path) {
        (Trigger::IssueComment, "github.event.comment.author_association") => Vouch::STARTER,
        (Trigger::IssueComment, "github.event.issue.author_association") => Vouch::CODE,
        _ if trigger.vouching_field() == Some(path) => Vouch::BOTH,
        _ => Vouch::NONE,
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

/// What a comparison that must hold vouches for (`equal`: `==`, else `!=`).
fn comparison(
    a: &SpannedExpr<'_>,
    b: &SpannedExpr<'_>,
    equal: bool,
    trigger: Trigger,
    reach: Reach,
) -> Vouch {
    let (pa, pb) = (expr::context_path(&a.inner), expr::context_path(&b.inner));
    let sides = [
        (pa.as_deref(), b, pb.as_deref()),
        (pb.as_deref(), a, pa.as_deref()),
    ];
    let mut out = Vouch::NONE;
    for (path, other, other_path) in sides {
        let Some(path) = path else { continue };
        let other_lit = string_literal(other);
        let other_bool = match &other.inner {
            Expr::Literal(Literal::Boolean(v)) => Some(*v),
            _ => None,
        };
        // The head repository is the base repository. Where the event has no head
        // field, the head side is null: against a value that is always there
        // (`github.repository`) it is never equal, which keeps the trigger out; against a
        // base field of the same missing object it is null == null, true.
        if equal
            && let Some(other_path) = other_path
            && let Some((_, bases)) = SAME_REPO.iter().find(|(head, _)| *head == path)
            && bases.contains(&other_path)
            && event_root(other_path).is_none_or(|r| trigger.has(r))
        {
            return Vouch::BOTH;
        }
        if path == "github.event.pull_request.merged" && other_bool == Some(equal) {
            return Vouch::BOTH;
        }
        if path == "github.event_name"
            && let Some(lit) = other_lit
        {
            let is_this = lit.eq_ignore_ascii_case(trigger.name());
            // `event_name == 'push'` keeps this trigger out; so does `!= 'this'`.
            let excluded = if equal { !is_this } else { is_this };
            return if excluded { Vouch::BOTH } else { Vouch::NONE };
        }
        if equal
            && path == "github.event.workflow_run.event"
            && let Some(lit) = other_lit
            && (trigger != Trigger::WorkflowRun
                || !Trigger::ALL
                    .iter()
                    .any(|t| t.name().eq_ignore_ascii_case(lit)))
        {
            return Vouch::BOTH;
        }
        if equal
            && other_lit.is_some_and(|l| TRUSTED_ROLES.iter().any(|r| r.eq_ignore_ascii_case(l)))
        {
            out = out.and(vouches_for(path, trigger));
        }
        // `github.event.label.name == 'run-gpu'`: the label just added.
        if equal
            && path == "github.event.label.name"
            && other_lit.is_some()
            && label_approves(trigger, reach)
        {
            out = out.and(Vouch::STARTER);
        }
    }
    out
}

#[cfg(test)]
mod tests;
