//! What the terminal reporters print, written from a thread of their own.
//!
//! The reporters are called inside the engine's follow callback, which also enforces a
//! batch's timeout and watches for signals, and under the one lock every batch's events
//! share. Writing to a stdout nobody reads (a paused terminal, a stuck log reader)
//! would stall all of that. So a [`Pump`] only queues: its thread writes. A batch's
//! output queued beyond [`OUTPUT_CAP`] is dropped, and a note says where and how much
//! (the batch's `log.txt` still has all of it); cibox's own lines are never dropped,
//! and everything comes out in the order it was queued (so a batch's output stays
//! inside the GitHub workflow commands that fence it).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The most batch output held for a reader that lags.
pub const OUTPUT_CAP: usize = 4 << 20;
/// How long [`Sink::settle`] waits for a reader that takes nothing.
const SETTLE_IDLE: Duration = Duration::from_secs(2);

/// Where a reporter's text goes.
pub trait Sink: Send {
    /// A batch's output: may be dropped when the reader lags.
    fn output(&mut self, bytes: &[u8]);
    /// cibox's own text: never dropped.
    fn line(&mut self, bytes: &[u8]);
    /// Waits until what was queued is written, while the reader takes it.
    fn settle(&mut self) {}
}

/// Straight into the buffer (the reporters' tests).
impl Sink for Vec<u8> {
    fn output(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn line(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

enum Piece {
    Output(Vec<u8>),
    Line(Vec<u8>),
    /// This many bytes of output were dropped here.
    Dropped(u64),
}

#[derive(Default)]
struct State {
    queue: VecDeque<Piece>,
    /// Output bytes in `queue`.
    output: usize,
    /// The writer holds a piece it is writing.
    writing: bool,
    /// Writing failed (the reader is gone): nothing more is queued.
    broken: bool,
    /// Pieces written so far, to tell a reader that takes nothing from a slow one.
    written: u64,
}

struct Shared {
    state: Mutex<State>,
    /// Something was queued.
    queued: Condvar,
    /// Something was written.
    wrote: Condvar,
    cap: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A queue in front of a writer and the thread that writes it; clones share both.
#[derive(Clone)]
pub struct Pump(Arc<Shared>);

impl Pump {
    /// cibox's stdout.
    pub fn stdout() -> Pump {
        Pump::new(|b: &[u8]| {
            let mut out = std::io::stdout().lock();
            out.write_all(b).and_then(|()| out.flush())
        })
    }

    /// cibox's stderr.
    pub fn stderr() -> Pump {
        Pump::new(|b: &[u8]| {
            let mut err = std::io::stderr().lock();
            err.write_all(b).and_then(|()| err.flush())
        })
    }

    /// Queues for `write`, called on the pump's own thread.
    pub fn new(write: impl FnMut(&[u8]) -> std::io::Result<()> + Send + 'static) -> Pump {
        Pump::with_cap(write, OUTPUT_CAP)
    }

    fn with_cap(
        mut write: impl FnMut(&[u8]) -> std::io::Result<()> + Send + 'static,
        cap: usize,
    ) -> Pump {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            queued: Condvar::new(),
            wrote: Condvar::new(),
            cap,
        });
        let theirs = shared.clone();
        // Not joined: a write that never returns must not keep cibox from exiting.
        std::thread::spawn(move || {
            loop {
                let piece = {
                    let mut s = theirs.lock();
                    while s.queue.is_empty() {
                        s = theirs
                            .queued
                            .wait(s)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                    let piece = s.queue.pop_front().expect("not empty");
                    if let Piece::Output(b) = &piece {
                        s.output -= b.len();
                    }
                    s.writing = true;
                    piece
                };
                let written = match &piece {
                    Piece::Output(b) | Piece::Line(b) => write(b),
                    Piece::Dropped(n) => write(dropped_note(*n).as_bytes()),
                };
                let mut s = theirs.lock();
                s.writing = false;
                s.written += 1;
                if written.is_err() {
                    s.broken = true;
                    s.queue.clear();
                    s.output = 0;
                }
                theirs.wrote.notify_all();
                if s.broken {
                    return;
                }
            }
        });
        Pump(shared)
    }

    fn push(&self, piece: Piece) {
        let mut s = self.0.lock();
        if s.broken {
            return;
        }
        match piece {
            Piece::Output(b) if s.output + b.len() > self.0.cap => {
                let n = b.len() as u64;
                match s.queue.back_mut() {
                    Some(Piece::Dropped(m)) => *m += n,
                    _ => s.queue.push_back(Piece::Dropped(n)),
                }
            }
            Piece::Output(b) => {
                s.output += b.len();
                s.queue.push_back(Piece::Output(b));
            }
            other => s.queue.push_back(other),
        }
        self.0.queued.notify_one();
    }
}

impl Sink for Pump {
    fn output(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.push(Piece::Output(bytes.to_vec()));
        }
    }

    fn line(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.push(Piece::Line(bytes.to_vec()));
        }
    }

    /// Waits until the queue is written, as long as the reader keeps taking it: one
    /// that takes nothing for [`SETTLE_IDLE`] is left behind.
    fn settle(&mut self) {
        let mut s = self.0.lock();
        let mut progress = (s.written, Instant::now());
        while !s.broken && (s.writing || !s.queue.is_empty()) {
            if s.written != progress.0 {
                progress = (s.written, Instant::now());
            }
            let Some(left) = SETTLE_IDLE.checked_sub(progress.1.elapsed()) else {
                return;
            };
            s = self
                .0
                .wrote
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

fn dropped_note(n: u64) -> String {
    format!(
        "\n[cibox: {n} bytes of output not shown here: they were not read fast enough; the batch's log.txt has all of it]\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_reader_that_stalls_loses_output_past_the_cap_never_lines_nor_order() {
        // The writer blocks on its first piece until told; meanwhile everything queues.
        let (go, wait) = mpsc::channel::<()>();
        let (seen_tx, seen) = mpsc::channel::<Vec<u8>>();
        let mut first = true;
        let mut pump = Pump::with_cap(
            move |b: &[u8]| {
                if std::mem::take(&mut first) {
                    wait.recv().unwrap();
                }
                seen_tx.send(b.to_vec()).unwrap();
                Ok(())
            },
            10,
        );
        pump.line(b"<start>");
        pump.output(b"0123456789"); // queued while <start> is being written: fits
        pump.output(b"abc"); // over the cap: dropped
        pump.output(b"de"); // dropped too, counted with it
        pump.line(b"<end>");
        go.send(()).unwrap();
        pump.settle();
        let got: Vec<Vec<u8>> = seen.try_iter().collect();
        let text = String::from_utf8(got.concat()).unwrap();
        assert_eq!(
            text,
            format!("<start>0123456789{}<end>", dropped_note(5)),
            "{text}"
        );
    }

    #[test]
    fn a_reader_that_is_gone_takes_nothing_more_and_keeps_nobody_waiting() {
        let mut pump = Pump::new(|_: &[u8]| Err(std::io::ErrorKind::BrokenPipe.into()));
        pump.line(b"x");
        pump.settle();
        pump.output(b"y");
        pump.settle();
        let s = pump.0.lock();
        assert!(s.broken && s.queue.is_empty());
    }
}
