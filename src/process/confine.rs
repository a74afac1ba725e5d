//! `gpu exec` confines its command so that nothing of it outlives cibox.
//!
//! cibox starts a supervisor (`cibox __confine`, in a process group of its own so a
//! kill of cibox's job does not reach it) that holds the lease's lock files too. The
//! supervisor puts the command in a PID namespace where it can: as root directly, as
//! anyone else inside a user namespace that maps only the caller's own uid and gid
//! (the way `bwrap --unshare-pid --die-with-parent` does). A forked copy of the
//! supervisor is the namespace's init: it starts the command, reaps every orphan, and
//! tears the workload down with `kill(-1)`. When cibox dies by any signal, the
//! supervisor sees it (its parent changes), SIGKILLs the init, and the kernel kills
//! every process of the namespace; the supervisor's wait for the init returns only
//! once all of them are gone, and only then does it exit and let the lease go.
//!
//! Where no namespace can be made, the supervisor is the workload's subreaper instead:
//! every descendant stays in its tree, whatever `setsid` or double fork it does, and
//! is killed from there when cibox dies. Only a SIGKILL of the supervisor itself (not of
//! cibox) can then leave processes behind; `cibox doctor` says which confinement the
//! host gives.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::os::unix::io::RawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::{Ending, Group, Owner, Scope, TICK};
use crate::signals;

/// The variable that asks for a confinement: `auto` (the default) or `subreaper`.
pub const ENV: &str = "CIBOX_CONFINE";

/// How a workload is confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// Its own PID namespace (cibox runs as root).
    PidNamespace,
    /// Its own PID namespace, inside a user namespace that maps only the invoking
    /// user's uid and gid.
    UserNamespace,
    /// A supervisor that is the subreaper of every descendant.
    Subreaper,
}

impl Confinement {
    pub fn name(self) -> &'static str {
        match self {
            Confinement::PidNamespace => "pid-namespace",
            Confinement::UserNamespace => "user-namespace",
            Confinement::Subreaper => "subreaper",
        }
    }

    fn from_name(s: &str) -> Option<Confinement> {
        [
            Confinement::PidNamespace,
            Confinement::UserNamespace,
            Confinement::Subreaper,
        ]
        .into_iter()
        .find(|c| c.name() == s)
    }
}

/// What the caller asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// A PID namespace where the host allows one, else the subreaper.
    Auto,
    /// The subreaper, for a tool that must see the host's PIDs.
    Subreaper,
}

impl Wanted {
    /// From `CIBOX_CONFINE`; an unknown value is an error naming the variable.
    pub fn from_env() -> Result<Wanted, BadConfine> {
        match std::env::var(ENV).as_deref() {
            Err(_) | Ok("") | Ok("auto") => Ok(Wanted::Auto),
            Ok("subreaper") => Ok(Wanted::Subreaper),
            Ok(other) => Err(BadConfine {
                value: other.to_string(),
            }),
        }
    }
}

/// `CIBOX_CONFINE` names no confinement: a usage error.
#[derive(Debug, thiserror::Error)]
#[error(
    "{ENV}: `{}` is not `auto` or `subreaper`",
    crate::util::escape(.value)
)]
pub struct BadConfine {
    /// The variable's value.
    pub value: String,
}

/// Why the command could not be started under a supervisor.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The supervisor itself could not be started.
    #[error("cannot start the supervisor: {0}")]
    Supervisor(#[source] std::io::Error),
    /// The supervisor could not start the command, and said why (its one line).
    #[error("{0}")]
    Refused(String),
    #[error("the supervisor ended before the command started")]
    EndedEarly,
}

/// What the supervisor reported once the command was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub confinement: Confinement,
    /// The namespace has its own `/proc` (false: the workload sees the host's, where
    /// its own PIDs name other processes).
    pub own_proc: bool,
}

/// A running supervisor, seen from cibox.
pub struct Supervisor {
    child: Child,
    interactive: bool,
    pub started: Started,
}

impl Supervisor {
    /// Starts `argv` with `env` added under a supervisor that also holds `lease_fds`.
    /// Returns once the command runs; an error is one line saying why it could not.
    pub fn start(
        argv: &[String],
        env: &[(String, String)],
        lease_fds: &[RawFd],
        grace: Duration,
        wanted: Wanted,
    ) -> Result<Supervisor, StartError> {
        let io = StartError::Supervisor;
        let (report_r, report_w) = std::io::pipe().map_err(io)?;
        let interactive = super::in_terminal_foreground();
        let exe = std::env::current_exe().map_err(io)?;
        let mut cmd = Command::new(exe);
        cmd.arg("__confine")
            .arg(format!("--owner={}", nix::unistd::getpid()))
            .arg(format!("--report-fd={}", report_w.as_raw_fd()))
            .arg(format!("--grace-ms={}", grace.as_millis()));
        if interactive {
            cmd.arg("--interactive");
        }
        if wanted == Wanted::Subreaper {
            cmd.arg("--subreaper");
        }
        cmd.arg("--")
            .args(argv)
            .envs(env.iter().cloned())
            .process_group(0);
        let mut inherit = lease_fds.to_vec();
        inherit.push(report_w.as_raw_fd());
        // SAFETY: only fcntl, async-signal-safe, between fork and exec.
        unsafe {
            cmd.pre_exec(move || super::keep_open(&inherit));
        }
        let mut child = cmd.spawn().map_err(io)?;
        drop(report_w);
        // One line: `ok <confinement> <proc>` or `err <message>`; nothing at all when
        // the supervisor died first.
        let mut line = String::new();
        let _ = BufReader::new(report_r.take(4096)).read_line(&mut line);
        let started = line
            .strip_prefix("ok ")
            .and_then(|rest| {
                let (mode, proc_) = rest.trim_end().split_once(' ')?;
                Some(Started {
                    confinement: Confinement::from_name(mode)?,
                    own_proc: proc_ == "own-proc",
                })
            })
            .ok_or_else(|| {
                let _ = child.wait();
                match line.strip_prefix("err ") {
                    Some(why) => StartError::Refused(why.trim_end().to_string()),
                    None => StartError::EndedEarly,
                }
            })?;
        Ok(Supervisor {
            child,
            interactive,
            started,
        })
    }

    /// Waits for the supervisor, which returns once no process of the workload is
    /// left, forwarding the first terminating signal cibox receives.
    pub fn wait(self) -> Ending {
        let pid = Pid::from_raw(self.child.id() as i32);
        let supervisor_exit = super::ExitWatch::of(pid);
        let mut forwarded = None;
        let ending = loop {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => {
                    break forwarded.map_or(Ending::Exited(code), Ending::Interrupted);
                }
                Ok(WaitStatus::Signaled(_, sig, _)) => {
                    break forwarded.map_or(Ending::Killed(sig as i32), Ending::Interrupted);
                }
                Ok(_) => {}
                // Not our child any more: nothing to report but a failure.
                Err(_) => break Ending::Exited(1),
            }
            if forwarded.is_none()
                && let Some(sig) = signals::received()
            {
                let _ = kill(pid, sig);
                forwarded = Some(sig);
            }
            supervisor_exit.pause(TICK);
        };
        if self.interactive {
            super::hand_terminal(nix::unistd::getpgrp());
        }
        ending
    }
}

/// The supervisor's arguments, from cibox.
#[derive(Debug)]
pub struct SupervisorArgs {
    pub owner: i32,
    pub report_fd: RawFd,
    pub grace: Duration,
    pub interactive: bool,
    pub subreaper: bool,
    pub argv: Vec<String>,
}

/// The supervisor (`cibox __confine`): returns its exit code, the command's (or
/// 128+N for a signal).
pub fn supervisor(a: SupervisorArgs) -> u8 {
    // SAFETY: cibox handed this descriptor to us for the report and nothing else.
    let mut report = unsafe { File::from_raw_fd(a.report_fd) };
    // SAFETY: this process is single-threaded; a write to the report pipe after cibox
    // died must not kill the supervisor, which still holds the lease.
    unsafe {
        let _ = nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigIgn);
    }
    let _ = rustix::io::fcntl_setfd(&report, rustix::io::FdFlags::CLOEXEC);
    let owner = Pid::from_raw(a.owner);
    if nix::unistd::getppid() != owner || a.argv.is_empty() {
        return 1;
    }
    signals::install();
    let owner = Cibox {
        pid: owner,
        pgrp: nix::unistd::getpgid(Some(owner)).unwrap_or(owner),
    };
    let confinement = if a.subreaper {
        Confinement::Subreaper
    } else {
        enter_namespaces()
    };
    if confinement == Confinement::Subreaper {
        if let Err(e) = super::become_subreaper() {
            let _ = writeln!(report, "err cannot become a subreaper: {e}");
            return 1;
        }
        let Some(group) = start_command(&mut report, &a, confinement, true) else {
            return 1;
        };
        drop(report);
        let mut owner = owner;
        return exit_code(super::supervise(&group, a.grace, Scope::Tree, &mut owner));
    }
    let (Ok((up_r, up_w)), Ok((down_r, down_w))) = (std::io::pipe(), std::io::pipe()) else {
        let _ = writeln!(report, "err cannot make a pipe");
        return 1;
    };
    // SAFETY: this process is single-threaded, so the child may run anything.
    match unsafe { nix::unistd::fork() } {
        Err(e) => {
            let _ = writeln!(report, "err cannot start the namespace's init: {e}");
            1
        }
        Ok(nix::unistd::ForkResult::Child) => {
            drop((up_r, down_w));
            let code = namespace_init(report, &a, confinement, up_w, down_r);
            std::process::exit(code.into());
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop((report, up_w, down_r));
            supervise_init(child, owner, a.grace, up_r, down_w)
        }
    }
}

/// Enters a new PID namespace for the children to come, through a user namespace when
/// not privileged; the subreaper when neither works.
fn enter_namespaces() -> Confinement {
    let flags = CloneFlags::CLONE_NEWPID;
    if nix::sched::unshare(flags).is_ok() {
        return Confinement::PidNamespace;
    }
    // A user namespace cannot be left again, and one without a mapping would make
    // this user `nobody` for good: try it in a throwaway child first.
    // SAFETY: single-threaded; the child only makes syscalls and exits.
    let trial = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let ok = enter_user_namespace().is_ok() && nix::sched::unshare(flags).is_ok();
            // SAFETY: leaving the throwaway child without running any exit handler.
            unsafe { nix::libc::_exit(if ok { 0 } else { 1 }) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            matches!(waitpid(child, None), Ok(WaitStatus::Exited(_, 0)))
        }
        Err(_) => false,
    };
    if trial && enter_user_namespace().is_ok() && nix::sched::unshare(flags).is_ok() {
        Confinement::UserNamespace
    } else {
        Confinement::Subreaper
    }
}

/// A user namespace where this process keeps its own uid and gid (and so its file
/// access), with the capabilities to make the other namespaces; they are dropped at
/// the command's exec, since its uid is not 0 there.
fn enter_user_namespace() -> std::io::Result<()> {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    nix::sched::unshare(CloneFlags::CLONE_NEWUSER)?;
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    Ok(())
}

/// Starts the command and reports it; `None` after reporting why it could not start.
fn start_command(
    report: &mut File,
    a: &SupervisorArgs,
    confinement: Confinement,
    own_proc: bool,
) -> Option<Group> {
    match super::spawn_group(&a.argv, &[], &[], a.interactive) {
        Ok(group) => {
            let proc_ = if own_proc { "own-proc" } else { "host-proc" };
            let _ = writeln!(report, "ok {} {proc_}", confinement.name());
            Some(group)
        }
        Err(e) => {
            let what = crate::util::escape(&a.argv[0]);
            let _ = writeln!(report, "err cannot run `{what}`: {e}");
            None
        }
    }
}

/// The init of the namespace (PID 1): mounts the namespace's own `/proc` (so the
/// workload's PIDs mean what it thinks), starts the command and supervises it.
fn namespace_init(
    mut report: File,
    a: &SupervisorArgs,
    confinement: Confinement,
    up: std::io::PipeWriter,
    down: std::io::PipeReader,
) -> u8 {
    if nix::unistd::getpid().as_raw() != 1
        || nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_err()
    {
        let _ = writeln!(report, "err the PID namespace did not take effect");
        return 1;
    }
    // The supervisor may have died before the line above took effect: its end of the
    // pipe is then closed.
    if hung_up(down.as_fd()) {
        return 1;
    }
    let own_proc = mount_proc().is_ok();
    let Some(group) = start_command(&mut report, a, confinement, own_proc) else {
        return 1;
    };
    drop(report);
    let mut owner = Upstream { up, down };
    exit_code(super::supervise(
        &group,
        a.grace,
        Scope::Namespace,
        &mut owner,
    ))
}

/// Mounts a `/proc` of this PID namespace over the host's, in a mount namespace of the
/// init's own (the supervisor keeps the host's `/proc`, where cibox can be seen).
fn mount_proc() -> nix::Result<()> {
    use nix::mount::{MsFlags, mount};
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
}

fn hung_up(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).is_ok_and(|_| {
        fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
    })
}

/// What the init sends up when the command stopped, and the supervisor down when the
/// job goes on, in the foreground or in the background.
const STOPPED: u8 = b'S';
const STOPPED_IN_BACKGROUND: u8 = b's';
const CONTINUED: u8 = b'C';
const CONTINUED_IN_BACKGROUND: u8 = b'B';

/// The supervisor, seen from the namespace's init.
struct Upstream {
    up: std::io::PipeWriter,
    down: std::io::PipeReader,
}

impl Owner for Upstream {
    fn gone(&mut self) -> bool {
        // The parent-death signal kills the init with its supervisor.
        false
    }

    fn stop_job(&mut self, foreground: bool) -> bool {
        // Only the supervisor can name cibox's job from here.
        let said = if foreground {
            STOPPED
        } else {
            STOPPED_IN_BACKGROUND
        };
        if self.up.write_all(&[said]).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        loop {
            match self.down.read(&mut byte) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(1) => return byte[0] == CONTINUED,
                _ => return false,
            }
        }
    }
}

/// cibox, seen from the supervisor.
struct Cibox {
    pid: Pid,
    pgrp: Pid,
}

impl Owner for Cibox {
    fn gone(&mut self) -> bool {
        nix::unistd::getppid() != self.pid
    }

    fn stop_job(&mut self, foreground: bool) -> bool {
        if foreground {
            super::hand_terminal(self.pgrp);
        }
        let _ = killpg(self.pgrp, Signal::SIGSTOP);
        let stopped = |me: &mut Cibox| {
            !me.gone() && super::stat(me.pid.as_raw()).is_some_and(|(state, _)| state == 'T')
        };
        // The stop is delivered asynchronously: see it happen first, then wait until
        // the shell continues the job (`fg`).
        let seen_by = Instant::now() + Duration::from_secs(1);
        while !stopped(self) && !self.gone() && Instant::now() < seen_by {
            std::thread::sleep(Duration::from_millis(5));
        }
        while stopped(self) {
            std::thread::sleep(Duration::from_millis(20));
        }
        // `fg` gave cibox's job the terminal; `bg` left it with the shell.
        let stdin = std::io::stdin();
        nix::unistd::tcgetpgrp(&stdin) == Ok(self.pgrp)
    }
}

/// The supervisor's side in a namespace: waits for the init (which returns only once
/// the namespace is empty), forwards cibox's signals to it, kills it when cibox dies,
/// and plays the job-control go-between.
fn supervise_init(
    init: Pid,
    mut owner: Cibox,
    grace: Duration,
    mut up: std::io::PipeReader,
    mut down: std::io::PipeWriter,
) -> u8 {
    set_nonblocking(up.as_fd());
    let init_exit = super::ExitWatch::of(init);
    let mut forwarded = false;
    let mut orphaned = false;
    let mut backstop: Option<Instant> = None;
    loop {
        match waitpid(init, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => return code.clamp(0, 255) as u8,
            Ok(WaitStatus::Signaled(_, sig, _)) => return crate::exit::signal(sig as i32),
            Ok(_) => {}
            Err(_) => return 1,
        }
        if !orphaned && owner.gone() {
            orphaned = true;
            // The kernel kills the whole namespace with its init.
            let _ = kill(init, Signal::SIGKILL);
        }
        if !forwarded && let Some(sig) = signals::received() {
            forwarded = true;
            let _ = kill(init, sig);
            // The init gives its workload `grace`; past that and more, it is stuck.
            backstop = Some(Instant::now() + grace + Duration::from_secs(5));
        }
        if backstop.is_some_and(|t| Instant::now() >= t) {
            let _ = kill(init, Signal::SIGKILL);
            backstop = None;
        }
        let mut byte = [0u8; 1];
        if let Ok(1) = up.read(&mut byte)
            && matches!(byte[0], STOPPED | STOPPED_IN_BACKGROUND)
        {
            let reply = if owner.stop_job(byte[0] == STOPPED) {
                CONTINUED
            } else {
                CONTINUED_IN_BACKGROUND
            };
            let _ = down.write_all(&[reply]);
        }
        init_exit.pause(TICK);
    }
}

fn set_nonblocking(fd: std::os::fd::BorrowedFd<'_>) {
    use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
    if let Ok(flags) = fcntl_getfl(fd) {
        let _ = fcntl_setfl(fd, flags | OFlags::NONBLOCK);
    }
}

/// An ending as an exit code: the command's own, or 128+N for a signal.
fn exit_code(ending: Ending) -> u8 {
    match ending {
        Ending::Exited(code) => code.clamp(0, 255) as u8,
        Ending::Killed(sig) => crate::exit::signal(sig),
        Ending::Interrupted(sig) => crate::exit::signal(sig as i32),
    }
}
