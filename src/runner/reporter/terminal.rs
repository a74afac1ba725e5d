//! The run in a terminal or a CI log: the containers' output on stdout (each line
//! prefixed `[batch] ` when several batches run), and on stderr the wait lines, timeouts,
//! failures, each batch's verdict and how to replay what did not pass.

use std::collections::HashMap;
use std::io::Write;

use super::{Reporter, ReporterError};
use crate::console::{self, WaitLine};
use crate::runner::cleanup::sweep::{Note, Swept};
use crate::runner::ending::RunResult;
use crate::runner::event::Event;
use crate::runner::results::record::{RunRecord, reproduce_line};

/// The terminal reporter of a run.
pub struct Terminal<W: Write + Send> {
    out: W,
    /// Prefix each output line with its batch (several batches in one run).
    prefixed: bool,
    /// Per batch: whether its output is at the start of a line; its wait line.
    at_line_start: HashMap<String, bool>,
    waits: HashMap<String, WaitLine>,
    /// Per batch under Slurm: the queue state last told, and when.
    queued: HashMap<String, (String, std::time::Instant)>,
}

impl<W: Write + Send> Terminal<W> {
    /// Output goes to `out`. A run's waits are logged every 30 s, never as a live line:
    /// its log is read later more often than watched (the live line is `gpu exec`'s).
    pub fn new(out: W) -> Terminal<W> {
        Terminal {
            out,
            prefixed: false,
            at_line_start: HashMap::new(),
            waits: HashMap::new(),
            queued: HashMap::new(),
        }
    }

    fn end_wait(&mut self, batch: &str) {
        if let Some(mut w) = self.waits.remove(batch) {
            w.finish();
        }
    }
}

impl Terminal<std::io::Stdout> {
    pub fn stdout() -> Terminal<std::io::Stdout> {
        Terminal::new(std::io::stdout())
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
    for (note, text) in swept.notes() {
        match note {
            Note::Debug => console::debug(text),
            Note::Info => console::info(text),
            Note::Warn => console::warn(text),
        }
    }
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

impl<W: Write + Send> Reporter for Terminal<W> {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        match event {
            Event::Swept { scope, swept } => {
                print_sweep_notes(swept);
                if !swept.removed.is_empty() {
                    console::info(format!(
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
                self.waits
                    .entry(batch.name.clone())
                    .or_insert_with(|| WaitLine::new(false))
                    .tick(*report, |r| {
                        format!("batch {name}: waiting for {gpus} GPU(s): {}", r.describe())
                    });
            }
            Event::Queued { batch, job, state } => {
                // Told when it changes, and every 30 s while it does not.
                let told = self.queued.get(&batch.name);
                if told.is_none_or(|(s, at)| s != state || at.elapsed().as_secs() >= 30) {
                    console::info(format!(
                        "batch {}: Slurm job {job} waits in the queue: {state}",
                        batch.name
                    ));
                    self.queued.insert(
                        batch.name.clone(),
                        (state.to_string(), std::time::Instant::now()),
                    );
                }
            }
            Event::LeaseGranted { batch, .. } => self.end_wait(&batch.name),
            Event::Output { batch, bytes } => {
                let start = self.at_line_start.entry(batch.name.clone()).or_insert(true);
                let prefix = self.prefixed.then_some(batch.name.as_str());
                let buf = prefix_lines(bytes, prefix, start);
                let _ = self.out.write_all(&buf);
            }
            Event::OutputEnded { .. } => {
                let _ = self.out.flush();
            }
            Event::TimedOut { batch } => {
                console::error(
                    &format_args!(
                        "batch {}: timeout after {}; stopping its container",
                        batch.name, batch.timeout
                    ),
                    &[],
                );
            }
            Event::OutputBroke { batch, error } => {
                console::warn(format!("batch {}: log stream broke: {error}", batch.name));
            }
            Event::BatchFailed { batch, error } => {
                self.end_wait(&batch.name);
                console::error(error, error.details());
            }
            Event::BatchEnded { result } => console::info(verdict_line(&result.record)),
            Event::RunEnded { run } => {
                for line in replay_lines(run) {
                    console::info(line);
                }
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
