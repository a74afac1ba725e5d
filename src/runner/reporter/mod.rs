//! Reporters render the runner's [`Event`]s: the terminal (output with batch prefixes,
//! wait lines, verdict lines), GitHub Actions (log groups, annotations, step outputs,
//! step summary) and the reports folder (`log.txt`, `result.json`, `summary.md`,
//! merged `junit.xml`). The runner knows none of them; a front end picks its set.

pub mod files;
pub mod github;
pub mod terminal;

use super::event::Event;
use super::outcome::{BatchResult, Verdict};
use super::record::reproduce_line;

/// A reporter could not write what it owns (a reports file).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct ReportError {
    pub what: String,
    #[source]
    pub source: std::io::Error,
}

impl ReportError {
    pub fn new(what: impl Into<String>, source: std::io::Error) -> ReportError {
        ReportError {
            what: what.into(),
            source,
        }
    }
}

/// Something that renders the runner's events. An error is the runner's to handle: a
/// batch whose `log.txt` cannot be made fails as an infrastructure error, a run whose
/// `result.json` or `summary.md` cannot be written ends with one.
pub trait Reporter: Send {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReportError>;
}

/// Several reporters, in order. An error stops the event there: the reporters after
/// the one that failed do not see it (a run whose `summary.md` cannot be written
/// publishes no GitHub summary either).
#[derive(Default)]
pub struct Fanout(Vec<Box<dyn Reporter>>);

impl Fanout {
    pub fn new() -> Fanout {
        Fanout::default()
    }

    pub fn with(mut self, reporter: impl Reporter + 'static) -> Fanout {
        self.0.push(Box::new(reporter));
        self
    }
}

impl Reporter for Fanout {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReportError> {
        self.0.iter_mut().try_for_each(|r| r.handle(event))
    }
}

/// `summary.md`: one table row per batch, then the failing tests and replay commands.
pub fn summary_markdown(results: &[BatchResult]) -> String {
    let mut s = String::from(
        "## cibox run\n\n| batch | status | tests | passed | failed | errors | skipped | GPUs | duration |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results.iter().map(|b| &b.record) {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s |\n",
            r.batch,
            r.status.as_str(),
            r.tests.total,
            r.tests.passed,
            r.tests.failed,
            r.tests.errors,
            r.tests.skipped,
            r.gpus.len(),
            r.duration_s
        ));
    }
    for b in results.iter().filter(|b| b.verdict != Verdict::Passed) {
        let r = &b.record;
        s.push_str(&format!("\n### {} ({})\n\n", r.batch, r.status.as_str()));
        if let Some(m) = &r.message {
            s.push_str(&format!("{m}\n\n"));
        }
        for c in b.failing() {
            s.push_str(&format!(
                "- `{}`: {}\n",
                c.id(),
                c.message.as_deref().unwrap_or("(no message)")
            ));
        }
        s.push_str(&format!(
            "\nReplay locally: `{}`\n",
            reproduce_line(&b.record_path)
        ));
    }
    s
}

/// A run of three batches (passed; failed with two failing tests; timed out), for the
/// reporters' snapshot tests.
#[cfg(test)]
pub(crate) mod sample {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use crate::runner::junit::{Case, Outcome, Totals};
    use crate::runner::outcome::{BatchResult, RunOutcome, Verdict};
    use crate::runner::record::{GpuRef, RunRecord, SourceInfo};

    fn case(name: &str, outcome: Outcome, message: Option<&str>, file: Option<&str>) -> Case {
        Case {
            classname: "tests.test_model".into(),
            name: name.into(),
            outcome,
            message: message.map(str::to_string),
            time_s: Some(0.5),
            file: file.map(str::to_string),
            line: file.map(|_| 42),
        }
    }

    fn result(
        batch: &str,
        verdict: Verdict,
        message: Option<&str>,
        cases: Vec<Case>,
    ) -> BatchResult {
        let tests = Totals::of(&cases);
        let record = RunRecord {
            schema: 1,
            batch: batch.into(),
            status: verdict.status(),
            exit_code: verdict.exit_code(),
            image: format!("sha256:{}", "a".repeat(64)),
            lockset: format!("sha256:{}", "b".repeat(64)),
            source: SourceInfo {
                sha: Some("c".repeat(40)),
                dirty: Some(false),
                path: "/src/p".into(),
            },
            gpus: vec![GpuRef {
                index: 0,
                uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            }],
            host: "gpu-host".into(),
            scope: "gh-1-1".into(),
            run: "0123456789abcdef".into(),
            container: format!("cibox-p-gh-1-1-{batch}-01234567"),
            fast: false,
            started_at: "2026-11-30T03:00:00Z".into(),
            finished_at: "2026-11-30T03:00:12Z".into(),
            duration_s: 12.25,
            tests,
            cibox_version: "0.1.0".into(),
            manifest_digest: format!("sha256:{}", "d".repeat(64)),
            gpu_count: 1,
            env: BTreeMap::new(),
            failed_tests: Vec::new(),
            message: message.map(str::to_string),
            container_exit_code: None,
        };
        BatchResult {
            verdict,
            record,
            cases,
            record_path: PathBuf::from(format!("/r/{batch}/result.json")),
        }
    }

    pub fn outcome() -> RunOutcome {
        RunOutcome {
            batches: vec![
                result(
                    "unit",
                    Verdict::Passed,
                    None,
                    vec![case("test_ok", Outcome::Passed, None, None)],
                ),
                result(
                    "4a",
                    Verdict::Failed,
                    Some("1 failed, 1 errors"),
                    vec![
                        case("test_ok", Outcome::Passed, None, None),
                        case(
                            "test_loss",
                            Outcome::Failed,
                            Some("loss 0.9 > 0.5: diverged, again"),
                            Some("tests/test_model.py"),
                        ),
                        case("test_nccl", Outcome::Error, None, None),
                    ],
                ),
                result(
                    "8b",
                    Verdict::Timeout,
                    Some("the batch hit its timeout of 30m"),
                    Vec::new(),
                ),
            ],
            stopped_by: None,
            reports: PathBuf::from("/r"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn summary_markdown_of_a_mixed_run() {
        insta::assert_snapshot!(super::summary_markdown(&super::sample::outcome().batches));
    }
}
