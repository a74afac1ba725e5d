//! A helper program asked one thing and waited for, bounded by a wall clock and in
//! size, whatever it leaves behind: `buildkite-agent annotate`, a GPU probe, a Slurm
//! query.
//!
//! The program runs in a process group of its own. Its pipes are read (and its input
//! written) in this thread without blocking, until its answer is whole or the deadline
//! passes. When the program exits, the rest of its group is killed at once: a child it
//! left holding its standard output or error would otherwise keep the answer open for
//! as long as it lives. One that left the group (`setsid`) keeps it open at most until
//! the deadline, when the pipes are dropped unread. Past the deadline the whole group is
//! killed. Standard output past its limit is a refusal (the group is killed); standard
//! error past its limit is read and dropped.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;

use super::{ExitWatch, TICK};

/// How long a killed group's leader is waited for, at most: one stuck in the kernel
/// (a wedged driver) cannot die, and is left unreaped rather than waited for.
const REAP_GRACE: Duration = Duration::from_secs(2);

/// How long pipes held by a killed group may take to close.
const KILLED_GRACE: Duration = Duration::from_secs(1);

/// What a run may take.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// When it must have answered, whole.
    pub deadline: Instant,
    /// The most bytes of standard output taken; one more is a refusal.
    pub max_stdout: usize,
    /// The most bytes of standard error kept; the rest is read and dropped.
    pub max_stderr: usize,
}

/// A program's whole answer.
#[derive(Debug)]
pub struct Answer {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    /// At most [`Bounds::max_stderr`] bytes of it.
    pub stderr: Vec<u8>,
}

/// Why there is no answer; the group is gone (or killed) in every case.
#[derive(Debug, thiserror::Error)]
pub enum BoundedError {
    #[error("could not start: {0}")]
    Spawn(#[source] std::io::Error),
    /// It was still running at the deadline.
    #[error("did not answer in time")]
    Timeout,
    /// It exited, but something it started outside its group held its output open past
    /// the deadline.
    #[error("exited, but a process it left held its output open past the deadline")]
    Held,
    #[error("answered more than {max} bytes")]
    TooLarge { max: usize },
    #[error("{0}")]
    Io(#[source] std::io::Error),
}

/// Runs `cmd` (its standard streams replaced) with `input` on its standard input
/// (none: `/dev/null`), within `bounds`.
pub fn run(cmd: Command, input: &[u8], bounds: Bounds) -> Result<Answer, BoundedError> {
    Running::start(cmd, !input.is_empty())
        .map_err(BoundedError::Spawn)?
        .finish(input, bounds)
}

/// A program started, in a process group of its own; killed with its group when it is
/// let go unfinished.
pub struct Running {
    child: std::process::Child,
    /// The group's ID: the leader's PID, which names the group for as long as the leader
    /// is not reaped (a zombie included), so a signal to it reaches nobody else's.
    group: Pid,
}

impl Running {
    /// Starts `cmd`, its standard streams replaced: pipes, and `/dev/null` for its
    /// input unless `with_input`.
    pub fn start(mut cmd: Command, with_input: bool) -> std::io::Result<Running> {
        cmd.stdin(if with_input {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
        let child = cmd.spawn()?;
        let group = Pid::from_raw(child.id() as i32);
        Ok(Running { child, group })
    }

    /// Kills the group now and reaps the leader.
    pub fn kill(mut self) {
        let _ = killpg(self.group, Signal::SIGKILL);
        reap(&mut self.child);
    }

    /// Writes `input`, reads the answer and waits for the exit, within `bounds`; the
    /// group is killed in every case.
    pub fn finish(mut self, input: &[u8], bounds: Bounds) -> Result<Answer, BoundedError> {
        let mut streams = Streams {
            stdin: self.child.stdin.take().map(|s| (s, 0)),
            stdout: self.child.stdout.take(),
            stderr: self.child.stderr.take(),
            out: Vec::new(),
            err: Vec::new(),
        };
        // A write to a program that has gone must be EPIPE here, not the end of cibox
        // (whose SIGPIPE is the default, to die quietly on a closed standard output).
        let mask = PipeSignal::block();
        let result = drive(&mut streams, input, self.group, bounds);
        drop(mask);
        drop(streams.stdin.take());
        drop(streams.stdout.take());
        drop(streams.stderr.take());
        // The leader is a zombie or alive here, so its PID still names the group.
        let _ = killpg(self.group, Signal::SIGKILL);
        let status = reap(&mut self.child);
        match (result, status) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(status)) => Ok(Answer {
                status,
                stdout: streams.out,
                stderr: streams.err,
            }),
            (Ok(()), None) => Err(BoundedError::Io(std::io::Error::other(
                "its exit status was lost",
            ))),
        }
    }
}

/// The pipes to a program and what came out of them.
struct Streams {
    /// Its input, and how much of it was written.
    stdin: Option<(std::process::ChildStdin, usize)>,
    stdout: Option<std::process::ChildStdout>,
    stderr: Option<std::process::ChildStderr>,
    out: Vec<u8>,
    err: Vec<u8>,
}

/// Moves bytes until the answer is whole (the leader exited, both pipes at their end)
/// or a bound is passed.
fn drive(s: &mut Streams, input: &[u8], group: Pid, b: Bounds) -> Result<(), BoundedError> {
    for fd in [
        s.stdin.as_ref().map(|(p, _)| p.as_fd()),
        s.stdout.as_ref().map(AsFd::as_fd),
        s.stderr.as_ref().map(AsFd::as_fd),
    ]
    .into_iter()
    .flatten()
    {
        rustix::io::ioctl_fionbio(fd, true).map_err(|e| BoundedError::Io(e.into()))?;
    }
    let mut watch = ExitWatch::of(group);
    // When the leader's exit was seen.
    let mut exited: Option<Instant> = None;
    loop {
        if exited.is_none() && leader_exited(group) {
            exited = Some(Instant::now());
            watch.done();
            // What it left behind has no answer to give.
            let _ = killpg(group, Signal::SIGKILL);
        }
        // What the pipes hold now first: an answer whole at the deadline (the waiting
        // thread stopped, a slow host) is an answer.
        pump(&mut s.stdout, &mut s.out, b.max_stdout, true)?;
        pump(&mut s.stderr, &mut s.err, b.max_stderr, false)?;
        feed(&mut s.stdin, input);
        if exited.is_some() && s.stdout.is_none() && s.stderr.is_none() {
            return Ok(());
        }
        let now = Instant::now();
        // Past the deadline: a leader still running is a timeout; one that exited gets
        // a moment for what its group held to die with the kill, and is then given up.
        let until = match exited {
            None => b.deadline,
            Some(at) => b.deadline.max(at + KILLED_GRACE),
        };
        if now >= until {
            return Err(match exited {
                Some(_) => BoundedError::Held,
                None => BoundedError::Timeout,
            });
        }
        let wait = (until - now).min(match &watch.0 {
            Some(_) => Duration::from_secs(1),
            None => TICK,
        });
        wait_for_any(s, watch.0.as_ref().map(AsFd::as_fd), wait);
    }
}

/// Whether the leader has exited, without reaping it (its PID must go on naming the
/// group until the group is killed). One reaped elsewhere counts as exited.
fn leader_exited(group: Pid) -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    !matches!(waitid(Id::Pid(group), flags), Ok(WaitStatus::StillAlive))
}

/// Sleeps until a pipe (or the leader's exit) has something, or `wait` passes.
fn wait_for_any(s: &Streams, exit: Option<BorrowedFd<'_>>, wait: Duration) {
    let mut fds: Vec<PollFd> = Vec::with_capacity(4);
    if let Some((p, _)) = &s.stdin {
        fds.push(PollFd::new(p.as_fd(), PollFlags::POLLOUT));
    }
    for fd in [
        s.stdout.as_ref().map(AsFd::as_fd),
        s.stderr.as_ref().map(AsFd::as_fd),
        exit,
    ]
    .into_iter()
    .flatten()
    {
        fds.push(PollFd::new(fd, PollFlags::POLLIN));
    }
    let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
    let _ = poll(&mut fds, timeout);
}

/// Reads what a pipe holds now; at its end (or on an error) the pipe is dropped. Past
/// `max`, standard output (`refuse`) is a refusal, standard error is dropped.
fn pump<R: Read>(
    pipe: &mut Option<R>,
    into: &mut Vec<u8>,
    max: usize,
    refuse: bool,
) -> Result<(), BoundedError> {
    let Some(p) = pipe else { return Ok(()) };
    let mut buf = [0u8; 64 * 1024];
    loop {
        match p.read(&mut buf) {
            Ok(0) => {
                *pipe = None;
                return Ok(());
            }
            Ok(n) => {
                let room = max.saturating_sub(into.len());
                if n > room && refuse {
                    return Err(BoundedError::TooLarge { max });
                }
                into.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                *pipe = None;
                return Ok(());
            }
        }
    }
}

/// Writes what the pipe takes now of the input left; closes it when all is written or
/// the program stopped reading.
fn feed(pipe: &mut Option<(std::process::ChildStdin, usize)>, input: &[u8]) {
    let Some((p, done)) = pipe else { return };
    while *done < input.len() {
        match p.write(&input[*done..]) {
            Ok(n) => *done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    *pipe = None;
}

/// Reaps a killed leader, waiting at most [`REAP_GRACE`]; `None` when it could not be.
fn reap(child: &mut std::process::Child) -> Option<ExitStatus> {
    let until = Instant::now() + REAP_GRACE;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < until => std::thread::sleep(TICK),
            _ => return None,
        }
    }
}

/// SIGPIPE blocked in this thread while it lives; one raised meanwhile (a write to a
/// program that had gone) is taken before the mask is restored.
struct PipeSignal(nix::sys::signal::SigSet);

impl PipeSignal {
    fn block() -> PipeSignal {
        use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
        let mut pipe = SigSet::empty();
        pipe.add(Signal::SIGPIPE);
        let mut old = SigSet::empty();
        let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&pipe), Some(&mut old));
        PipeSignal(old)
    }
}

impl Drop for PipeSignal {
    fn drop(&mut self) {
        use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
        if !self.0.contains(Signal::SIGPIPE) {
            let mut pipe = SigSet::empty();
            pipe.add(Signal::SIGPIPE);
            let zero = nix::libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: a valid signal set and timespec, no siginfo wanted.
            while unsafe { nix::libc::sigtimedwait(pipe.as_ref(), std::ptr::null_mut(), &zero) } > 0
            {
            }
        }
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.0), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    fn within(secs: u64) -> Bounds {
        Bounds {
            deadline: Instant::now() + Duration::from_secs(secs),
            max_stdout: 1 << 20,
            max_stderr: 4096,
        }
    }

    #[test]
    fn an_answer_is_read_whole_with_its_input_and_status() {
        let a = run(sh("cat; echo oops >&2; exit 3"), b"hello", within(60)).unwrap();
        assert_eq!(a.stdout, b"hello");
        assert_eq!(a.stderr, b"oops\n");
        assert_eq!(a.status.code(), Some(3));
        // Input a program never reads, more than a pipe holds: no SIGPIPE, no hang.
        let a = run(sh("exit 0"), &vec![b'x'; 1 << 20], within(60)).unwrap();
        assert!(a.status.success());
    }

    /// A grandchild sleeping 300 s holds the program's pipes: the answer must not wait
    /// for it (the bound asserted is a behaviour, far under the sleep, not a timing).
    #[test]
    fn a_child_left_holding_the_pipes_does_not_hold_the_answer() {
        let started = Instant::now();
        let a = run(sh("sleep 300 & echo answer; exit 0"), b"", within(200)).unwrap();
        assert_eq!(a.stdout, b"answer\n");
        assert!(started.elapsed() < Duration::from_secs(100));
        // One that left the group: the pipes are given up at the deadline.
        let started = Instant::now();
        let pid_file = tempfile::NamedTempFile::new().unwrap();
        let script = format!(
            "setsid sh -c 'echo $$ > {}; exec sleep 300' & sleep 0.5; echo answer",
            pid_file.path().display()
        );
        let e = run(sh(&script), b"", within(3)).unwrap_err();
        assert!(matches!(e, BoundedError::Held), "{e}");
        assert!(started.elapsed() < Duration::from_secs(100));
        if let Ok(pid) = std::fs::read_to_string(pid_file.path())
            .unwrap_or_default()
            .trim()
            .parse::<i32>()
        {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        // A program still running at the deadline: killed with its group.
        let started = Instant::now();
        let e = run(sh("sleep 300 & sleep 300"), b"", within(2)).unwrap_err();
        assert!(matches!(e, BoundedError::Timeout), "{e}");
        assert!(started.elapsed() < Duration::from_secs(100));
    }

    /// The waiting thread stopped (Ctrl-Z, a loaded host) past the deadline while the
    /// program answered and exited: its answer stands.
    #[test]
    fn an_answer_whole_when_the_deadline_is_seen_stands() {
        let running = Running::start(sh("echo answer"), false).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let a = running
            .finish(
                b"",
                Bounds {
                    deadline: Instant::now(),
                    ..within(0)
                },
            )
            .unwrap();
        assert_eq!(a.stdout, b"answer\n");
    }

    #[test]
    fn an_answer_past_its_bound_is_refused_and_an_error_stream_cut() {
        let e = run(
            sh("head -c 100000000 /dev/zero"),
            b"",
            Bounds {
                max_stdout: 1 << 20,
                ..within(100)
            },
        )
        .unwrap_err();
        assert!(matches!(e, BoundedError::TooLarge { max: 1048576 }), "{e}");
        let a = run(
            sh("head -c 1000000 /dev/zero >&2; echo ok"),
            b"",
            within(100),
        )
        .unwrap();
        assert_eq!(a.stderr.len(), 4096);
        assert_eq!(a.stdout, b"ok\n");
    }
}
