//! A command as a workload: started in its own process group, watched until every
//! process of it is gone, torn down in order (SIGTERM, a grace period, SIGKILL).
//! [`confine`] decides where it runs (a PID namespace, or under a subreaper) and binds
//! it to cibox's life.
//!
//! On an interactive terminal the command's group becomes the terminal's foreground
//! group, as a shell does for a job: otherwise a command that reads the terminal (a
//! REPL, a `pdb` breakpoint) would be stopped by SIGTTIN and wait forever. Ctrl-C then
//! reaches the command directly, and Ctrl-Z stops cibox with it.

pub mod bounded;
pub mod confine;

use std::os::unix::io::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::signals;

/// How a supervised command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The command exited with this code.
    Exited(i32),
    /// The command was killed by this signal.
    Killed(i32),
    /// cibox received this signal and tore the group down.
    Interrupted(Signal),
}

/// How often the supervisor looks at the child and the signal flag.
pub(crate) const TICK: Duration = Duration::from_millis(10);

/// A child's exit as a descriptor to wait on (a pidfd, Linux 5.3+), so the loops that
/// poll a child every [`TICK`] notice its exit at once: a hand-off waits for three
/// such loops (the namespace's init, the supervisor, cibox). Without a pidfd they fall
/// back to the tick.
pub(crate) struct ExitWatch(Option<std::os::fd::OwnedFd>);

impl ExitWatch {
    pub(crate) fn of(pid: Pid) -> ExitWatch {
        use rustix::process::{PidfdFlags, pidfd_open};
        // (pidfds are close-on-exec.)
        let fd = rustix::process::Pid::from_raw(pid.as_raw().max(0))
            .and_then(|pid| pidfd_open(pid, PidfdFlags::empty()).ok());
        ExitWatch(fd)
    }

    /// Stops watching: an exited child's pidfd stays readable, and a loop that goes on
    /// after the exit must not spin.
    pub(crate) fn done(&mut self) {
        self.0 = None;
    }

    /// Sleeps for `tick`, or less when the child exits.
    pub(crate) fn pause(&self, tick: Duration) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        match &self.0 {
            Some(fd) => {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                let timeout = PollTimeout::try_from(tick).unwrap_or(PollTimeout::MAX);
                let _ = poll(&mut fds, timeout);
            }
            None => std::thread::sleep(tick),
        }
    }
}

/// Whether cibox runs in the foreground of a terminal (its standard input).
pub fn in_terminal_foreground() -> bool {
    let stdin = std::io::stdin();
    std::io::IsTerminal::is_terminal(&stdin)
        && nix::unistd::tcgetpgrp(&stdin) == Ok(nix::unistd::getpgrp())
}

/// Makes `pgrp` the foreground group of the terminal on standard input. Called from a
/// background group too, so SIGTTOU (which would stop the caller) is blocked around
/// the call. Async-signal-safe (no allocation), so the child may call it before exec.
pub fn hand_terminal(pgrp: Pid) {
    use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old));
    // SAFETY: fd 0 stays open for the duration of the call.
    let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    let _ = nix::unistd::tcsetpgrp(stdin, pgrp);
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
}

/// A started group: its leader (whose PID is the group's ID), and whether it was given
/// the terminal (to take back).
pub struct Group {
    pub leader: Pid,
    interactive: bool,
}

/// Starts `argv` in a new process group with `env` added, keeping `inherit` open in it,
/// killed if its parent dies; `interactive` gives it the terminal.
pub fn spawn_group(
    argv: &[String],
    env: &[(String, String)],
    inherit: &[RawFd],
    interactive: bool,
) -> std::io::Result<Group> {
    let parent = nix::unistd::getpid();
    let inherit = inherit.to_vec();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(env.iter().cloned())
        .process_group(0);
    // SAFETY: only async-signal-safe calls (prctl, getppid, fcntl, raise, sigmask,
    // tcsetpgrp) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            // The parent may have died before the line above took effect.
            if nix::unistd::getppid() != parent {
                let _ = nix::sys::signal::raise(Signal::SIGKILL);
            }
            keep_open(&inherit)?;
            if interactive {
                // Take the terminal before exec, so the command never reads it from
                // the background.
                hand_terminal(nix::unistd::getpid());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let leader = Pid::from_raw(child.id() as i32);
    if interactive {
        // Also from this side, as shells do: whichever runs first, the result is the same.
        hand_terminal(leader);
    }
    Ok(Group {
        leader,
        interactive,
    })
}

/// Clears close-on-exec on `fds`, so a child about to exec keeps them (the lease's lock
/// files, a report pipe). Async-signal-safe: for `pre_exec`.
pub fn keep_open(fds: &[RawFd]) -> std::io::Result<()> {
    for &fd in fds {
        // SAFETY: the caller owns these descriptors; they stay open for the call.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
    }
    Ok(())
}

/// Makes this process the reaper of orphans it leaves (descendants of its children),
/// so a group's stray workers are reaped here and "the group is gone" can be observed.
pub fn become_subreaper() -> nix::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)
}

fn group_alive(pgid: Pid) -> bool {
    !matches!(killpg(pgid, None), Err(Errno::ESRCH))
}

/// Every live (not zombie) process below `root` in the process tree. The supervisor is
/// a subreaper, so a worker that leaves the group with `setsid` (and closes the lock
/// files it inherited) is still found here: as cibox's child once its parent is gone,
/// or as a grandchild while it lives. Follows `/proc/<pid>/task/<tid>/children`, which
/// visits only the tree itself; walks all of `/proc` where the kernel lacks it.
fn descendants(root: Pid) -> Vec<Pid> {
    match children_of(root.as_raw()) {
        Some(first) => {
            let mut found = Vec::new();
            let mut todo = first;
            while let Some(pid) = todo.pop() {
                if live(pid) {
                    found.push(Pid::from_raw(pid));
                }
                todo.extend(children_of(pid).unwrap_or_default());
            }
            found
        }
        None => descendants_by_walk(root),
    }
}

/// The children of `pid`, from each of its threads; `None` when the kernel does not say.
fn children_of(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    let mut said = false;
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            said = true;
            out.extend(
                text.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    said.then_some(out)
}

/// The state letter and parent of `pid`, from `/proc/<pid>/stat` (`pid (comm) state
/// ppid …`; comm may hold spaces and parentheses).
pub(crate) fn stat(pid: i32) -> Option<(char, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = text.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` is alive and not a zombie.
fn live(pid: i32) -> bool {
    stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
}

fn descendants_by_walk(root: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Some((state, ppid)) = stat(pid)
            && !matches!(state, 'Z' | 'X')
        {
            parent_of.push((pid, ppid));
        }
    }
    let mut found = vec![root.as_raw()];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|(_, ppid)| *ppid == p)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    found.into_iter().skip(1).map(Pid::from_raw).collect()
}

/// Where the processes of a workload are, and so how all of them are signalled and
/// how "none is left" is seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The caller is the init of a PID namespace that holds exactly the workload:
    /// `kill(-1)` reaches all of it, and every orphan is the caller's child.
    Namespace,
    /// The caller is a subreaper: the workload is the group and every descendant.
    Tree,
}

/// The processes a supervisor answers for.
struct Workload {
    scope: Scope,
    pgid: Pid,
    /// The group was seen empty: its ID may be reused, so it is not used again.
    group_gone: bool,
}

impl Workload {
    fn group_alive(&mut self) -> bool {
        if !self.group_gone && !group_alive(self.pgid) {
            self.group_gone = true;
        }
        !self.group_gone
    }

    /// Sends `sig` to every process of the workload.
    fn signal(&mut self, sig: Signal) {
        match self.scope {
            Scope::Namespace => {
                // kill(-1) from the init of a PID namespace reaches the namespace only;
                // from anywhere else it would reach the whole host.
                if nix::unistd::getpid().as_raw() == 1 {
                    let _ = nix::sys::signal::kill(Pid::from_raw(-1), sig);
                }
            }
            Scope::Tree => {
                if self.group_alive() {
                    let _ = killpg(self.pgid, sig);
                }
                for pid in descendants(nix::unistd::getpid()) {
                    let _ = nix::sys::signal::kill(pid, sig);
                }
            }
        }
    }

    /// Whether any process of the workload lives: whether the last reap saw any child
    /// left (`waitpid` did not say ECHILD). In both scopes every process of the
    /// workload is a descendant of the caller, and every orphan is reparented to it (the
    /// init, or the subreaper), so no child at all means none of the workload is left.
    /// A walk of the tree cannot say so (issue 48): it reads one `children` file after
    /// another, and a process whose parent dies between two reads moves to the caller's
    /// list after that list was read, so it is seen nowhere while it lives (or is still
    /// exiting, its memory and devices not yet given back).
    fn alive(&mut self, children_left: bool) -> bool {
        children_left
    }

    /// The processes of the workload left, when every one found is stuck in the kernel
    /// (state `D`: SIGKILLed, it dies only once its system call returns); `None` when
    /// any other is found, or none (the walk may miss some: see [`Workload::alive`]).
    fn only_stuck(&self) -> Option<Vec<Pid>> {
        // In a namespace without its own /proc, the walk would see the host's init.
        if self.scope == Scope::Namespace && nix::unistd::getpid().as_raw() != 1 {
            return None;
        }
        let left = descendants(nix::unistd::getpid());
        let stuck = !left.is_empty()
            && left
                .iter()
                .all(|p| stat(p.as_raw()).is_some_and(|(state, _)| state == 'D'));
        stuck.then_some(left)
    }
}

/// Whom the supervising process answers to.
pub trait Owner {
    /// Whether the owner is gone: the workload is then killed at once.
    fn gone(&mut self) -> bool;
    /// The command was stopped from the terminal (Ctrl-Z; SIGTTIN when it read the
    /// terminal from the background): stop the owner's job too, handing the owner the
    /// terminal only if the command had it (`foreground`), and return once the job is
    /// continued: true in the foreground (`fg`), false in the background (`bg`, where
    /// the terminal stays the shell's).
    fn stop_job(&mut self, foreground: bool) -> bool;
}

/// What one reap saw: the leader's status if it ended, whether it stopped, and whether
/// any child is left.
struct Reaped {
    leader: Option<WaitStatus>,
    stopped: bool,
    children_left: bool,
}

/// Reaps every exited child.
fn reap(group: &Group) -> Reaped {
    let mut seen = Reaped {
        leader: None,
        stopped: false,
        children_left: true,
    };
    loop {
        match waitpid(
            Pid::from_raw(-1),
            Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED),
        ) {
            Ok(WaitStatus::StillAlive) => return seen,
            Err(_) => {
                seen.children_left = false;
                return seen;
            }
            Ok(WaitStatus::Stopped(pid, _)) => {
                if pid == group.leader {
                    seen.stopped = true;
                }
            }
            Ok(status) => {
                if status.pid() == Some(group.leader) {
                    seen.leader = Some(status);
                }
            }
        }
    }
}

/// How long processes of a workload that are stuck in the kernel (state `D`) are
/// waited for after the first SIGKILL: one in a wedged driver may never die, and must
/// not hold `gpu exec` forever (as `engine::containers`' KILL_WAIT for a container).
const STUCK_WAIT: Duration = Duration::from_secs(10);

/// Waits for the leader, forwarding terminating signals to the workload, then makes
/// sure all of it is gone (SIGTERM, `grace`, SIGKILL) before returning. When the owner
/// is gone the workload is killed at once.
pub fn supervise(group: &Group, grace: Duration, scope: Scope, owner: &mut dyn Owner) -> Ending {
    let mut workload = Workload {
        scope,
        pgid: group.leader,
        group_gone: false,
    };
    let mut ending = None;
    let mut kill_at: Option<Instant> = None;
    let mut terminated = false;
    let mut orphaned = false;
    // Past the grace (or orphaned): SIGKILL on every tick while anything lives, so a
    // process forked between a look at the tree and the kill cannot stay.
    let mut killing = false;
    let mut killed_at: Option<Instant> = None;
    let mut leader_exit = ExitWatch::of(group.leader);
    loop {
        let seen = reap(group);
        if seen.stopped && group.interactive {
            // A shell's job control, one level up: the owner's job stops with the
            // command and both go on together, in the foreground only after `fg`.
            let foreground = nix::unistd::tcgetpgrp(std::io::stdin()) == Ok(group.leader);
            if owner.stop_job(foreground) {
                hand_terminal(group.leader);
            }
            let _ = killpg(group.leader, Signal::SIGCONT);
        }
        if let Some(status) = seen.leader {
            leader_exit.done();
            ending.get_or_insert(match status {
                WaitStatus::Exited(_, code) => Ending::Exited(code),
                WaitStatus::Signaled(_, sig, _) => Ending::Killed(sig as i32),
                _ => Ending::Exited(1),
            });
        }
        if !orphaned && owner.gone() {
            orphaned = true;
            ending = Some(Ending::Interrupted(Signal::SIGKILL));
            terminated = true;
            kill_at = None;
            killing = true;
        }
        if let Some(sig) = signals::received()
            && !matches!(ending, Some(Ending::Interrupted(_)))
        {
            // A signal wins over an exit seen at the same time: the run was cancelled.
            ending = Some(Ending::Interrupted(sig));
            workload.signal(sig);
            kill_at = Some(Instant::now() + grace);
            terminated = true;
        }
        if let Some(end) = ending {
            if !workload.alive(seen.children_left) {
                // Reap what is left (zombies we now own) and report. The owner takes
                // the terminal back.
                reap(group);
                return end;
            }
            if killed_at.is_some_and(|t| t.elapsed() >= STUCK_WAIT)
                && let Some(stuck) = workload.only_stuck()
            {
                let pids: Vec<String> = stuck.iter().map(|p| p.to_string()).collect();
                eprintln!(
                    "cibox: warning: pid {} stuck in the kernel (state D) {}s after SIGKILL; not waited for longer",
                    pids.join(", "),
                    STUCK_WAIT.as_secs()
                );
                return end;
            }
            if !terminated {
                // The leader is done; its stray workers must not keep the GPUs.
                workload.signal(Signal::SIGTERM);
                kill_at = Some(Instant::now() + grace);
                terminated = true;
            }
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            kill_at = None;
            killing = true;
        }
        if killing {
            killed_at.get_or_insert_with(Instant::now);
            workload.signal(Signal::SIGKILL);
        }
        leader_exit.pause(TICK);
    }
}
