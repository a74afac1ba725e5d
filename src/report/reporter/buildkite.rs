//! The run as a Buildkite job shows it (docs/interface.md §9, *Buildkite*): each batch's
//! output under a collapsible `--- batch NAME` heading (expanded with `^^^ +++` when the
//! batch did not pass), and at the end one annotation of the build: the summary's
//! table, the failing tests, and links to the reports as the job's artifacts
//! (`artifact://…`, for a step whose `artifact_paths` uploads the reports folder).

use std::path::Path;

use super::markdown::code_span;
use super::summary::summary_markdown;
use super::{Reporter, ReporterError};
use crate::report::event::{Event, EventKind};
use crate::report::outcome::RunResult;
use crate::report::reporter::pump::Sink;

/// Writes a run's Buildkite log headings to `out` (the batches' own stream) and
/// annotates the build when the run ends.
pub struct Buildkite<S: Sink> {
    out: S,
}

impl<S: Sink> Buildkite<S> {
    pub fn new(out: S) -> Buildkite<S> {
        Buildkite { out }
    }
}

impl<S: Sink> Reporter for Buildkite<S> {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        match &event.kind {
            EventKind::ContainerStarted { batch, .. } => {
                let text = format!("--- batch {}\n", batch.name);
                self.out.line(text.as_bytes());
            }
            EventKind::BatchEnded { result } if !result.passed() => {
                // Open the heading of the batch that did not pass; on a line of its own.
                self.out.line(b"\n^^^ +++\n");
            }
            EventKind::RunEnded { run } => {
                self.out.settle();
                let style = annotation_style(run);
                let cwd = std::env::current_dir().unwrap_or_default();
                let body = annotation(run, &cwd);
                if let Err(e) =
                    crate::buildkite::annotate(&format!("cibox-{}", run.run), style, &body)
                {
                    crate::console::warn(e.to_string());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// `error` when the run failed; `warning` when it passed with something to see (a soft
/// failure, a flaky pass, a batch not run); else `success`.
pub fn annotation_style(run: &RunResult) -> &'static str {
    if !run.passed() {
        "error"
    } else if run.batches.iter().any(|b| !b.passed() || b.record.flaky) {
        "warning"
    } else {
        "success"
    }
}

/// A path as an artifact's: relative to the job's folder when it lies in it (where
/// `artifact_paths` globs are read from), else as it is.
fn artifact(path: &Path, cwd: &Path) -> String {
    let rel = path.strip_prefix(cwd).unwrap_or(path);
    rel.to_string_lossy().into_owned()
}

/// The annotation's Markdown: the summary (its table and failing tests; Buildkite draws
/// no Mermaid, so not the timeline) and the reports as artifact links. Every text from
/// elsewhere in it is made Markdown-safe as in `summary.md`.
pub fn annotation(run: &RunResult, cwd: &Path) -> String {
    let summary = summary_markdown(&run.batches);
    // The timeline is a Mermaid block: drop it, its heading and its note.
    let mut body = String::new();
    let mut skipping = false;
    for line in summary.lines() {
        if line == "### Timeline" {
            skipping = true;
            continue;
        }
        if skipping && line.starts_with("### ") {
            skipping = false;
        }
        if !skipping {
            body.push_str(line);
            body.push('\n');
        }
    }
    let link = |label: &str, path: &Path| {
        let a = artifact(path, cwd);
        // An artifact path with a character that would end the link is shown, not linked.
        if a.chars()
            .any(|c| c.is_whitespace() || matches!(c, '(' | ')' | '<' | '>' | '[' | ']'))
        {
            format!("{label} {}", code_span(&a))
        } else {
            format!("[{label}](artifact://{a})")
        }
    };
    body.push_str("\n### Reports\n\n");
    body.push_str(&format!(
        "{} · {} · {}\n\n",
        link("summary.md", &run.reports.join("summary.md")),
        link("junit.xml", &run.reports.join("junit.xml")),
        link("timeline.svg", &run.reports.join("timeline.svg")),
    ));
    for b in &run.batches {
        let dir = b.record_path.parent().unwrap_or(Path::new(""));
        body.push_str(&format!(
            "- {} ({}): {} · {}\n",
            code_span(&b.record.batch),
            b.record.status.as_str(),
            link("log.txt", &dir.join("log.txt")),
            link("result.json", &b.record_path),
        ));
    }
    body.push_str(&format!(
        "\nThe links work where the step uploads the reports: `artifact_paths: \"{}/**/*\"`.\n",
        artifact(&run.reports, cwd)
    ));
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::reporter::sample;

    #[test]
    fn the_annotation_holds_the_table_the_failures_and_artifact_links() {
        let run = sample::run();
        let text = annotation(&run, Path::new("/"));
        assert!(text.contains("| 4a | failed |"), "{text}");
        assert!(
            text.contains("[log.txt](artifact://r/4a/log.txt)"),
            "{text}"
        );
        assert!(
            text.contains("[result.json](artifact://r/8b/result.json)"),
            "{text}"
        );
        assert!(text.contains("artifact_paths: \"r/**/*\""), "{text}");
        assert!(!text.contains("mermaid"), "{text}");
        assert_eq!(annotation_style(&run), "error");
        // Only soft failures: the build passes, the annotation warns.
        let mut soft = sample::run();
        for b in &mut soft.batches {
            b.record.soft_fail = b.record.status != crate::report::outcome::Status::Passed;
        }
        assert_eq!(annotation_style(&soft), "warning");
        soft.batches.retain(|b| b.passed());
        assert_eq!(annotation_style(&soft), "success");
    }
}
