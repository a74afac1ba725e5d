//! Everything cibox prints: data on stdout (tables or `--json`), diagnostics on stderr
//! with a `cibox:` prefix, filtered by `CIBOX_LOG` (error, warn, info, debug) or `-v`.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU8, Ordering};

use std::fmt::Display;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

/// Whether stderr gets colour (docs/interface.md): `CLICOLOR_FORCE` set and not `0`
/// forces it, even over `NO_COLOR`; else there is none where `NO_COLOR` is set and not
/// empty (no-color.org) or `CLICOLOR` is `0` (bixense.com/clicolors), and else only on
/// a terminal whose `TERM` is not `dumb`.
///
/// Not anstream's own choice, which differs: there `NO_COLOR` wins over
/// `CLICOLOR_FORCE`, a terminal without `TERM` gets none, and a `CI` variable gets some.
fn colour_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| colour_wanted(std::io::stderr().is_terminal()))
}

/// [`colour_on`]'s rules, for stderr that is a `terminal` or not.
fn colour_wanted(terminal: bool) -> bool {
    let forced = anstyle_query::clicolor_force()
        && std::env::var_os("CLICOLOR_FORCE").is_some_and(|v| v != "0");
    forced
        || (!anstyle_query::no_color()
            && anstyle_query::clicolor() != Some(false)
            && std::env::var_os("TERM").is_none_or(|t| t != "dumb")
            && terminal)
}

/// A colour for [`paint`], always bold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    Red,
    Yellow,
    Green,
}

impl Colour {
    fn style(self) -> anstyle::Style {
        let colour = match self {
            Colour::Red => anstyle::AnsiColor::Red,
            Colour::Yellow => anstyle::AnsiColor::Yellow,
            Colour::Green => anstyle::AnsiColor::Green,
        };
        anstyle::Style::new().bold().fg_color(Some(colour.into()))
    }

    /// `text` in this colour when `on`; else as it is.
    fn paint(self, text: &str, on: bool) -> String {
        if on {
            let style = self.style();
            format!("{style}{text}{style:#}")
        } else {
            text.to_string()
        }
    }
}

/// `text` in `colour` (bold), where stderr takes colour; else as it is. For cibox's
/// own words: what it quotes goes through [`Styled`], which escapes it first.
pub fn paint(text: &str, colour: Colour) -> String {
    colour.paint(text, colour_on())
}

/// A line of cibox's in pieces, some in colour. What the pieces quote (a batch's name,
/// a message) is escaped as [`crate::util::escape`] does when the line is written, and
/// only then is the colour added: escaping a painted string would print its paint as
/// text (`\u{1b}[1;32mpassed\u{1b}[0m`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Styled(Vec<(String, Option<Colour>)>);

impl Styled {
    pub fn new() -> Styled {
        Styled::default()
    }

    /// Adds `text`, uncoloured.
    pub fn text(mut self, text: impl Into<String>) -> Styled {
        self.0.push((text.into(), None));
        self
    }

    /// Adds `text` in `colour`, where stderr takes colour.
    pub fn paint(mut self, text: impl Into<String>, colour: Colour) -> Styled {
        self.0.push((text.into(), Some(colour)));
        self
    }

    /// The line: each piece escaped, then painted where `colour`.
    pub fn render(&self, colour: bool) -> String {
        self.0
            .iter()
            .map(|(text, paint)| {
                let text = crate::util::escape(text);
                match paint {
                    Some(c) => c.paint(&text, colour),
                    None => text.into_owned(),
                }
            })
            .collect()
    }
}

/// Without colour, as a log file shows it.
impl std::fmt::Display for Styled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render(false))
    }
}

/// Sets the log level from `CIBOX_LOG`, raised by each `-v`.
pub fn init(verbose: u8) {
    let base = match std::env::var("CIBOX_LOG").ok().as_deref().map(str::trim) {
        Some("error") => Level::Error,
        Some("warn") => Level::Warn,
        Some("debug") | Some("trace") => Level::Debug,
        _ => Level::Info,
    } as u8;
    LEVEL.store((base + verbose).min(Level::Debug as u8), Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

fn log(level: Level, prefix: &str, msg: &str) {
    if let Some(line) = log_line(level, prefix, msg) {
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// The line [`info`], [`warn`] or [`debug`] would print (newline included), when its
/// level is shown: for who writes stderr in its own way. `msg` is escaped.
pub fn log_line(level: Level, prefix: &str, msg: &str) -> Option<String> {
    styled_line(level, prefix, &Styled::new().text(msg))
}

/// [`log_line`] of a line with colours of its own.
pub fn styled_line(level: Level, prefix: &str, msg: &Styled) -> Option<String> {
    enabled(level).then(|| line_of(prefix, msg, colour_on()))
}

fn line_of(prefix: &str, msg: &Styled, colour: bool) -> String {
    let prefix = match prefix {
        "warning: " => Styled::new().paint("warning:", Colour::Yellow).text(" "),
        other => Styled::new().text(other),
    };
    format!("cibox: {}{}\n", prefix.render(colour), msg.render(colour))
}

pub fn warn(msg: impl AsRef<str>) {
    log(Level::Warn, "warning: ", msg.as_ref());
}

pub fn info(msg: impl AsRef<str>) {
    log(Level::Info, "", msg.as_ref());
}

pub fn debug(msg: impl AsRef<str>) {
    log(Level::Debug, "", msg.as_ref());
}

/// The error headline (always shown) and its detail lines.
pub fn error(headline: &dyn Display, details: &[String]) {
    let _ = std::io::stderr()
        .lock()
        .write_all(error_lines(headline, details).as_bytes());
}

/// The lines [`error`] prints.
pub fn error_lines(headline: &dyn Display, details: &[String]) -> String {
    // One line, whatever a quoted value holds.
    let mut out = format!(
        "cibox: {} {}\n",
        paint("error:", Colour::Red),
        crate::util::escape(&headline.to_string())
    );
    for d in details {
        out.push_str(&format!("  {}\n", crate::util::escape(d)));
    }
    out
}

/// An error as `--json` prints it on stdout, beside its line on stderr:
/// `{"error": {"message", "details", "exit_code"}}`.
pub fn json_error(message: &str, details: &[String], exit_code: u8) {
    json(&serde_json::json!({
        "error": {"message": message, "details": details, "exit_code": exit_code}
    }));
}

/// Prints a value as pretty JSON on stdout; what could drive a terminal (C1 controls,
/// overrides, which serde_json writes as they are) as JSON escapes.
pub fn json<T: serde::Serialize>(value: &T) {
    let text = serde_json::to_string_pretty(value).expect("report values serialise");
    println!("{}", crate::util::escape_json(&text));
}

/// A plain text table: columns padded to their widest cell, the last one left ragged.
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    /// The table's text. Each cell is escaped ([`crate::util::escape`]): what a table
    /// shows comes from manifests, records and probes, and a cell is one line.
    pub fn render(&self) -> String {
        let n = self.headers.len();
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                r.iter()
                    .map(|c| crate::util::escape(c).into_owned())
                    .collect()
            })
            .collect();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |cells: Vec<&str>, out: &mut String| {
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == n {
                    out.push_str(c);
                } else {
                    out.push_str(c);
                    out.push_str(&" ".repeat(widths[i] - c.chars().count() + 2));
                }
            }
            // An empty last cell must not leave the padding behind.
            let trimmed = out.trim_end_matches(' ').len();
            out.truncate(trimmed);
            out.push('\n');
        };
        line(self.headers.clone(), &mut out);
        for r in &rows {
            line(r.iter().map(String::as_str).collect(), &mut out);
        }
        out
    }
}

/// Shows that something waits (for GPUs, say): a live line on a terminal (redrawn every
/// 0.5 s, cleared when the wait ends), else a log line every 30 s, the first at once so
/// a CI log says why it is waiting.
pub struct WaitLine {
    live: bool,
    next: Instant,
    shown: bool,
}

impl WaitLine {
    /// `live` only where a person watches one wait at a time.
    pub fn new(live: bool) -> WaitLine {
        WaitLine {
            live,
            // A live line only for waits a person notices.
            next: Instant::now()
                + if live {
                    Duration::from_millis(500)
                } else {
                    Duration::ZERO
                },
            shown: false,
        }
    }

    /// A wait line for stderr: live when stderr is a terminal.
    pub fn on_stderr() -> WaitLine {
        WaitLine::new(std::io::stderr().is_terminal())
    }

    /// Shows `line(report)` if it is time to; the report is built only then.
    pub fn tick<R>(&mut self, report: &dyn Fn() -> R, line: impl Fn(&R) -> String) {
        if let Some(text) = self.due(report, line) {
            if self.live {
                // What it says quotes lock files and tickets anyone may write.
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2Kcibox: {}", crate::util::escape(&text));
                let _ = err.flush();
            } else {
                info(text);
            }
        }
    }

    /// `line(report)` when it is time to show it (the report is built only then), for
    /// who shows it in its own way.
    pub fn due<R>(
        &mut self,
        report: &dyn Fn() -> R,
        line: impl Fn(&R) -> String,
    ) -> Option<String> {
        if Instant::now() < self.next {
            return None;
        }
        self.next = Instant::now()
            + if self.live {
                Duration::from_millis(500)
            } else {
                Duration::from_secs(30)
            };
        self.shown = true;
        Some(line(&report()))
    }

    /// Clears a live line; the wait is over.
    pub fn finish(&mut self) {
        if self.live && self.shown {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
            self.shown = false;
        }
    }
}

/// Says that long work still goes on: every `every` that nothing else was said, a line
/// `WHAT: 40s so far` on stderr, from a thread of its own, until dropped.
pub struct Ticker {
    state: std::sync::Arc<(std::sync::Mutex<TickState>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct TickState {
    what: Option<String>,
    since: Instant,
    said: Instant,
    done: bool,
}

impl Ticker {
    pub fn start(every: Duration) -> Ticker {
        let now = Instant::now();
        let state = std::sync::Arc::new((
            std::sync::Mutex::new(TickState {
                what: None,
                since: now,
                said: now,
                done: false,
            }),
            std::sync::Condvar::new(),
        ));
        let shared = state.clone();
        let thread = std::thread::Builder::new()
            .name("ticker".into())
            .spawn(move || {
                let (lock, wake) = &*shared;
                let mut s = lock
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                while !s.done {
                    let due = s.said + every;
                    let now = Instant::now();
                    if now < due {
                        s = wake
                            .wait_timeout(s, due - now)
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .0;
                        continue;
                    }
                    s.said = now;
                    if let Some(what) = &s.what {
                        info(format!(
                            "{what}: {} so far",
                            crate::units::human(now.duration_since(s.since))
                        ));
                    }
                }
            })
            .ok();
        Ticker { state, thread }
    }

    /// The work under way now (said, so the next line is one period away).
    pub fn doing(&self, what: impl Into<String>) {
        let mut s = self
            .state
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.what = Some(what.into());
        s.since = Instant::now();
        s.said = s.since;
    }

    /// Something else was said: the next line is one period away.
    pub fn said(&self) {
        let mut s = self
            .state
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.said = Instant::now();
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.state
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .done = true;
        self.state.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_escapes_what_it_quotes_and_then_adds_its_own_colour() {
        // A status word's paint must reach the terminal as paint, while a name that
        // carries escapes of its own is quoted.
        let msg = Styled::new()
            .text("batch \u{1b}[2Jx: ")
            .paint("passed", Colour::Green)
            .text(" (1 tests)");
        assert_eq!(
            line_of("", &msg, true),
            "cibox: batch \\u{1b}[2Jx: \u{1b}[1m\u{1b}[32mpassed\u{1b}[0m (1 tests)\n"
        );
        assert_eq!(
            line_of("", &msg, false),
            "cibox: batch \\u{1b}[2Jx: passed (1 tests)\n"
        );
        assert_eq!(msg.to_string(), "batch \\u{1b}[2Jx: passed (1 tests)");
        let failed = Styled::new().paint("failed\n", Colour::Red);
        assert_eq!(
            line_of("warning: ", &failed, true),
            "cibox: \u{1b}[1m\u{1b}[33mwarning:\u{1b}[0m \u{1b}[1m\u{1b}[31mfailed\\n\u{1b}[0m\n"
        );
    }
}
