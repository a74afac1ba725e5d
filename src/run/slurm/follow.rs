//! One batch's Slurm job, from `srun` to its end: its lines read and relayed, its state
//! in the queue polled and shown while it waits, and the submitter's own reasons to end
//! it (a signal, the wait allowed, a deadline its nodes did not keep) sent to Slurm.

use std::io::{BufRead, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;

use crate::plan::BatchPlan;
use crate::report::event::{EventKind, Phase};
use crate::report::outcome::{BatchResult, ContainerEnd, Status};
use crate::run::batch_dir;
use crate::run::error::RunError;
use crate::run::slurm::records::JobEnd;
use crate::run::slurm::relay::Relay;
use crate::run::slurm::watchdog::JobWatchdog;
use crate::run::slurm::{NodeJob, Result, Submission};
use crate::signals;
use crate::slurm::alloc;
use crate::slurm::job::{self as slurm_job, JobSpec};
use crate::slurm::wire::{Decoder, Line};
use crate::slurm::{SlurmError, job_id_in};
use crate::{console, units::Span};

/// How often the loop looks at signals and deadlines between lines.
const TICK: Duration = Duration::from_millis(100);
/// How often a job that has not started is looked up in the queue.
const POLL: Duration = Duration::from_secs(1);
/// Slurm's own scheduling takes a moment: the least wait in its queue allowed.
const MIN_QUEUE_WAIT: Duration = Duration::from_secs(3);
/// After a signal is passed on to a running job, how long its nodes get to end the
/// batch themselves (their records then say so) before the job is cancelled.
const SIGNAL_GRACE: Duration = Duration::from_secs(5);
/// After a job is cancelled, how long `srun` gets to leave before it is killed.
const SRUN_GRACE: Duration = Duration::from_secs(15);
/// Beyond a batch's timeout, how long its node gets to stop it and say so (its own
/// stop takes 10 s) before the submitter cancels the job.
const BACKSTOP: Duration = Duration::from_secs(60);
/// The most of `srun`'s own lines kept, for the message of a job that said nothing.
const SRUN_LINES: usize = 20;

/// One of `srun`'s pipes.
type Pipe = Box<dyn std::io::Read + Send>;

/// A line from `srun`.
enum Out {
    Stdout(String),
    Stderr(String),
}

impl Submission<'_> {
    /// Runs batch `index` as a Slurm job, to its status; while its retries allow, as a
    /// new job each time (on whatever nodes Slurm gives it then).
    pub(super) fn batch(&self, index: usize) -> Result<BatchResult> {
        let b = &self.plan.batches[index];
        let dir = self.batch_dir(b)?;
        crate::run::attempts::run(b, |n| self.attempt(index, &dir, n), |e| self.emit(e))
    }

    /// The batch's folder, fresh, and said.
    fn batch_dir(&self, b: &BatchPlan) -> Result<crate::nofollow::Folder> {
        let dir = batch_dir::prepare(&self.reports, &self.plan.reports, &b.dir)?;
        self.emit(EventKind::BatchStarted {
            batch: b,
            dir: &dir,
        })?;
        Ok(dir)
    }

    /// The record of batch `index`, which the stop at the run's first failure kept from
    /// being submitted.
    pub(super) fn not_run(&self, index: usize, why: &str) -> Result<BatchResult> {
        let b = &self.plan.batches[index];
        drop(self.batch_dir(b)?);
        let mut record = self.bare_record(
            b,
            Status::NotRun,
            why.to_string(),
            SystemTime::now(),
            Instant::now(),
        );
        record.exit_code = 0;
        let result = BatchResult {
            record,
            cases: Vec::new(),
            earlier: Vec::new(),
            record_path: b.dir.join("result.json"),
            container_left: false,
        };
        self.emit(EventKind::BatchEnded { result: &result })?;
        Ok(result)
    }

    /// Attempt `n` at batch `index`: one job, from its submission to its record.
    fn attempt(&self, index: usize, dir: &crate::nofollow::Folder, n: u32) -> Result<BatchResult> {
        let b = &self.plan.batches[index];
        let started = SystemTime::now();
        let clock = Instant::now();
        let spec = self.spec(index, n)?;
        let end = match self.follow(b, &spec, clock, n == 1) {
            Ok(end) => end,
            Err(e) => {
                let Some(stopped) = ContainerEnd::of_error(&e) else {
                    return Err(e);
                };
                self.emit(EventKind::BatchFailed {
                    batch: b,
                    error: &e,
                })?;
                JobEnd {
                    stopped: Some(stopped),
                    ..JobEnd::default()
                }
            }
        };
        self.result(b, dir, &spec, end, started, clock)
    }

    /// The job of attempt `attempt` at batch `index`.
    fn spec(&self, index: usize, attempt: u32) -> Result<JobSpec> {
        let b = &self.plan.batches[index];
        let job = serde_json::to_string(&NodeJob::of(self.plan, index, attempt))
            .map_err(RunError::NodeJob)?;
        Ok(JobSpec {
            // A later attempt is a job of its own, and its name says which: the queue
            // and a cancel find jobs by name.
            name: match attempt {
                1 => slurm_job::job_name(&self.plan.manifest.project, &b.name, &self.plan.run_id),
                n => format!(
                    "{}:{n}",
                    slurm_job::job_name(&self.plan.manifest.project, &b.name, &self.plan.run_id)
                ),
            },
            nodes: b.nodes,
            gpus_per_node: b.gpus,
            // Checked before anything was submitted (`execute`).
            gpu_type: self
                .policy
                .gres_type(&b.name, b.gpu_model.as_deref())?
                .map(str::to_string),
            time_limit: b.timeout.0 + self.policy.grace,
            partition: Some(self.partition.clone()),
            account: self.policy.account.clone(),
            qos: self.policy.qos.clone(),
            options: self.policy.options.clone(),
            command: vec![
                self.cibox.display().to_string(),
                "__slurm-node".to_string(),
                job,
            ],
            chdir: "/".into(),
        })
    }

    /// Submits the job and follows it until its `srun` is gone; `clock` is the batch's.
    /// A first attempt still in Slurm's queue when another batch fails a run that stops
    /// at its first failure is cancelled there.
    fn follow(
        &self,
        b: &BatchPlan,
        spec: &JobSpec,
        clock: Instant,
        first_attempt: bool,
    ) -> Result<JobEnd> {
        let mut child = spawn_srun(spec)?;
        let watchdog = match JobWatchdog::start(&spec.name, child.id()) {
            Ok(w) => w,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::Watchdog(e).into());
            }
        };
        let lines = read_lines(&mut child);
        let mut job = Following::new(b, spec, self.plan.wait, child.id(), clock);
        job.give_up = first_attempt;
        let followed = loop {
            let step = match lines.recv_timeout(TICK) {
                Ok(Out::Stdout(line)) => job.stdout(self, &line),
                Ok(Out::Stderr(line)) => job.stderr(self, &line),
                Err(mpsc::RecvTimeoutError::Timeout) => Ok(()),
                Err(mpsc::RecvTimeoutError::Disconnected) => break Ok(()),
            };
            if let Err(e) = step.and_then(|()| job.tick(self)) {
                break Err(e);
            }
        };
        if followed.is_err() {
            // A reporter failed: the job must not go on without us.
            let _ = slurm_job::cancel(&spec.name, None);
            let _ = child.kill();
        }
        let _ = child.wait();
        watchdog.dismiss();
        followed?;
        Ok(job.end)
    }
}

/// Starts `srun` in its own process group: a Ctrl-C meant for cibox must not reach it
/// (twice, it would abort the job without a word from the nodes). Variables of a Slurm
/// job cibox itself may run in are not passed on: they would make `srun` run a step of
/// that job instead of submitting one. A job on several nodes gets a rendezvous of its
/// own (a random port and token), in `srun`'s environment, which reaches each rank's
/// cibox and nobody else (a command line is everyone's to read).
fn spawn_srun(spec: &JobSpec) -> Result<Child> {
    let mut cmd = Command::new("srun");
    cmd.args(spec.srun_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .env_remove(alloc::PORT_VAR)
        .env_remove(alloc::TOKEN_VAR);
    if spec.nodes > 1 {
        let secret = alloc::Rendezvous::random().map_err(RunError::NoRendezvous)?;
        cmd.env(alloc::PORT_VAR, secret.port.to_string())
            .env(alloc::TOKEN_VAR, &secret.token);
    }
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if (name.starts_with("SLURM_")
            || name.starts_with("SBATCH_")
            || name.starts_with("SALLOC_"))
            && name != "SLURM_CONF"
        {
            cmd.env_remove(name.as_ref());
        }
    }
    cmd.spawn().map_err(|e| {
        crate::error::Error::from(SlurmError::Unreachable {
            command: "srun".into(),
            why: if e.kind() == std::io::ErrorKind::NotFound {
                "is not installed here (no such program on PATH)".into()
            } else {
                format!("could not start: {e}")
            },
        })
    })
}

/// `srun`'s lines, from both its pipes, as they come; the channel closes when both do.
fn read_lines(child: &mut Child) -> mpsc::Receiver<Out> {
    let (tx, rx) = mpsc::channel();
    forward(
        child.stdout.take().map(|p| Box::new(p) as Pipe),
        Out::Stdout,
        tx.clone(),
    );
    forward(
        child.stderr.take().map(|p| Box::new(p) as Pipe),
        Out::Stderr,
        tx,
    );
    rx
}

/// Sends each line of `pipe` to `tx`, in a thread, until the pipe closes.
fn forward(pipe: Option<Pipe>, kind: fn(String) -> Out, tx: mpsc::Sender<Out>) {
    let Some(pipe) = pipe else { return };
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            // A line is at most 64 KiB: Slurm's own are far shorter.
            match (&mut reader).take(64 << 10).read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\n', '\r'])
                        .to_string();
                    if tx.send(kind(line)).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

/// A job being followed.
struct Following<'b> {
    b: &'b BatchPlan,
    name: String,
    srun: u32,
    decoder: Decoder,
    relay: Relay,
    /// A node has spoken, or the queue says so: the job runs.
    running: bool,
    /// When the batch started (its job is submitted right after).
    submitted: Instant,
    /// When its last tick was told (a quiet batch's heartbeat counts from ticks).
    last_tick: Instant,
    wait: Duration,
    next_poll: Instant,
    /// When the job must have ended, once it runs.
    deadline: Option<Instant>,
    /// When a signal was passed on to the job, and when it was cancelled.
    signalled: Option<Instant>,
    cancelled: Option<Instant>,
    end: JobEnd,
    /// Cancelled while it waits in the queue once another batch failed a run that
    /// stops at its first failure (a first attempt only).
    give_up: bool,
}

impl<'b> Following<'b> {
    fn new(
        b: &'b BatchPlan,
        spec: &JobSpec,
        wait: Duration,
        srun: u32,
        clock: Instant,
    ) -> Following<'b> {
        let now = Instant::now();
        Following {
            b,
            name: spec.name.clone(),
            srun,
            decoder: Decoder::default(),
            relay: Relay::new(b.nodes > 1, clock),
            running: false,
            submitted: clock,
            last_tick: now,
            wait: wait.max(MIN_QUEUE_WAIT),
            next_poll: now + POLL,
            deadline: None,
            signalled: None,
            cancelled: None,
            end: JobEnd::default(),
            give_up: false,
        }
    }

    /// A line of the nodes' messages.
    fn stdout(&mut self, run: &Submission<'_>, line: &str) -> Result<()> {
        match self.decoder.line(line) {
            Line::Partial => Ok(()),
            Line::Message { rank, bytes } => {
                self.allocated(run, None)?;
                self.relay.frame(run, self.b, rank, &bytes, &mut self.end)?;
                if self.relay.started && self.deadline.is_none() {
                    self.deadline = Some(Instant::now() + self.b.timeout.0 + BACKSTOP);
                }
                Ok(())
            }
            Line::Stray { rank, text } => {
                let from = rank.map_or("srun".to_string(), |r| format!("its node (rank {r})"));
                console::warn(format!("batch {}: {from} printed: {text}", self.b.name));
                Ok(())
            }
        }
    }

    /// A line of `srun`'s own, or of a node's cibox on its stderr.
    fn stderr(&mut self, run: &Submission<'_>, line: &str) -> Result<()> {
        if let Some(id) = job_id_in(line) {
            self.end.job_id.get_or_insert(id);
        }
        if line.starts_with("srun: ") {
            console::debug(format!("batch {}: {line}", self.b.name));
            self.end.srun_said.push_back(line.to_string());
            if self.end.srun_said.len() > SRUN_LINES {
                self.end.srun_said.pop_front();
            }
            // `srun: job 12 has been allocated resources`: the first word of its start.
            if line.ends_with("has been allocated resources") {
                return self.allocated(run, None);
            }
        } else {
            // The node's cibox warns on its stderr, labelled with its rank.
            match line.trim_start().split_once(": ") {
                Some((rank, text)) if rank.parse::<u32>().is_ok() => {
                    eprintln!("[{} node-{rank}] {text}", self.b.name)
                }
                _ => eprintln!("[{}] {line}", self.b.name),
            }
        }
        Ok(())
    }

    /// The job has left the queue (as `srun`, a node's first message or the queue
    /// tells): its time there is told once, as the batch's `queue` step, with its nodes
    /// (the queue's `nodes`, else asked for once).
    fn allocated(&mut self, run: &Submission<'_>, nodes: Option<&str>) -> Result<()> {
        if self.running {
            return Ok(());
        }
        self.running = true;
        let now = Instant::now();
        self.end.allocated = Some(now);
        let at = now.saturating_duration_since(self.submitted);
        let asked;
        let nodes = match nodes {
            Some(n) => Some(n),
            None => {
                asked = slurm_job::queue_state(&self.name).ok().flatten();
                if let Some(s) = &asked {
                    self.end.job_id.get_or_insert(s.id.clone());
                }
                asked.as_ref().map(|s| s.nodes.as_str())
            }
        };
        let job = self.end.job_id.as_deref().unwrap_or("(not yet named)");
        run.emit(EventKind::Phase {
            batch: Some(self.b),
            phase: Phase::Queue,
            at,
            detail: format!(
                "Slurm job {job} left the queue{} after {}",
                nodes
                    .filter(|n| !n.is_empty())
                    .map(|n| format!(" for {n}"))
                    .unwrap_or_default(),
                crate::units::human(at)
            ),
        })
    }

    /// Signals, the queue, deadlines, and the running batch's ticks.
    fn tick(&mut self, run: &Submission<'_>) -> Result<()> {
        let now = Instant::now();
        if self.relay.started && now >= self.last_tick + TICK {
            // As a local run's follow loop ticks: a quiet batch's heartbeat counts here.
            self.last_tick = now;
            run.emit(EventKind::Tick { batch: self.b })?;
        }
        if let Some(signal) = signals::received()
            && self.signalled.is_none()
            && self.cancelled.is_none()
        {
            self.stop(ContainerEnd::Cancelled {
                signal,
                message: format!("cancelled by {signal}"),
                exit: None,
            });
            self.end_job(signal);
        }
        if self
            .signalled
            .is_some_and(|t| now >= t + SIGNAL_GRACE && self.cancelled.is_none())
        {
            self.cancel(None);
        }
        if self.cancelled.is_some_and(|t| now >= t + SRUN_GRACE) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.srun as i32),
                Signal::SIGKILL,
            );
        }
        if !self.running
            && self.give_up
            && self.cancelled.is_none()
            && self.signalled.is_none()
            && let Some(why) = run.first.why_not()
        {
            self.stop(ContainerEnd::Stopped {
                status: Status::NotRun,
                message: why,
                exit: None,
            });
            self.cancel(None);
        }
        if !self.running
            && now >= self.next_poll
            && self.cancelled.is_none()
            && self.signalled.is_none()
        {
            self.next_poll = now + POLL;
            self.poll_queue(run, now)?;
        }
        if self.deadline.is_some_and(|d| now >= d)
            && self.cancelled.is_none()
            && self.signalled.is_none()
        {
            self.stop(ContainerEnd::Stopped {
                status: Status::Timeout,
                message: format!(
                    "the batch hit its timeout of {} and its node did not end it within {}: its Slurm job was cancelled",
                    self.b.timeout,
                    Span(BACKSTOP)
                ),
                exit: None,
            });
            self.end_job(Signal::SIGTERM);
        }
        Ok(())
    }

    /// Ends the job: one that runs gets `signal` first, so its nodes end the batch
    /// themselves (its container removed, its record written), and is cancelled
    /// [`SIGNAL_GRACE`] later; one in the queue is cancelled at once. (Slurm's cancel
    /// of a running step kills its processes at once: cibox on the node would have no
    /// time to remove the container.)
    fn end_job(&mut self, signal: Signal) {
        if self.running {
            self.signalled = Some(Instant::now());
            self.cancel(Some(signal));
        } else {
            self.cancel(None);
        }
    }

    /// While the job waits in the queue: says so, and gives up past the wait allowed.
    fn poll_queue(&mut self, run: &Submission<'_>, now: Instant) -> Result<()> {
        let state = match slurm_job::queue_state(&self.name) {
            Ok(Some(state)) => state,
            Ok(None) => return Ok(()),
            Err(e) => {
                console::debug(format!("batch {}: {e}", self.b.name));
                return Ok(());
            }
        };
        self.end.job_id.get_or_insert(state.id.clone());
        if !state.pending() {
            // Allocated: its nodes start (or have ended) the batch.
            return self.allocated(run, Some(&state.nodes));
        }
        let shown = state.describe();
        run.emit(EventKind::Queued {
            batch: self.b,
            job: &state.id,
            state: &shown,
            left: (self.submitted + self.wait).saturating_duration_since(now),
        })?;
        if now >= self.submitted + self.wait {
            self.stop(ContainerEnd::Stopped {
                status: Status::Capacity,
                message: format!(
                    "Slurm job {} still waits in the queue after {}: {shown}; raise --wait (or gpu.wait) to wait longer",
                    state.id,
                    Span(self.wait)
                ),
                exit: None,
            });
            self.end_job(Signal::SIGTERM);
        }
        Ok(())
    }

    /// The submitter's reason to end the job (the first one counts).
    fn stop(&mut self, why: ContainerEnd) {
        self.end.stopped.get_or_insert(why);
    }

    /// Sends `signal` to the job's steps, or (`None`) cancels it.
    fn cancel(&mut self, signal: Option<Signal>) {
        if signal.is_none() {
            self.cancelled = Some(Instant::now());
        }
        if let Err(e) = slurm_job::cancel(&self.name, signal) {
            console::warn(format!(
                "batch {}: cannot cancel its Slurm job {}: {e}",
                self.b.name, self.name
            ));
        }
    }
}
