//! What `workflow lint` found over the files it read: the findings, counted, shown as
//! text or JSON, and the exit code they come to.

use super::{Finding, Rule, Severity};
use crate::exit;

/// The findings of one `workflow lint`, and how many files it read.
pub struct Report {
    pub files: usize,
    pub findings: Vec<Finding>,
}

impl Report {
    fn count(&self, pred: impl Fn(&Finding) -> bool) -> usize {
        self.findings.iter().filter(|f| pred(f)).count()
    }

    /// Files that could not be read as a workflow.
    pub fn unparsable(&self) -> usize {
        self.count(|f| f.rule == Rule::Unparsable)
    }

    /// Errors, less the files not readable as a workflow.
    pub fn errors(&self) -> usize {
        self.count(|f| f.severity == Severity::Error) - self.unparsable()
    }

    pub fn warnings(&self) -> usize {
        self.count(|f| f.severity == Severity::Warning)
    }

    /// What `--format json` prints.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "files": self.files,
            "errors": self.errors(),
            "warnings": self.warnings(),
            "unparsable": self.unparsable(),
            "findings": self.findings,
        })
    }

    /// One line a finding: a finding quotes the workflow (a job's or step's name), so
    /// each is escaped.
    pub fn lines(&self) -> Vec<String> {
        self.findings
            .iter()
            .map(|f| crate::util::escape(&f.to_string()).into_owned())
            .collect()
    }

    /// The count, for stderr.
    pub fn summary(&self) -> String {
        let unparsable = self.unparsable();
        let unreadable = if unparsable > 0 {
            format!(", {unparsable} not readable as a workflow")
        } else {
            String::new()
        };
        format!(
            "{} workflow(s), {} error(s), {} warning(s){unreadable}",
            self.files,
            self.errors(),
            self.warnings()
        )
    }

    /// 2 when a file could not be read as a workflow, else 1 when an error was found.
    pub fn exit_code(&self) -> u8 {
        if self.unparsable() > 0 {
            exit::USAGE
        } else if self.errors() > 0 {
            exit::TESTS_FAILED
        } else {
            exit::SUCCESS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(text: &str) -> Report {
        let resolve = |_: &str| None;
        Report {
            files: 1,
            findings: super::super::lint_source("w.yml", text, &resolve),
        }
    }

    #[test]
    fn errors_warnings_and_unreadable_files_come_to_the_exit_code() {
        let clean = report(
            "on: push\njobs:\n  t:\n    runs-on: ubuntu-24.04\n    steps: [{run: 'true'}]\n",
        );
        assert_eq!((clean.errors(), clean.warnings()), (0, 0));
        assert_eq!(clean.exit_code(), exit::SUCCESS);
        assert_eq!(clean.summary(), "1 workflow(s), 0 error(s), 0 warning(s)");
        let open = report(
            "on: pull_request\njobs:\n  t:\n    runs-on: [self-hosted]\n    timeout-minutes: 5\n    steps: [{run: 'true'}]\n",
        );
        assert_eq!(open.errors(), 1, "{:?}", open.lines());
        assert_eq!(open.exit_code(), exit::TESTS_FAILED);
        assert!(
            open.lines()[0].ends_with("[untrusted-self-hosted]"),
            "{:?}",
            open.lines()
        );
        let broken = report("on: [\n");
        assert_eq!((broken.unparsable(), broken.errors()), (1, 0));
        assert_eq!(broken.exit_code(), exit::USAGE);
        assert_eq!(
            broken.summary(),
            "1 workflow(s), 0 error(s), 0 warning(s), 1 not readable as a workflow"
        );
        assert_eq!(broken.to_json()["unparsable"], 1);
    }
}
