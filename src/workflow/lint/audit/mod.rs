//! The rules: what a job may not do when someone outside the project can start it. One
//! rule per file, each an [`Audit`] that says what it is with [`audit_meta!`] (its id,
//! severity, summary and help); [`registry`] lists them, once. A new rule is its file,
//! its `mod` line here and its line in the registry.
//!
//! A rule reads the facts of [`super::facts`] and emits findings about one job; it never
//! reads another rule's findings. [`super::run`] runs every rule on every job and puts
//! the findings in source order.

mod env_file_injection;
mod no_timeout;
mod pr_head_checkout;
pub(crate) mod registry;
mod runner_secret_file;
mod script_injection;
mod secrets_exposed;
mod unchecked_call;
mod unpinned_image;
mod untrusted_artifact;
mod untrusted_self_hosted;
mod wait_past_timeout;
mod write_permissions;

use super::facts::job::{CallFacts, JobFacts};
use super::facts::steps::StepView;
use super::finding::{Finding, StepLabel};
use super::rule::Rule;
use crate::yaml::Mark;

/// Says, in an audit's own file, what its rule is as users see it: its id (kebab-case,
/// printed after each finding), the severity of its findings, a one-line summary and
/// the help SARIF shows. Gives the audit its [`AuditMeta`] and a `RULE` constant.
///
/// ```ignore
/// audit_meta!(
///     NoTimeout,
///     "no-timeout",
///     Severity::Warning,
///     "A self-hosted job without timeout-minutes",
///     "A self-hosted job without timeout-minutes: a hung job holds the runner ..."
/// );
/// ```
macro_rules! audit_meta {
    ($audit:ty, $id:literal, $severity:expr, $summary:literal, $help:literal $(,)?) => {
        impl $audit {
            /// The rule this audit's findings carry.
            pub(crate) const RULE: $crate::workflow::lint::rule::Rule =
                $crate::workflow::lint::rule::Rule::new(&$crate::workflow::lint::rule::RuleMeta {
                    id: $id,
                    severity: $severity,
                    summary: $summary,
                    help: $help,
                });
        }

        impl $crate::workflow::lint::audit::AuditMeta for $audit {
            fn rule(&self) -> $crate::workflow::lint::rule::Rule {
                Self::RULE
            }
        }
    };
}
pub(crate) use audit_meta;

/// What an audit is, as users see it; written with [`audit_meta!`].
pub(crate) trait AuditMeta {
    /// The rule its findings carry.
    fn rule(&self) -> Rule;
}

/// One rule. A rule looks at one job at a time, through the facts gathered for it.
pub(crate) trait Audit: AuditMeta {
    /// Findings about a job that runs steps.
    fn check_job(&self, _job: &JobFacts<'_>, _emit: &mut Emit<'_>) {}

    /// Findings about a job that calls a reusable workflow.
    fn check_call(&self, _call: &CallFacts<'_>, _emit: &mut Emit<'_>) {}
}

/// Where one rule's findings about one job go: the rule, file and job are filled in, so
/// a rule says only where and what.
pub(crate) struct Emit<'o> {
    rule: Rule,
    file: &'o str,
    job: &'o str,
    out: &'o mut Vec<Finding>,
}

impl<'o> Emit<'o> {
    /// Where `rule`'s findings about job `job` of `file` go.
    pub fn new(rule: Rule, file: &'o str, job: &'o str, out: &'o mut Vec<Finding>) -> Emit<'o> {
        Emit {
            rule,
            file,
            job,
            out,
        }
    }

    /// A finding about the job.
    pub fn job(&mut self, mark: Mark, message: String) {
        self.push(mark, None, None, message);
    }

    /// A finding about one of its steps, at `mark` in the step's file (the workflow's,
    /// or the local action's that holds the step).
    pub fn step(&mut self, step: &StepView<'_>, mark: Mark, message: String) {
        self.push(mark, Some(&step.label), step.file(), message);
    }

    fn push(&mut self, mark: Mark, step: Option<&StepLabel>, file: Option<&str>, message: String) {
        self.out.push(Finding {
            severity: self.rule.severity(),
            rule: self.rule,
            file: file.unwrap_or(self.file).to_string(),
            line: mark.line,
            col: mark.col,
            job: Some(self.job.to_string()),
            step: step.cloned(),
            message,
            called_by: Vec::new(),
            called_by_count: 0,
        });
    }
}

/// Running one rule alone, through the same parsing and merging as `workflow lint`.
#[cfg(test)]
pub(crate) mod testing {
    use super::Audit;
    use crate::workflow::lint::facts::scope::Scope;
    use crate::workflow::lint::finding::Finding;
    use crate::workflow::lint::rule::Rule;
    use crate::workflow::lint::run::Linter;

    /// The findings `audit` alone gives on `text` (file `test.yml`); `called` are the
    /// workflows its jobs may call, by file name under `./.github/workflows/`, and other
    /// files of the repository (local actions' `action.yml`), by their path.
    pub fn findings_with(audit: &dyn Audit, text: &str, called: &[(&str, &str)]) -> Vec<Finding> {
        let resolve = |uses: &str| -> Option<(String, String)> {
            let rel = uses.strip_prefix("./")?;
            let name = rel.strip_prefix(".github/workflows/").unwrap_or(rel);
            called
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(n, t)| (n.to_string(), t.to_string()))
        };
        Linter::new(&resolve, &[audit]).lint(&Scope::own("test.yml"), text)
    }

    /// The findings `audit` alone gives on `text`.
    pub fn findings(audit: &dyn Audit, text: &str) -> Vec<Finding> {
        findings_with(audit, text, &[])
    }

    /// `RULE LINE:COL job JOB: MESSAGE` per finding, for assertions that show what was
    /// found when they fail.
    pub fn lines(findings: &[Finding]) -> Vec<String> {
        findings
            .iter()
            .map(|f| {
                format!(
                    "{} {}:{} job {}: {}",
                    f.rule.id(),
                    f.line,
                    f.col,
                    f.job.as_deref().unwrap_or("-"),
                    f.message
                )
            })
            .collect()
    }

    /// Asserts that every finding carries `rule`.
    pub fn all_are(findings: &[Finding], rule: Rule) {
        assert!(
            findings.iter().all(|f| f.rule == rule),
            "{:#?}",
            lines(findings)
        );
    }
}
