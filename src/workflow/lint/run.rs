//! Linting one workflow as a scope reaches it: parse it, gather its facts, run the rules
//! on every job, put the findings in order and merge the duplicates; and, for a job that
//! calls a reusable workflow, lint that one in the scope the job gives it (recursively,
//! each file and scope once).

use std::cell::RefCell;
use std::collections::HashMap;

use github_actions_models::common::Env;
use github_actions_models::common::expr::LoE;
use github_actions_models::workflow::{Job, Workflow};

use super::audit::{Audit, Emit};
use super::call::{MAX_CALL_DEPTH, Reached, callee_scope, carried_back};
use super::facts::job::{CallFacts, JobFacts, WorkflowFacts};
use super::facts::scope::Scope;
use super::finding::{Finding, merge};
use super::parse::parse;
use super::rule::Rule;
use super::source::{Resolver, Source};

/// What stays the same through all the workflows one file leads to: how files are read,
/// the rules, and the called workflows already linted.
pub(crate) struct Linter<'r> {
    resolve: Resolver<'r>,
    /// The rules to run: the registry's, or (in a rule's own tests) that rule alone, in
    /// the called workflows too.
    audits: &'r [&'r dyn Audit],
    /// Called workflows already linted, by file and by what reaches them: each is
    /// linted once however many jobs call it.
    cache: RefCell<HashMap<String, Vec<Finding>>>,
}

impl<'r> Linter<'r> {
    pub fn new(resolve: Resolver<'r>, audits: &'r [&'r dyn Audit]) -> Linter<'r> {
        Linter {
            resolve,
            audits,
            cache: RefCell::new(HashMap::new()),
        }
    }

    /// The findings about one workflow's text as `scope` reaches it; a text that is not
    /// a workflow gives one `unparsable` finding.
    pub fn lint(&self, scope: &Scope, text: &str) -> Vec<Finding> {
        let (root, workflow) = match parse(&scope.file, text) {
            Ok(parsed) => parsed,
            Err(finding) => return vec![*finding],
        };
        let source = Source::new(&root, text);
        merge(self.check(scope, &workflow, &source))
    }

    /// The rules on every job of a workflow: this file's findings in source order
    /// (position, then the rules' order; a stable sort, so one rule's findings at one
    /// place keep job order), then those of the workflows its jobs call, in job order.
    fn check(&self, scope: &Scope, workflow: &Workflow, src: &Source<'_>) -> Vec<Finding> {
        let wf = WorkflowFacts::new(scope, workflow, src, self.resolve);
        let mut out = Vec::new();
        let mut called = Vec::new();
        for (id, job) in &workflow.jobs {
            match job {
                Job::NormalJob(job) => {
                    let facts = JobFacts::new(&wf, id, job);
                    for audit in self.audits {
                        audit.check_job(
                            &facts,
                            &mut Emit::new(audit.rule(), &scope.file, id, &mut out),
                        );
                    }
                }
                Job::ReusableWorkflowCallJob(call) => {
                    let facts = CallFacts::new(&wf, id, call, |open, approved, uses| {
                        self.lint_called(
                            &wf,
                            Reached { open, approved },
                            id,
                            uses,
                            &call.with,
                            call.secrets.is_some(),
                        )
                    });
                    for audit in self.audits {
                        audit.check_call(
                            &facts,
                            &mut Emit::new(audit.rule(), &scope.file, id, &mut out),
                        );
                    }
                    if let Some(Ok(findings)) = facts.linted {
                        called.extend(findings);
                    }
                }
            }
        }
        out.sort_by_key(|f| (f.line, f.col, self.rank(f.rule)));
        out.extend(called);
        out
    }

    /// Where findings of `rule` come among those at one place: the order of the rules
    /// (the registry's, which SARIF lists too). The loader's `unparsable`, which is not
    /// among them, would come first; it is never beside another rule's finding.
    fn rank(&self, rule: Rule) -> Option<usize> {
        self.audits.iter().position(|a| a.rule() == rule)
    }

    /// Lints the workflow job `id` of `wf` calls (`uses: ./.github/workflows/NAME`) as
    /// reached by the caller's triggers, once per file and scope (the cache), and returns
    /// its findings with the calling job prepended to their callers; or why it could not
    /// be linted.
    fn lint_called(
        &self,
        wf: &WorkflowFacts<'_>,
        here: Reached<'_>,
        id: &str,
        uses: &str,
        with: &LoE<Env>,
        secrets_passed: bool,
    ) -> Result<Vec<Finding>, String> {
        let scope = wf.scope;
        if scope.chain.len() >= MAX_CALL_DEPTH {
            return Err(format!(
                "it is more than {MAX_CALL_DEPTH} calls deep, further than GitHub goes"
            ));
        }
        let (callee, text) = (self.resolve)(uses)
            .ok_or_else(|| "it is not a readable file in this folder".to_string())?;
        if scope.chain.contains(&callee) {
            // A workflow calling itself: GitHub refuses to run it.
            return Ok(Vec::new());
        }
        let inner = callee_scope(wf, here, callee, with, secrets_passed);
        // The cache's key: the called file and all its scope holds but the chain of calls.
        let key = format!(
            "{}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{}",
            inner.file,
            inner.triggers,
            inner.reach,
            inner.guarded,
            inner.approved,
            inner.tainted_inputs,
            inner.head_inputs,
            inner.secrets_passed
        );
        let cached = self.cache.borrow().get(&key).cloned();
        let findings = match cached {
            Some(f) => f,
            None => {
                let f = self.lint(&inner, &text);
                self.cache.borrow_mut().insert(key, f.clone());
                f
            }
        };
        carried_back(findings, &format!("{} job {id}", scope.file))
    }
}
