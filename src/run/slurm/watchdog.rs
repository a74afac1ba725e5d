//! A batch's Slurm job never outlives the cibox that submitted it: each job gets a
//! watchdog (`cibox __slurm-watchdog NAME`, in its own session) that waits on a pipe
//! from cibox, as a container's does. When cibox ends normally it says so; when cibox
//! dies by any signal, SIGKILL included, the pipe closes and the watchdog cancels the
//! job by its name (unique: it holds the run ID), whether it still waits in the queue
//! or runs. The nodes then end the batch as for any cancel.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::run::cleanup::watchdog::DISMISS;
use crate::slurm::job;

/// How long the nodes of a running job get to end its batch before it is cancelled.
const STEP_GRACE: Duration = Duration::from_secs(8);

/// The watchdog of one job.
pub struct JobWatchdog {
    child: Child,
    pipe: Option<std::io::PipeWriter>,
}

impl JobWatchdog {
    /// Starts the watchdog of the job named `name`, which the `srun` of process
    /// `srun` (its own process group) submits.
    pub fn start(name: &str, srun: u32) -> std::io::Result<JobWatchdog> {
        let (reader, writer) = std::io::pipe()?;
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["__slurm-watchdog", name, &srun.to_string()])
            .stdin(Stdio::from(reader))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only setsid, async-signal-safe, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
        Ok(JobWatchdog {
            child: cmd.spawn()?,
            pipe: Some(writer),
        })
    }

    /// The job is over (its `srun` has exited): the watchdog leaves.
    pub fn dismiss(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(&[DISMISS]);
        }
        let _ = self.child.wait();
    }
}

impl Drop for JobWatchdog {
    fn drop(&mut self) {
        // Not dismissed (an error path): closing the pipe cancels the job, which is what
        // must happen.
        self.pipe.take();
        let _ = self.child.wait();
    }
}

/// The watchdog itself: waits until cibox says the job is over or dies, and in the
/// second case ends `srun` (a job it has yet to submit is never submitted) and cancels
/// the job named `name`. Exits 0 either way.
pub fn watch(name: &str, srun: Option<u32>) -> u8 {
    if crate::run::cleanup::watchdog::dismissed(&[
        nix::sys::signal::Signal::SIGPIPE,
        nix::sys::signal::Signal::SIGHUP,
        nix::sys::signal::Signal::SIGINT,
    ]) {
        return 0;
    }
    // cibox is gone. A job that runs gets SIGTERM first, so its nodes end the batch
    // and remove its container (Slurm's cancel kills a step's processes at once).
    let running = matches!(job::queue_state(name), Ok(Some(q)) if !q.pending());
    if running && job::cancel(name, Some(Signal::SIGTERM)).is_ok() {
        let deadline = Instant::now() + STEP_GRACE;
        while Instant::now() < deadline
            && matches!(job::queue_state(name), Ok(Some(q)) if q.state == "RUNNING")
        {
            std::thread::sleep(Duration::from_millis(200));
        }
    } else if let Some(pid) = srun.filter(|p| is_srun(*p)) {
        // Still in the queue, or not yet submitted: its srun gives up the request.
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
    }
    // The controller may be slow to answer; try for a while. Once more later: an srun
    // that was submitting as cibox died may have made the job after the first cancel.
    for _ in 0..10 {
        if job::cancel(name, None).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(Duration::from_secs(3));
    let _ = job::cancel(name, None);
    0
}

/// Whether process `pid` is still an `srun` (not a process that took its number).
fn is_srun(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "srun")
}
