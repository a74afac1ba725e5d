//! `summary.md` (and GitHub's step summary): one table row per batch, then the failing
//! tests and how to replay them; test output made Markdown-safe on the way.

use super::markdown::{code_span, markdown_text};
use super::{hardware, timeline};
use crate::report::outcome::{BatchResult, Status};
use crate::report::record::reproduce_line;

/// The picture of the run beside `summary.md` (see [`timeline`]).
pub const TIMELINE_FILE: &str = "timeline.svg";

/// The most failing tests a summary lists per batch.
const MAX_FAILING_LISTED: usize = 50;
/// The longest summary: GitHub refuses step summaries over 1 MiB.
const MAX_SUMMARY_BYTES: usize = 512 * 1024;

/// `summary.md`: one table row per batch, then the failing tests and replay commands;
/// cut at [`MAX_SUMMARY_BYTES`] with a note.
pub fn summary_markdown(results: &[BatchResult]) -> String {
    let mut s = summary_uncut(results);
    if s.len() > MAX_SUMMARY_BYTES {
        s = crate::report::junit::truncate(s, MAX_SUMMARY_BYTES);
        s.push_str("\n\n(summary cut at 512 KiB; see each batch's result.json and junit.xml)\n");
    }
    s
}

fn summary_uncut(results: &[BatchResult]) -> String {
    let mut s = String::from(
        "## cibox run\n\n| batch | status | tests | passed | failed | errors | skipped | GPUs | duration |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results.iter().map(|b| &b.record) {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s |\n",
            r.batch,
            status_text(r),
            r.tests.total,
            r.tests.passed,
            r.tests.failed,
            r.tests.errors,
            r.tests.skipped,
            r.gpus.len(),
            r.duration_s
        ));
    }
    let picture = timeline::mermaid(results);
    if !picture.is_empty() {
        s.push_str("\n### Timeline\n\n");
        s.push_str(&picture);
        s.push_str(&format!(
            "\nPer GPU, each batch's wait for its GPUs, then its run (red: it did not pass). The same picture without GitHub: `{TIMELINE_FILE}` beside `summary.md`.\n"
        ));
    }
    for b in results
        .iter()
        .filter(|b| b.record.flaky || !b.passed() && b.status() != Status::NotRun)
    {
        let r = &b.record;
        s.push_str(&format!("\n### {} ({})\n\n", r.batch, status_text(r)));
        if let Some(m) = &r.message {
            s.push_str(&format!("{}\n\n", markdown_text(m)));
        }
        for a in &r.earlier_attempts {
            s.push_str(&format!(
                "- attempt {}: {}{}\n",
                a.attempt,
                a.status.as_str(),
                a.message
                    .as_deref()
                    .map(|m| format!(": {}", markdown_text(m)))
                    .unwrap_or_default()
            ));
        }
        if !r.earlier_attempts.is_empty() {
            s.push_str(&format!(
                "- attempt {}: {}\n\n",
                r.attempts,
                r.status.as_str()
            ));
        }
        if b.passed() {
            continue;
        }
        let failing: Vec<_> = b.failing().collect();
        for c in failing.iter().take(MAX_FAILING_LISTED) {
            s.push_str(&format!(
                "- {}: {}\n",
                code_span(&c.id()),
                markdown_text(c.message.as_deref().unwrap_or("(no message)"))
            ));
        }
        let unlisted = (r.tests.failed + r.tests.errors).saturating_sub(MAX_FAILING_LISTED);
        if unlisted > 0 {
            s.push_str(&format!("- … and {unlisted} more\n"));
        }
        s.push_str(&format!(
            "\nReplay locally: `{}`\n",
            reproduce_line(&b.record_path)
        ));
    }
    let not_run: Vec<&BatchResult> = results
        .iter()
        .filter(|b| b.status() == Status::NotRun)
        .collect();
    if let Some(first) = not_run.first() {
        let names: Vec<String> = not_run.iter().map(|b| code_span(&b.record.batch)).collect();
        s.push_str(&format!(
            "\n### Not run\n\n{}: {}\n",
            markdown_text(first.record.message.as_deref().unwrap_or("not started")),
            names.join(", ")
        ));
    }
    s.push_str(&hardware::summary_section(results));
    s
}

/// A batch's status as the table shows it: a flaky pass and a soft failure never read
/// as a plain pass or failure.
fn status_text(r: &crate::report::record::RunRecord) -> String {
    match r.status {
        Status::Passed if r.flaky => format!("flaky, passed on attempt {}", r.attempts),
        s if r.soft_fail
            && !r.counts_against_run()
            && s != Status::Passed
            && s != Status::NotRun =>
        {
            format!("{}, soft_fail", s.as_str())
        }
        s if r.attempts > 1 => format!("{}, {} attempts", s.as_str(), r.attempts),
        s => s.as_str().to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn summary_markdown_of_a_mixed_run() {
        insta::assert_snapshot!(super::summary_markdown(
            &crate::report::reporter::sample::run().batches
        ));
    }

    #[test]
    fn summary_markdown_of_a_run_shaped_by_time() {
        insta::assert_snapshot!(super::summary_markdown(
            &crate::report::reporter::sample::shaped_run().batches
        ));
    }

    #[test]
    fn test_names_cannot_forge_markdown() {
        assert_eq!(
            super::markdown_text("x\n| forged | row |\n<img src=x>"),
            "x \\| forged \\| row \\| \\<img src=x>"
        );
        // Plain text stays plain: no escape where Markdown reads no markup.
        assert_eq!(
            super::markdown_text(
                "the batch went over its memory limit (256m); see log.txt, test_x."
            ),
            "the batch went over its memory limit (256m); see log.txt, test_x."
        );
        // Markup where it stands is escaped.
        assert_eq!(
            super::markdown_text("# 1. _em_ *b* [l](u) ~s~ &amp; a\\*"),
            "\\# 1. \\_em\\_ \\*b\\* [l\\](u) \\~s\\~ \\&amp; a\\\\\\*"
        );
        assert_eq!(
            super::markdown_text("[r]: http://x and [a][r] but [[gpu]] and t[1]"),
            "\\[r\\]: http://x and [a\\][r] but [[gpu]] and t[1]"
        );
        assert_eq!(super::markdown_text("12. item"), "12\\. item");
        assert_eq!(super::markdown_text("0.9 > 0.5"), "0.9 > 0.5");
        assert_eq!(super::markdown_text("- item"), "\\- item");
        assert_eq!(
            crate::report::reporter::markdown::code_span("a`b"),
            "`` a`b ``"
        );
        assert_eq!(
            crate::report::reporter::markdown::code_span("t::x\ny"),
            "` t::x y `"
        );
    }
}
