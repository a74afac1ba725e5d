//! The run in a terminal or a CI log: the containers' output on stdout (each line
//! prefixed `[batch] ` when several batches run), and on stderr the wait lines, timeouts,
//! failures, each batch's verdict and how to replay what did not pass.

use std::collections::HashMap;

use super::pump::{Pump, Sink};
use super::{Reporter, ReporterError};
use crate::console::{self, Level, WaitLine};
use crate::runner::cleanup::sweep::{Note, Swept};
use crate::runner::ending::RunResult;
use crate::runner::event::Event;
use crate::runner::results::record::{RunRecord, reproduce_line};

/// The terminal reporter of a run. It never writes itself: its sinks queue (see
/// [`super::pump`]), so a reader that stalls holds up no batch.
pub struct Terminal<O: Sink, E: Sink> {
    /// The batches' output.
    out: O,
    /// cibox's lines about the run.
    err: E,
    /// Prefix each output line with its batch (several batches in one run).
    prefixed: bool,
    /// Per batch: whether its output is at the start of a line; its wait line.
    at_line_start: HashMap<String, bool>,
    waits: HashMap<String, WaitLine>,
}

impl<O: Sink, E: Sink> Terminal<O, E> {
    /// Output goes to `out`, cibox's lines to `err`. A run's waits are logged every
    /// 30 s, never as a live line: its log is read later more often than watched (the
    /// live line is `gpu exec`'s).
    pub fn new(out: O, err: E) -> Terminal<O, E> {
        Terminal {
            out,
            err,
            prefixed: false,
            at_line_start: HashMap::new(),
            waits: HashMap::new(),
        }
    }

    fn info(&mut self, msg: &str) {
        if let Some(line) = console::log_line(Level::Info, "", msg) {
            self.err.line(line.as_bytes());
        }
    }
}

impl Terminal<Pump, Pump> {
    /// On stdout and stderr, each written from a thread of its own; `out` is shared
    /// with whoever else writes stdout during the run (GitHub's workflow commands), so
    /// that everything keeps its order.
    pub fn stdio(out: Pump) -> Terminal<Pump, Pump> {
        Terminal::new(out, Pump::stderr())
    }
}

/// The output of a batch as one buffer, each line prefixed `[batch] ` when asked: one
/// write per chunk, so parallel batches interleave whole lines.
pub fn prefix_lines(bytes: &[u8], prefix: Option<&str>, at_line_start: &mut bool) -> Vec<u8> {
    let Some(name) = prefix else {
        return bytes.to_vec();
    };
    let mut buf = Vec::with_capacity(bytes.len() + 64);
    for piece in bytes.split_inclusive(|b| *b == b'\n') {
        if *at_line_start {
            buf.extend_from_slice(format!("[{name}] ").as_bytes());
        }
        buf.extend_from_slice(piece);
        *at_line_start = piece.ends_with(b"\n");
    }
    buf
}

/// Says what a sweep found, each note at its level.
pub fn print_sweep_notes(swept: &Swept) {
    for line in sweep_lines(swept) {
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    }
}

/// The lines [`print_sweep_notes`] prints (those shown at the log level).
fn sweep_lines(swept: &Swept) -> Vec<String> {
    swept
        .notes()
        .into_iter()
        .filter_map(|(note, text)| match note {
            Note::Debug => console::log_line(Level::Debug, "", &text),
            Note::Info => console::log_line(Level::Info, "", &text),
            Note::Warn => console::log_line(Level::Warn, "warning: ", &text),
        })
        .collect()
}

/// A batch's verdict in one line: status, why, counts, duration.
pub fn verdict_line(r: &RunRecord) -> String {
    let t = &r.tests;
    let why = r
        .message
        .as_deref()
        .map(|m| format!(": {m}"))
        .unwrap_or_default();
    format!(
        "batch {}: {}{why} ({} tests: {} passed, {} failed, {} errors, {} skipped) in {:.1}s",
        r.batch,
        r.status.as_str(),
        t.total,
        t.passed,
        t.failed,
        t.errors,
        t.skipped,
        r.duration_s
    )
}

/// How to replay each batch that did not pass.
pub fn replay_lines(run: &RunResult) -> Vec<String> {
    run.batches
        .iter()
        .filter(|b| !b.passed())
        .map(|b| {
            format!(
                "batch {} {}; replay it locally: {}",
                b.record.batch,
                b.record.status.as_str(),
                reproduce_line(&b.record_path)
            )
        })
        .collect()
}

impl<O: Sink, E: Sink> Reporter for Terminal<O, E> {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        match event {
            Event::Swept { scope, swept } => {
                for line in sweep_lines(swept) {
                    self.err.line(line.as_bytes());
                }
                if !swept.removed.is_empty() {
                    self.info(&format!(
                        "removed {} leftover container(s) of dead runs (this run's scope: {scope})",
                        swept.removed.len()
                    ));
                }
            }
            Event::RunStarted { plan } => {
                self.prefixed = plan.batches.len() > 1;
            }
            Event::Waiting { batch, report } => {
                let gpus = batch.gpus;
                let name = batch.name.clone();
                let due = self
                    .waits
                    .entry(batch.name.clone())
                    .or_insert_with(|| WaitLine::new(false))
                    .due(*report, |r| {
                        format!("batch {name}: waiting for {gpus} GPU(s): {}", r.describe())
                    });
                if let Some(line) = due {
                    self.info(&line);
                }
            }
            Event::LeaseGranted { batch, .. } => {
                self.waits.remove(&batch.name);
            }
            Event::Output { batch, bytes } => {
                let start = self.at_line_start.entry(batch.name.clone()).or_insert(true);
                let prefix = self.prefixed.then_some(batch.name.as_str());
                let buf = prefix_lines(bytes, prefix, start);
                self.out.output(&buf);
            }
            Event::TimedOut { batch } => {
                let text = console::error_lines(
                    &format_args!(
                        "batch {}: timeout after {}; stopping its container",
                        batch.name, batch.timeout
                    ),
                    &[],
                );
                self.err.line(text.as_bytes());
            }
            Event::OutputBroke { batch, error } => {
                if let Some(line) = console::log_line(
                    Level::Warn,
                    "warning: ",
                    &format!("batch {}: log stream broke: {error}", batch.name),
                ) {
                    self.err.line(line.as_bytes());
                }
            }
            Event::BatchFailed { batch, error } => {
                self.waits.remove(&batch.name);
                self.err
                    .line(console::error_lines(error, error.details()).as_bytes());
            }
            Event::BatchEnded { result } => self.info(&verdict_line(&result.record)),
            Event::RunEnded { run } => {
                for line in replay_lines(run) {
                    self.info(&line);
                }
                // Whatever comes next (the command's own lines, exit) comes after.
                self.out.settle();
                self.err.settle();
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_output_is_prefixed_line_by_line() {
        let mut start = true;
        let a = prefix_lines(b"one\ntw", Some("4a"), &mut start);
        let b = prefix_lines(b"o\nthree\n", Some("4a"), &mut start);
        let text = String::from_utf8([a, b].concat()).unwrap();
        insta::assert_snapshot!(text, @r"
        [4a] one
        [4a] two
        [4a] three
        ");
        let mut start = true;
        assert_eq!(prefix_lines(b"raw\n", None, &mut start), b"raw\n");
    }
}

#[cfg(test)]
mod line_tests {
    use super::*;
    use crate::runner::reporter::sample;

    #[test]
    fn verdict_and_replay_lines_of_a_mixed_run() {
        let run = sample::run();
        let mut lines: Vec<String> = run
            .batches
            .iter()
            .map(|b| verdict_line(&b.record))
            .collect();
        lines.extend(replay_lines(&run));
        insta::assert_snapshot!(lines.join("\n"));
    }
}
