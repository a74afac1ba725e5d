//! A batch container never outlives its cibox: each one gets a watchdog, a small
//! process of its own (`cibox __watchdog`, in its own session, so neither a terminal's
//! signals nor a kill of cibox's group reach it) that holds the batch's lease and waits
//! on a pipe from cibox. When cibox ends normally it says so and the watchdog leaves;
//! when cibox dies by any signal the pipe closes, and the watchdog removes the
//! container at once, then lets the lease go. So the batch's timeout and its GPUs never
//! depend on a later sweep.

use std::io::{Read, Write};
use std::os::unix::io::RawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::engine::Engine;

/// What cibox writes when it has removed the container itself (or a Slurm job is
/// over: the same word for every watchdog).
pub const DISMISS: u8 = b'd';

/// How long one engine call of the watchdog may take (a forced removal asked again
/// after a timeout finds it done or under way), and how long it keeps trying.
const ENGINE_CALL: Duration = Duration::from_secs(5);
const REMOVE_FOR: Duration = Duration::from_secs(30);

/// A running watchdog of one container.
pub struct Watchdog {
    /// `None` for a stand-in that watches nothing (the run loop's unit tests).
    child: Option<Child>,
    pipe: Option<std::io::PipeWriter>,
}

impl Watchdog {
    /// Starts the watchdog of `container`, handing it `lease_fds` (the GPU lock files):
    /// the GPUs stay leased until it has removed the container too.
    pub fn start(container: &str, lease_fds: &[RawFd]) -> std::io::Result<Watchdog> {
        let (reader, writer) = std::io::pipe()?;
        let exe = std::env::current_exe()?;
        let inherit = lease_fds.to_vec();
        let mut cmd = Command::new(exe);
        cmd.args(["__watchdog", container])
            .stdin(Stdio::from(reader))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (setsid, fcntl) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                crate::process::keep_open(&inherit)
            });
        }
        let child = cmd.spawn()?;
        Ok(Watchdog {
            child: Some(child),
            pipe: Some(writer),
        })
    }

    /// A stand-in that watches nothing, for tests of the run loop with a fake engine.
    #[cfg(test)]
    pub fn inert() -> Watchdog {
        Watchdog {
            child: None,
            pipe: None,
        }
    }

    /// cibox removed the container itself: the watchdog leaves, and with it its hold
    /// on the lease (waited for, so the GPUs are free when this returns).
    pub fn dismiss(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(&[DISMISS]);
        }
        if let Some(child) = self.child.as_mut() {
            let _ = child.wait();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Not dismissed (an error path): closing the pipe makes it remove the
        // container, which is what must happen; reap it so no zombie stays.
        self.pipe.take();
        if let Some(child) = self.child.as_mut() {
            let _ = child.wait();
        }
    }
}

/// In a watchdog's process: ignores `signals`, then waits on standard input until
/// cibox says it is done (true) or dies, closing the pipe (false).
pub fn dismissed(signals: &[nix::sys::signal::Signal]) -> bool {
    // SAFETY: setting dispositions of this single-threaded process.
    unsafe {
        for sig in signals {
            let _ = nix::sys::signal::signal(*sig, nix::sys::signal::SigHandler::SigIgn);
        }
    }
    let mut byte = [0u8; 1];
    loop {
        match std::io::stdin().read(&mut byte) {
            Ok(0) => return false,
            Ok(_) => return byte[0] == DISMISS,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// The watchdog itself: waits until cibox says it is done or dies, and in the second
/// case removes `container`. Exits 0 either way; it has nobody to tell.
pub fn watch(container: &str) -> u8 {
    // Nothing to print to and nobody to stop it: a SIGPIPE, SIGHUP or SIGTERM must not
    // end it before the container is gone (a Slurm step's end sends SIGTERM to every
    // process of the step, this one included, while its cibox still cleans up).
    if dismissed(&[
        nix::sys::signal::Signal::SIGPIPE,
        nix::sys::signal::Signal::SIGHUP,
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
    ]) {
        return 0;
    }
    // cibox is gone. The engine may be slow to answer; try for a while, each call
    // short: a hung engine must not keep the batch's lease for minutes (while it hangs,
    // nobody is handed GPUs a cibox container may hold: the claims fail closed).
    let deadline = Instant::now() + REMOVE_FOR;
    while Instant::now() < deadline {
        if let Ok(engine) = Engine::connect_within(ENGINE_CALL)
            && engine.remove_container(container).is_ok()
        {
            return 0;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    0
}
