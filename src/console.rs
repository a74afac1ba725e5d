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

/// Whether stderr gets colour: a terminal, unless `NO_COLOR` is set (no-color.org) or
/// the terminal is `dumb`; `CLICOLOR_FORCE` (not `0`) forces it anywhere.
fn colour_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
        if std::env::var_os("CLICOLOR_FORCE").is_some_and(|v| !v.is_empty() && v != "0") {
            return true;
        }
        !set("NO_COLOR")
            && std::env::var("TERM").map_or(true, |t| t != "dumb")
            && std::io::stderr().is_terminal()
    })
}

/// A colour for [`paint`].
#[derive(Debug, Clone, Copy)]
pub enum Colour {
    Red,
    Yellow,
    Green,
}

/// `text` in `colour` (bold), where stderr takes colour; else as it is.
pub fn paint(text: &str, colour: Colour) -> String {
    if !colour_on() {
        return text.to_string();
    }
    let code = match colour {
        Colour::Red => "1;31",
        Colour::Yellow => "1;33",
        Colour::Green => "1;32",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
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
/// level is shown: for who writes stderr in its own way.
pub fn log_line(level: Level, prefix: &str, msg: &str) -> Option<String> {
    let prefix = match prefix {
        "warning: " => paint("warning:", Colour::Yellow) + " ",
        other => other.to_string(),
    };
    enabled(level).then(|| format!("cibox: {prefix}{}\n", crate::util::escape(msg)))
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

/// Prints a value as pretty JSON on stdout.
pub fn json<T: serde::Serialize>(value: &T) {
    let text = serde_json::to_string_pretty(value).expect("report values serialise");
    println!("{text}");
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

    pub fn render(&self) -> String {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
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
        for r in &self.rows {
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
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2Kcibox: {text}");
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
