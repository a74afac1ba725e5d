//! The rules: what a job may not do when someone outside the project can start it. One
//! rule per file, each an [`Audit`]; [`registry`] lists them in the order they run.
//!
//! A rule reads the facts of [`super::facts`] and emits findings about one job; it never
//! reads another rule's findings. [`check`] runs every rule on every job and puts the
//! findings in source order.

mod env_file_injection;
mod no_timeout;
mod pr_head_checkout;
pub(crate) mod registry;
mod script_injection;
mod secrets_exposed;
mod unchecked_call;
mod unpinned_image;
mod untrusted_artifact;
mod untrusted_self_hosted;
mod write_permissions;

use github_actions_models::workflow::{Job, Workflow};

use super::call::{Reached, lint_called};
use super::facts::job::{CallFacts, JobFacts, WorkflowFacts};
use super::facts::steps::StepView;
use super::{Finding, Rule, Scope, Source, StepLabel};
use crate::yaml::Mark;

/// One rule. A rule looks at one job at a time, through the facts gathered for it.
pub(crate) trait Audit {
    /// The rule its findings carry.
    fn rule(&self) -> Rule;

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

impl Emit<'_> {
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

/// The scope's rules (the registry's) on every job of a workflow: this file's findings
/// in source order (position, then rule; a stable sort, so findings at one place keep
/// job, then registry order), then those of the workflows its jobs call, in job order.
pub(super) fn check(scope: &Scope<'_>, workflow: &Workflow, src: &Source<'_>) -> Vec<Finding> {
    let audits = scope.audits;
    let wf = WorkflowFacts::new(scope, workflow, src);
    let mut out = Vec::new();
    let mut called = Vec::new();
    for (id, job) in &workflow.jobs {
        match job {
            Job::NormalJob(job) => {
                let facts = JobFacts::new(&wf, id, job);
                for audit in audits {
                    audit.check_job(&facts, &mut emit(*audit, scope, id, &mut out));
                }
            }
            Job::ReusableWorkflowCallJob(call) => {
                let facts = CallFacts::new(&wf, id, call, |open, approved, uses| {
                    lint_called(
                        &wf,
                        Reached { open, approved },
                        id,
                        uses,
                        &call.with,
                        call.secrets.is_some(),
                    )
                });
                for audit in audits {
                    audit.check_call(&facts, &mut emit(*audit, scope, id, &mut out));
                }
                if let Some(Ok(findings)) = facts.linted {
                    called.extend(findings);
                }
            }
        }
    }
    out.sort_by_key(|f| (f.line, f.col, f.rule));
    out.extend(called);
    out
}

fn emit<'o>(
    audit: &dyn Audit,
    scope: &'o Scope<'_>,
    job: &'o str,
    out: &'o mut Vec<Finding>,
) -> Emit<'o> {
    Emit {
        rule: audit.rule(),
        file: &scope.file,
        job,
        out,
    }
}

/// Running one rule alone, through the same parsing and merging as `workflow lint`.
#[cfg(test)]
pub(crate) mod testing {
    use std::cell::RefCell;
    use std::collections::{BTreeMap, HashMap};

    use super::Audit;
    use crate::workflow::lint::{Finding, Rule, Scope, lint_in};

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
        let cache = RefCell::new(HashMap::new());
        let scope = Scope {
            file: "test.yml".to_string(),
            triggers: None,
            reach: crate::workflow::lint::guard::Reach::default(),
            guarded: Vec::new(),
            approved: Vec::new(),
            tainted_inputs: BTreeMap::new(),
            head_inputs: BTreeMap::new(),
            secrets_passed: true,
            chain: vec!["test.yml".to_string()],
            resolve: &resolve,
            cache: &cache,
            audits: &[audit],
        };
        lint_in(&scope, text)
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
                    f.rule.name(),
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
