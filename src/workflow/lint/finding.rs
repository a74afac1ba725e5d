//! A finding: where (file, line, column, job, step), which rule, what was found, and for
//! a finding in a called workflow, the jobs that call it. Findings print as one line each
//! (`SEVERITY: FILE:LINE:COL: WHAT [RULE]`), and serialize for `--format json`.

use std::collections::HashMap;

use super::expr;
use super::rule::{Rule, Severity};
use crate::yaml::Mark;

/// A step as findings name it: its number in the job (from 1) and what it is called.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StepLabel {
    pub number: usize,
    pub name: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub rule: Rule,
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub job: Option<String>,
    pub step: Option<StepLabel>,
    pub message: String,
    /// For a finding in a called workflow: the calling jobs (`FILE job JOB`, a chain
    /// joined by ` → `), at most [`MAX_CALLERS_SHOWN`] of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub called_by: Vec<String>,
    /// How many calling jobs there are in all.
    #[serde(skip_serializing_if = "is_zero")]
    pub called_by_count: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Callers listed per finding; the rest are counted.
pub const MAX_CALLERS_SHOWN: usize = 3;

/// Findings with the same place, rule and message, merged: their callers joined. A
/// workflow called from many jobs gives one finding per problem, not one per call.
pub(crate) fn merge(findings: Vec<Finding>) -> Vec<Finding> {
    let mut out: Vec<Finding> = Vec::new();
    let mut index: HashMap<(String, usize, usize, Rule, String), usize> = HashMap::new();
    for f in findings {
        let key = (f.file.clone(), f.line, f.col, f.rule, f.message.clone());
        match index.get(&key) {
            Some(&i) => {
                let into = &mut out[i];
                into.called_by_count += f.called_by_count;
                for c in f.called_by {
                    if into.called_by.len() < MAX_CALLERS_SHOWN && !into.called_by.contains(&c) {
                        into.called_by.push(c);
                    }
                }
            }
            None => {
                index.insert(key, out.len());
                out.push(f);
            }
        }
    }
    out
}

impl Finding {
    pub(crate) fn unparsable(file: &str, mark: Mark, message: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Error,
            rule: Rule::Unparsable,
            file: file.to_string(),
            line: mark.line,
            col: mark.col,
            job: None,
            step: None,
            message: expr::one_line(&message.into()),
            called_by: Vec::new(),
            called_by_count: 0,
        }
    }
}

impl Finding {
    /// What was found, without where or which rule: `job JOB, step N (NAME): MESSAGE
    /// (called by …)`.
    pub fn what(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        if let Some(job) = &self.job {
            let _ = write!(out, "job {job}");
            if let Some(step) = &self.step {
                let _ = write!(out, ", step {} ({})", step.number, step.name);
            }
            out.push_str(": ");
        }
        out.push_str(&self.message);
        if let Some(first) = self.called_by.first() {
            let _ = write!(out, " (called by {first}");
            if self.called_by_count > 1 {
                let _ = write!(out, ", and {} more", self.called_by_count - 1);
            }
            out.push(')');
        }
        out
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(
            f,
            "{severity}: {}:{}:{}: {} [{}]",
            self.file,
            self.line,
            self.col,
            self.what(),
            self.rule.id()
        )
    }
}
