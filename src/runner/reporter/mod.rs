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

/// Several reporters, in order; each sees every event, and the first error is kept.
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
        let mut first = Ok(());
        for r in &mut self.0 {
            if let Err(e) = r.handle(event)
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
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
