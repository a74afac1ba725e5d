//! The run in a terminal or a CI log: the containers' output on stdout (each line
//! prefixed `[batch] ` when several batches run), and on stderr the wait lines, timeouts,
//! failures, each batch's verdict and how to replay what did not pass.

use std::collections::HashMap;
use std::time::Duration;

use crate::console::{self, Level, WaitLine};
use crate::gpu::WaitReport;
use crate::plan::BatchPlan;
use crate::report::event::{Event, EventKind};
use crate::report::outcome::{BatchResult, RunResult};
use crate::report::record::{RunRecord, reproduce_line};
use crate::report::reporter::pump::Sink;
use crate::report::reporter::{Reporter, ReporterError};
use crate::report::sweep::{Note, Swept};
use crate::units::human;

/// How often a quiet batch is said to be alive, unless `CIBOX_HEARTBEAT` says otherwise.
pub const HEARTBEAT: Duration = Duration::from_secs(30);

/// A running batch, for its heartbeat (times into the run, from its events).
struct Alive {
    started: Duration,
    last_output: Option<Duration>,
    last_said: Duration,
}

/// The terminal reporter of a run. It never writes itself: its sinks queue (see
/// [`crate::report::reporter::pump`]), so a reader that stalls holds up no batch.
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
    /// Per batch whose wait was told: when it began to wait.
    waited: HashMap<String, Duration>,
    /// Batches whose error was said (their verdict does not say it again).
    failed_said: std::collections::HashSet<String>,
    /// When the run started, for its closing line.
    started: Option<Duration>,
    /// How far into the run the event being handled happened.
    now: Duration,
    /// Each running batch, and how often to say that a quiet one still runs (zero:
    /// never).
    alive: HashMap<String, Alive>,
    heartbeat: Duration,
    /// Per batch under Slurm: the queue state last told, and when.
    queued: HashMap<String, (String, Duration)>,
    /// `out` and `err` lead to one place (see [`Terminal::one_stream`]).
    one_stream: bool,
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
            waited: HashMap::new(),
            failed_said: std::collections::HashSet::new(),
            started: None,
            now: Duration::ZERO,
            alive: HashMap::new(),
            heartbeat: HEARTBEAT,
            queued: HashMap::new(),
            one_stream: false,
        }
    }

    /// `out` and `err` lead to one place (a terminal, `2>&1`): a line of cibox's starts
    /// on a line of its own, even where a batch's output stopped mid-line.
    pub fn one_stream(mut self) -> Terminal<O, E> {
        self.one_stream = true;
        self
    }

    /// One of cibox's lines.
    fn say(&mut self, bytes: &[u8]) {
        if self.one_stream {
            let mut mid_line = false;
            for start in self.at_line_start.values_mut() {
                mid_line |= !*start;
                *start = true;
            }
            if mid_line {
                self.out.line(b"\n");
            }
        }
        self.err.line(bytes);
    }

    /// Says every `every` that a batch which printed nothing for that long still runs
    /// (zero: never).
    pub fn with_heartbeat(mut self, every: Duration) -> Terminal<O, E> {
        self.heartbeat = every;
        self
    }

    /// A quiet batch's heartbeat, when one is due: how long it has run and when it
    /// last printed.
    fn beat(&mut self, batch: &str) {
        let Some(a) = self.alive.get_mut(batch) else {
            return;
        };
        let now = self.now;
        let quiet_since = a.last_output.unwrap_or(a.started).max(a.last_said);
        if self.heartbeat.is_zero() || now.saturating_sub(quiet_since) < self.heartbeat {
            return;
        }
        a.last_said = now;
        let last = match a.last_output {
            Some(t) => format!("last output {} ago", human(now.saturating_sub(t))),
            None => "no output yet".to_string(),
        };
        let line = format!(
            "batch {batch}: running for {}, {last}",
            human(now.saturating_sub(a.started))
        );
        self.info(&line);
    }

    /// A batch's wait for its GPUs, logged every 30 s.
    fn waiting(&mut self, batch: &BatchPlan, report: &dyn Fn() -> WaitReport) {
        let gpus = batch.gpus;
        let name = batch.name.clone();
        let due = self
            .waits
            .entry(batch.name.clone())
            .or_insert_with(|| WaitLine::new(false))
            .due(report, |r| {
                format!(
                    "batch {name}: waiting {} for {gpus} GPU(s): {}",
                    human(r.waited),
                    r.progress()
                )
            });
        if let Some(line) = due {
            self.waited.entry(name).or_insert(self.now);
            self.info(&line);
        }
    }

    /// A batch's Slurm job in the queue: told when its state changes, and every 30 s
    /// while it does not.
    fn queued(&mut self, batch: &str, job: &str, state: &str, left: Duration) {
        let told = self.queued.get(batch);
        let now = self.now;
        if told.is_none_or(|(s, at)| s != state || now.saturating_sub(*at).as_secs() >= 30) {
            let line = format!(
                "batch {batch}: Slurm job {job} waits in the queue: {state}; {}",
                crate::gpu::gives_up(left)
            );
            self.info(&line);
            self.queued
                .insert(batch.to_string(), (state.to_string(), now));
        }
    }

    /// What a batch printed, prefixed with its name when the run has several.
    fn output(&mut self, batch: &str, bytes: &[u8]) {
        if let Some(a) = self.alive.get_mut(batch) {
            a.last_output = Some(self.now);
        }
        let start = self.at_line_start.entry(batch.to_string()).or_insert(true);
        let prefix = self.prefixed.then_some(batch);
        let buf = prefix_lines(bytes, prefix, start);
        self.out.output(&buf);
    }

    fn debug(&mut self, msg: &str) {
        if let Some(line) = console::log_line(Level::Debug, "", msg) {
            self.say(line.as_bytes());
        }
    }

    fn info(&mut self, msg: &str) {
        self.info_styled(&console::Styled::new().text(msg));
    }

    fn info_styled(&mut self, msg: &console::Styled) {
        if let Some(line) = console::styled_line(Level::Info, "", msg) {
            self.say(line.as_bytes());
        }
    }
}

/// The output of a batch as one buffer, each line prefixed `[batch] ` when asked: one
/// write per chunk, so parallel batches interleave whole lines.
pub fn prefix_lines(bytes: &[u8], prefix: Option<&str>, at_line_start: &mut bool) -> Vec<u8> {
    let Some(name) = prefix else {
        if let Some(last) = bytes.last() {
            *at_line_start = *last == b'\n';
        }
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

/// A batch's verdict in one line: status (in colour), why, counts, duration.
/// Whether a batch's container never ran: it ended waiting for its GPUs, its image, or
/// its container's start, so it has no tests to count and nothing to replay.
fn never_ran(r: &RunRecord) -> bool {
    use crate::report::outcome::Status;
    r.status == Status::NotRun
        || matches!(
            r.status,
            Status::Capacity | Status::ImageRefused | Status::InfraError | Status::Cancelled
        ) && r.container_exit_code.is_none()
            && r.tests.total == 0
            && r.output_bytes == 0
}

/// What a batch's record adds to its status word: how many attempts a flaky batch took
/// (and how the first ended), or that a failure is soft.
fn status_note(r: &RunRecord) -> String {
    if r.flaky {
        let first = r.earlier_attempts.first();
        let first = first
            .map(|a| format!("; attempt 1 {}", a.status.as_str()))
            .unwrap_or_default();
        return format!(" (passed on attempt {}{first})", r.attempts);
    }
    let mut note = Vec::new();
    if r.attempts > 1 {
        note.push(format!("after {} attempts", r.attempts));
    }
    if r.soft_fail && !r.counts_against_run() && r.status != crate::report::outcome::Status::Passed
    {
        note.push("soft_fail: it does not fail the run".to_string());
    }
    if note.is_empty() {
        String::new()
    } else {
        format!(" ({})", note.join("; "))
    }
}

/// `batch B: STATUS: MESSAGE (N tests: …) in S`: the message left out when the error
/// line said it already (`said`), the tests when the batch never ran.
pub fn verdict_line(r: &RunRecord, said: bool) -> console::Styled {
    let t = &r.tests;
    let why = r
        .message
        .as_deref()
        .filter(|_| !said)
        .map(|m| format!(": {m}"))
        .unwrap_or_default();
    let tests = if never_ran(r) {
        " (never ran)".to_string()
    } else {
        format!(
            " ({} test{}: {} passed, {} failed, {} errors, {} skipped)",
            t.total,
            if t.total == 1 { "" } else { "s" },
            t.passed,
            t.failed,
            t.errors,
            t.skipped
        )
    };
    use crate::report::outcome::Status;
    // A flaky batch passed, but is never shown simply green; a soft failure is shown,
    // in the colour of a warning.
    let (word, colour) = match r.status {
        Status::Passed if r.flaky => ("flaky", console::Colour::Yellow),
        Status::Passed => ("passed", console::Colour::Green),
        Status::Failed | Status::Timeout if !r.counts_against_run() => {
            (r.status.as_str(), console::Colour::Yellow)
        }
        Status::Failed => ("failed", console::Colour::Red),
        other => (other.as_str(), console::Colour::Yellow),
    };
    console::Styled::new()
        .text(format!("batch {}: ", r.batch))
        .paint(word, colour)
        .text(format!(
            "{}{why}{tests} in {:.1}s",
            status_note(r),
            r.duration_s
        ))
}

/// The line of an attempt that did not pass, when another follows.
fn attempt_line(r: &RunRecord, next: u32, of: u32) -> console::Styled {
    let why = r
        .message
        .as_deref()
        .map(|m| format!(": {m}"))
        .unwrap_or_default();
    console::Styled::new()
        .text(format!("batch {}: attempt {} of {of} ", r.batch, next - 1))
        .paint(r.status.as_str(), console::Colour::Yellow)
        .text(format!("{why}; running it again (attempt {next})"))
}

/// The most failing tests the closing lines name (the rest are in `summary.md`).
const MAX_CLOSING_FAILURES: usize = 50;

/// The run's closing lines, as nextest ends: one summary line (how long, how many
/// batches ended how, how many tests), then each failing test and each batch that ended
/// neither passed nor failed, by name.
pub fn closing_lines(run: &RunResult, elapsed: Option<std::time::Duration>) -> Vec<String> {
    let secs = elapsed.map_or_else(
        || run.batches.iter().map(|b| b.record.duration_s).sum(),
        |d| d.as_secs_f64(),
    );
    let by_status = status_counts(run);
    let (mut total, mut passed, mut failed, mut errors, mut skipped) = (0, 0, 0, 0, 0);
    for t in run.batches.iter().map(|b| &b.record.tests) {
        total += t.total;
        passed += t.passed;
        failed += t.failed;
        errors += t.errors;
        skipped += t.skipped;
    }
    let n = run.batches.len();
    let mut lines = vec![format!(
        "summary [{secs:>7.1}s] {n} batch{} run: {}; {total} tests: {passed} passed, {failed} failed, {errors} errors, {skipped} skipped",
        if n == 1 { "" } else { "es" },
        if by_status.is_empty() {
            "none".to_string()
        } else {
            by_status.join(", ")
        }
    )];
    let unlisted = batch_lines(run, &mut lines);
    lines.extend(not_run_line(run));
    if unlisted > 0 {
        lines.push(format!(
            "… and {unlisted} more failing test(s); see {}",
            run.reports.join("summary.md").display()
        ));
    }
    if let Some(sig) = run.stopped_by {
        lines.push(format!("the run was stopped by {sig}"));
    }
    lines.extend(crate::report::reporter::hardware::closing_line(
        &run.batches,
    ));
    if !run.batches.is_empty() {
        lines.push(format!(
            "reports: {}, with a picture of the run in {}",
            run.reports.join("summary.md").display(),
            run.reports
                .join(crate::report::reporter::summary::TIMELINE_FILE)
                .display()
        ));
    }
    lines
}

/// How many batches ended how, for the summary line: `3 passed (1 flaky), 2 failed
/// (1 soft_fail)`.
fn status_counts(run: &RunResult) -> Vec<String> {
    use crate::report::outcome::Status;
    let mut by_status: Vec<String> = Vec::new();
    for status in [
        Status::Passed,
        Status::Failed,
        Status::Timeout,
        Status::Cancelled,
        Status::InfraError,
        Status::ImageRefused,
        Status::Capacity,
        Status::NotRun,
    ] {
        let of: Vec<&BatchResult> = run
            .batches
            .iter()
            .filter(|b| b.status() == status)
            .collect();
        if of.is_empty() {
            continue;
        }
        // What the counts hold that does not read as a plain pass or failure.
        let flaky = of.iter().filter(|b| b.record.flaky).count();
        let soft = of
            .iter()
            .filter(|b| b.record.soft_fail && !b.record.counts_against_run())
            .count();
        let note = match (flaky, soft) {
            (0, 0) => String::new(),
            (f, 0) => format!(" ({f} flaky)"),
            (_, s) => format!(" ({s} soft_fail)"),
        };
        by_status.push(format!("{} {}{note}", of.len(), status.as_str()));
    }
    by_status
}

/// Each batch's closing lines (flaky, each failing test, how it ended when neither
/// passed nor failed), the failing tests at most [`MAX_CLOSING_FAILURES`]; returns how
/// many failing tests were left out.
fn batch_lines(run: &RunResult, lines: &mut Vec<String>) -> usize {
    use crate::report::junit::CaseStatus;
    use crate::report::outcome::Status;
    let mut listed = 0;
    let mut unlisted = 0;
    for b in &run.batches {
        let r = &b.record;
        if r.status == Status::NotRun {
            continue;
        }
        if r.flaky {
            lines.push(format!(
                "{:>8} [{:>7.1}s] {} (passed on attempt {})",
                "FLAKY", r.duration_s, r.batch, r.attempts
            ));
        }
        let soft = if r.soft_fail && !r.counts_against_run() {
            " (soft_fail)"
        } else {
            ""
        };
        for c in b.failing() {
            if listed == MAX_CLOSING_FAILURES {
                unlisted += 1;
                continue;
            }
            listed += 1;
            let word = if c.status == CaseStatus::Error {
                "ERROR"
            } else {
                "FAIL"
            };
            lines.push(format!(
                "{word:>8} [{:>7.1}s] {} {}{soft}",
                c.time_s.unwrap_or(0.0),
                r.batch,
                c.id()
            ));
        }
        let message = r
            .message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        if !matches!(r.status, Status::Passed | Status::Failed) {
            lines.push(format!(
                "{:>8} [{:>7.1}s] {}{soft}{message}",
                r.status.as_str().to_uppercase(),
                r.duration_s,
                r.batch,
            ));
        } else if r.status == Status::Failed && b.failing().next().is_none() {
            // Failed without a failing test case: a step, a missing or broken report.
            lines.push(format!(
                "{:>8} [{:>7.1}s] {}{soft}{message}",
                "FAIL", r.duration_s, r.batch,
            ));
        }
    }
    unlisted
}

/// One line for the batches that did not run, however many: a layer of hundreds
/// stopped at its first failure.
fn not_run_line(run: &RunResult) -> Option<String> {
    use crate::report::outcome::Status;
    let not_run: Vec<&BatchResult> = run
        .batches
        .iter()
        .filter(|b| b.record.status == Status::NotRun)
        .collect();
    let first = not_run.first()?;
    let n = not_run.len();
    let shown: Vec<&str> = not_run
        .iter()
        .take(10)
        .map(|b| b.record.batch.as_str())
        .collect();
    let more = if n > shown.len() {
        format!(", … ({n} in all)")
    } else {
        String::new()
    };
    Some(format!(
        "{:>8} {}{more}: {}",
        "NOT RUN",
        shown.join(", "),
        first.record.message.as_deref().unwrap_or("not started")
    ))
}

/// How to replay each batch that did not pass, and whose container ran (a replay of a
/// batch that never got its GPUs, its image or a started container would only meet the
/// same host again).
pub fn replay_lines(run: &RunResult) -> Vec<String> {
    run.batches
        .iter()
        .filter(|b| !b.passed() && !never_ran(&b.record))
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

impl<O: Sink, E: Sink> Terminal<O, E> {
    /// What the sweep before the run found and removed.
    fn swept(&mut self, scope: &str, swept: &Swept) {
        for line in sweep_lines(swept) {
            self.say(line.as_bytes());
        }
        if !swept.removed.is_empty() {
            self.info(&format!(
                "removed {} leftover container(s) of dead runs (this run's scope: {scope})",
                swept.removed.len()
            ));
        }
    }

    /// The run starts: prefix output when several batches run; name the partition.
    fn run_started(&mut self, plan: &crate::plan::RunPlan, now: Duration) {
        self.prefixed = plan.batches.len() > 1;
        self.started = Some(now);
        if let Some((part, of)) = plan.partition {
            let serial: Duration = plan.batches.iter().map(|b| b.expected).sum();
            self.info(&format!(
                "partition {part}: {} of {of} batches, expected to take {} one after another",
                plan.batches.len(),
                human(serial)
            ));
        }
    }

    /// The run's closing and replay lines, settled before the command's own.
    fn run_ended(&mut self, run: &RunResult, now: Duration) {
        let elapsed = self.started.map(|t| now.saturating_sub(t));
        for line in closing_lines(run, elapsed) {
            self.info(&line);
        }
        for line in replay_lines(run) {
            self.info(&line);
        }
        // Whatever comes next (the command's own lines, exit) comes after.
        self.out.settle();
        self.err.settle();
    }
}

impl<O: Sink, E: Sink> Reporter for Terminal<O, E> {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        self.now = event.elapsed;
        match &event.kind {
            EventKind::Swept { scope, swept } => self.swept(scope, swept),
            EventKind::RunStarted { plan, .. } => self.run_started(plan, event.elapsed),
            EventKind::Waiting { batch, report } => self.waiting(batch, *report),
            EventKind::LeaseGranted { batch, gpus } => {
                self.waits.remove(&batch.name);
                // A wait that was told is told when it ends.
                if let Some(since) = self.waited.remove(&batch.name) {
                    let got: Vec<String> = gpus.iter().map(|g| g.index.to_string()).collect();
                    self.info(&format!(
                        "batch {}: got GPU(s) {} after waiting {}",
                        batch.name,
                        got.join(", "),
                        human(event.elapsed.saturating_sub(since))
                    ));
                }
            }
            EventKind::ContainerStarted { batch, .. } => {
                let now = event.elapsed;
                self.alive.insert(
                    batch.name.clone(),
                    Alive {
                        started: now,
                        last_output: None,
                        last_said: now,
                    },
                );
            }
            EventKind::Tick { batch } => self.beat(&batch.name),
            EventKind::Phase {
                batch,
                phase,
                at,
                detail,
            } => {
                let line = match batch {
                    Some(b) => format!(
                        "batch {}: {:>9} [{:>6.1}s] {detail}",
                        b.name,
                        phase.as_str(),
                        at.as_secs_f64()
                    ),
                    None => format!("{}: {detail}", phase.as_str()),
                };
                self.debug(&line);
            }
            EventKind::OutputEnded { batch } => {
                self.alive.remove(&batch.name);
            }
            EventKind::Queued {
                batch,
                job,
                state,
                left,
            } => self.queued(&batch.name, job, state, *left),
            EventKind::Output { batch, bytes } => self.output(&batch.name, bytes),
            EventKind::TimedOut { batch } => {
                let text = console::error_lines(
                    &format_args!(
                        "batch {}: timeout after {}; stopping its container",
                        batch.name, batch.timeout
                    ),
                    &[],
                );
                self.say(text.as_bytes());
            }
            EventKind::OutputBroke { batch, error } => {
                if let Some(line) = console::log_line(
                    Level::Warn,
                    "warning: ",
                    &format!("batch {}: log stream broke: {error}", batch.name),
                ) {
                    self.say(line.as_bytes());
                }
            }
            EventKind::BatchFailed { batch, error } => {
                self.waits.remove(&batch.name);
                self.say(console::error_lines(error, error.details()).as_bytes());
                self.failed_said.insert(batch.name.clone());
            }
            EventKind::AttemptEnded {
                batch,
                result,
                next,
            } => {
                self.failed_said.remove(&batch.name);
                let line = attempt_line(&result.record, *next, 1 + batch.retries.count);
                self.info_styled(&line);
            }
            EventKind::BatchEnded { result } => {
                let said = self.failed_said.remove(&result.record.batch);
                self.info_styled(&verdict_line(&result.record, said));
            }
            EventKind::RunEnded { run } => self.run_ended(run, event.elapsed),
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
mod line_tests;
