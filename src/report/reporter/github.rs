//! The run on GitHub Actions: each batch's output in a log group, one error annotation
//! per failing test (with its file and line when the report gives them) and per batch
//! that did not get to report, the step outputs `status` and `failed_batches`, and the
//! summary as the step summary (docs/interface.md §9).

use super::summary::summary_markdown;
use super::{Reporter, ReporterError};
use crate::github::{append, escape_data, escape_property, output};
use crate::report::event::{Event, EventKind};
use crate::report::outcome::{RunResult, Status};
use crate::report::reporter::pump::Sink;

/// Writes the GitHub workflow commands of a run to `out` (stdout in a workflow, in
/// order with the batches' output: one [`Pump`] for both).
pub struct GitHub<S: Sink> {
    out: S,
    /// While a batch's output runs, workflow commands are off (`::stop-commands::`):
    /// a test must not be able to write annotations, groups or outputs of its own.
    token: String,
}

impl<S: Sink> GitHub<S> {
    /// Fails when no random token can be made: a guessable one would let a test turn
    /// the commands back on.
    pub fn new(out: S) -> std::io::Result<GitHub<S>> {
        Ok(GitHub {
            out,
            token: format!("cibox-{}", crate::util::random_hex(16)?),
        })
    }
}

impl<S: Sink> Reporter for GitHub<S> {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        match &event.kind {
            EventKind::ContainerStarted { batch, .. } => {
                let text = format!(
                    "::group::batch {}\n::stop-commands::{}\n",
                    batch.name, self.token
                );
                self.out.line(text.as_bytes());
            }
            EventKind::OutputEnded { .. } => {
                // On a line of its own, whatever the output's last line was.
                let text = format!("\n::{}::\n::endgroup::\n", self.token);
                self.out.line(text.as_bytes());
            }
            EventKind::RunEnded { run } => {
                append("GITHUB_STEP_SUMMARY", &summary_markdown(&run.batches));
                let (status, failed) = step_outputs(run);
                output("status", status);
                output("failed_batches", &failed);
                self.out.line(annotations(run).as_bytes());
                self.out.settle();
            }
            _ => {}
        }
        Ok(())
    }
}

/// The step's `status` and `failed_batches` outputs.
/// A soft failure (`soft_fail`) and a batch kept from starting are not among the
/// failed batches: what failed the run is.
pub fn step_outputs(run: &RunResult) -> (&'static str, String) {
    let failed: Vec<&str> = run
        .batches
        .iter()
        .filter(|b| b.record.counts_against_run())
        .map(|b| b.record.batch.as_str())
        .collect();
    let status = if run.passed() { "passed" } else { "failed" };
    (status, failed.join(","))
}

/// The most test annotations a run writes (GitHub shows ten per step; the rest are in
/// the summary and the reports).
const MAX_ANNOTATIONS: usize = 50;

/// One `::error` line per failing test case (at most [`MAX_ANNOTATIONS`]), and one per
/// batch that did not get to report (timeout, cancel, infrastructure).
pub fn annotations(run: &RunResult) -> String {
    let mut out = String::new();
    let mut written = 0;
    for b in &run.batches {
        let r = &b.record;
        // What does not fail the run is a warning: a soft failure, a flaky pass.
        let level = if r.counts_against_run() {
            "error"
        } else {
            "warning"
        };
        if r.flaky {
            out.push_str(&format!(
                "::warning title={}::{}\n",
                escape_property(&format!("batch {} flaky", r.batch)),
                escape_data(&format!(
                    "passed on attempt {}; {}",
                    r.attempts,
                    r.earlier_attempts
                        .iter()
                        .map(|a| crate::report::record::attempt_said(
                            a.attempt,
                            a.status,
                            a.message.as_deref()
                        ))
                        .collect::<Vec<_>>()
                        .join("; ")
                ))
            ));
        }
        for c in b.failing() {
            written += 1;
            if written > MAX_ANNOTATIONS {
                break;
            }
            let mut props = format!(
                "title={}",
                escape_property(&format!("{}: {}", r.batch, c.id()))
            );
            if let Some(f) = &c.file {
                props.push_str(&format!(",file={}", escape_property(f)));
                if let Some(l) = c.line {
                    props.push_str(&format!(",line={l}"));
                }
            }
            let msg = c.message.as_deref().unwrap_or("failed");
            out.push_str(&format!("::{level} {props}::{}\n", escape_data(msg)));
        }
        if !matches!(r.status, Status::Passed | Status::Failed | Status::NotRun) {
            out.push_str(&format!(
                "::{level} title={}::{}\n",
                escape_property(&format!("batch {} {}", r.batch, r.status.as_str())),
                escape_data(r.message.as_deref().unwrap_or(""))
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::reporter::sample;

    #[test]
    fn annotations_and_outputs_of_a_mixed_run() {
        let run = sample::run();
        insta::assert_snapshot!(annotations(&run));
        assert_eq!(step_outputs(&run), ("failed", "4a,8b".to_string()));
    }

    #[test]
    fn what_fails_nothing_is_a_warning_and_only_what_fails_the_run_is_failed() {
        let run = sample::shaped_run();
        insta::assert_snapshot!(annotations(&run));
        assert_eq!(step_outputs(&run), ("failed", "e2e".to_string()));
    }

    #[test]
    fn what_a_test_named_reaches_the_log_shown_not_sent() {
        // A JUnit report names its case, file and message: a title change (OSC 0), a
        // clipboard write (OSC 52), an 8-bit CSI and an override, in each.
        let evil = "x\u{1b}]0;pwned\u{7}\u{1b}]52;c;Y3VybCBldmlsfHNo\u{7}\u{9b}2J\u{202e}";
        let mut run = sample::run();
        for c in &mut run.batches[1].cases {
            c.name = format!("test_{evil}");
            c.classname = evil.into();
            c.message = Some(format!("failed {evil}\nsecond line"));
            c.file = Some(format!("tests/{evil}.py"));
        }
        run.batches[2].record.message = Some(evil.into());
        let out = annotations(&run);
        assert!(
            !out.chars()
                .any(|c| c != '\n' && crate::util::is_unsafe_char(c)),
            "{out:?}"
        );
        assert!(
            out.contains("\\u{1b}]52;c;Y3VybCBldmlsfHNo\\u{7}"),
            "shown as an escape: {out}"
        );
        // Still one command a line; a message's own lines as GitHub writes them.
        assert_eq!(out.lines().count(), 3, "{out}");
        assert!(out.contains("%0Asecond line"), "{out}");
    }

    #[test]
    fn groups_wrap_each_batchs_output() {
        let b = crate::plan::run_plan::tests::batch_plan("4a");
        let mut gh = GitHub::new(Vec::new()).unwrap();
        let clock = crate::report::event::RunClock::start();
        gh.handle(&clock.now(EventKind::ContainerStarted {
            batch: &b,
            container: "c",
        }))
        .unwrap();
        gh.handle(&clock.now(EventKind::OutputEnded { batch: &b }))
            .unwrap();
        let token = gh.token.clone();
        let out = String::from_utf8(gh.out).unwrap().replace(&token, "TOKEN");
        insta::assert_snapshot!(out, @r"
        ::group::batch 4a
        ::stop-commands::TOKEN

        ::TOKEN::
        ::endgroup::
        ");
    }
}
