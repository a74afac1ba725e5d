//! Why a run, or one of its batches, could not go on, where no error of the layers
//! below says it: those (engine, leases, images, …) pass through as they are
//! ([`crate::error::Error`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::ErrorKind;
use crate::exit::Failure;
use crate::gpu::LeaseError;

/// What kept a run, or one of its batches, from going on, where no domain error says it.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No `--source`, and neither git nor the current folder says where the source is.
    #[error("cannot tell the source folder; pass --source")]
    NoSource,
    #[error("--source {}: not a directory", .dir.display())]
    SourceNotDir { dir: PathBuf },
    #[error("--source {}: {source}", .dir.display())]
    SourceUnresolved {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--scope is empty")]
    EmptyScope,
    /// The reports folder is relative, and the current folder cannot be read.
    #[error("reports dir {dir}: cannot read the current folder: {source}")]
    ReportsNoCurrentFolder {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reports dir {dir}: no folder of it exists")]
    ReportsNowhere { dir: String },
    /// The reports folder (or the nearest folder of it that exists) cannot be resolved,
    /// or made.
    #[error("reports dir {dir}: {source}")]
    ReportsDir {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    /// The random source failed: no token can stop GitHub's workflow commands.
    #[error("cannot make the token that stops GitHub's workflow commands: {0}")]
    NoStopToken(#[source] std::io::Error),
    /// The random source failed: no rendezvous for a job on several nodes.
    #[error("cannot draw the job's rendezvous from the kernel's random source: {0}")]
    NoRendezvous(#[source] std::io::Error),
    /// The random source failed: no run ID.
    #[error("cannot make a random run ID: {0}")]
    NoRunId(#[source] std::io::Error),
    /// The source is a git checkout, and git cannot be run.
    #[error(
        "{} is a git checkout (it holds .git), and {why}: install git or put it on PATH; without it a run would ship what git ignores and record no commit", .dir.display()
    )]
    NoGit {
        dir: PathBuf,
        why: crate::git::GitError,
    },
    /// The reports folder (or one on the way to it) is one someone else can change.
    #[error("reports dir {dir}: {why}")]
    UntrustedReports { dir: String, why: String },
    #[error("reports dir {dir}: {} is not a directory", .at.display())]
    ReportsNotADirectory { dir: String, at: PathBuf },
    #[error(
        "reports dir {dir}: `..` below {}, which does not exist yet: name the folder without it",
        .at.display()
    )]
    ReportsDotDot { dir: String, at: PathBuf },
    /// The reports folder exists, and cibox may not write in it.
    #[error("reports dir {} is not writable: {source}", .at.display())]
    ReportsNotWritable {
        at: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The reports folder is to be made in `at`, where cibox may not write.
    #[error("reports dir cannot be made: {} is not writable: {source}", .at.display())]
    ReportsCannotBeMade {
        at: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A test file `changed run` or a replay was given is a link in the source.
    #[error(
        "test file `{}` is a link in {}; name the file itself",
        crate::util::escape(.file),
        .dir.display()
    )]
    TestFileLink { file: String, dir: PathBuf },
    #[error(
        "test file `{}` is not a file in {}",
        crate::util::escape(.file),
        .dir.display()
    )]
    TestFileMissing { file: String, dir: PathBuf },
    #[error(
        "{}: no `qualify` layer; add layers.qualify with the batches that qualify an image",
        .manifest.display()
    )]
    NoQualifyLayer { manifest: PathBuf },
    /// A `qualification.json` of an earlier run could not be removed.
    #[error("cannot remove {}: {source}", .path.display())]
    StaleRecord {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `qualification.json` could not be written.
    #[error("{}: {source}", .path.display())]
    Record {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The manifest a Slurm node reads is not the one the batch was planned with.
    #[error(
        "{} changed since the batch was submitted ({then} then, {now} now); run it again",
        .manifest.display()
    )]
    ManifestChanged {
        manifest: PathBuf,
        then: String,
        now: String,
    },
    /// A node is to run a batch `changed run` made, and its manifest has no `changed.run`.
    #[error("{} has no changed.run to make batch {batch} from", .manifest.display())]
    NoChangedRun { manifest: PathBuf, batch: String },
    #[error("cannot tell where this cibox is: {0}")]
    CurrentExe(#[source] std::io::Error),
    #[error("cannot write the node's job: {0}")]
    NodeJob(#[source] serde_json::Error),
    /// The engine would not start the holder of a batch's private cache layers.
    #[error("could not start the holder of the batch's private cache layers: {why}")]
    HolderNotStarted { why: String },
    #[error("the engine does not say where the private layer of cache `{cache}` lies")]
    PrivateLayerNowhere { cache: String },
    #[error("batch {batch} needs {}; the pool has {pool}", crate::util::count(*need as u64, "GPU"))]
    PoolTooSmall {
        batch: String,
        need: usize,
        pool: usize,
    },
    /// The run's lock, or a dead run's, could not be used.
    #[error("lock dir {dir}: {what}: {source}")]
    RunLocks {
        dir: String,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "reports dir {dir} exists and holds files cibox did not write; choose another --reports"
    )]
    ForeignBatchDir { dir: String },
    #[error("cannot {what} {dir}: {source}")]
    BatchDir {
        dir: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("a batch's thread panicked")]
    Panicked,
    #[error("cannot start the watchdog of a batch container: {0}")]
    Watchdog(#[source] std::io::Error),
    #[error(
        "batches run as uid {uid}, never as root, and cannot read the source {dir} (mode {mode:o}); make it readable by others (chmod o+rx), or run cibox as an unprivileged CI user"
    )]
    SourceUnreadable { dir: String, mode: u32, uid: u32 },
    /// The GPUs Slurm allocated on a node could not be leased there within the wait
    /// (fail closed).
    #[error(
        "the GPU(s) Slurm allocated to job {job_id} on node {node} could not be leased there within {}: {why}; Slurm counts them free, so something outside Slurm holds or uses them",
        crate::units::Span(*.wait)
    )]
    SlurmGpusHeld {
        job_id: String,
        node: String,
        wait: Duration,
        #[source]
        why: LeaseError,
    },
    /// The GPUs Slurm allocated on a node include one the driver reads unhealthy: Slurm
    /// does not know it, and would allocate it again.
    #[error(
        "Slurm allocated job {job_id} on node {node} a GPU the driver there reads unhealthy ({why}); Slurm counts it free and may allocate it again: drain node {node} or take the GPU out of its gres.conf until it is reset"
    )]
    SlurmGpusSick {
        job_id: String,
        node: String,
        #[source]
        why: LeaseError,
    },
    /// Slurm allocated a batch another number of GPUs than it asks for.
    #[error(
        "Slurm allocated {allocated} GPU(s) on node {node} to batch {batch}, which asks for {asks}"
    )]
    SlurmGpuCount {
        allocated: usize,
        node: String,
        batch: String,
        asks: u32,
    },
    /// Slurm allocated a GPU outside the node's pool.
    #[error(
        "Slurm allocated GPU {index} on node {node} to batch {batch}, which is not in this node's GPU pool ({}); Slurm's GRES and cibox's pool must name the same GPUs",
        .pool.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    )]
    SlurmGpuOutsidePool {
        index: u32,
        node: String,
        batch: String,
        /// The pool's GPUs, by index.
        pool: Vec<u32>,
    },
    /// Slurm named a unit (a MIG slice's UUID) that is not among the batch's units on
    /// the node.
    #[error(
        "Slurm allocated {id} on node {node} to batch {batch}, which is not among the units of its pool and model here; the node's gres.conf and cibox's probe must name the same slices"
    )]
    SlurmUnitOutsidePool {
        id: String,
        node: String,
        batch: String,
    },
    /// What kept a batch from running on its node, as the node said it (exit `code`).
    #[error("{message}")]
    OnNode {
        message: String,
        details: Vec<String>,
        code: u8,
    },
}

/// The kind of failure an exit code says (a node's, relayed).
pub fn failure_of_code(code: u8) -> Failure {
    match code {
        crate::exit::USAGE => Failure::Usage,
        crate::exit::IMAGE_REFUSED => Failure::ImageRefused,
        crate::exit::CAPACITY => Failure::Capacity,
        c if c > 128 => nix::sys::signal::Signal::try_from(i32::from(c) - 128)
            .map(Failure::Signal)
            .unwrap_or(Failure::Infra),
        _ => Failure::Infra,
    }
}

impl ErrorKind for RunError {
    fn details(&self) -> &[String] {
        match self {
            RunError::OnNode { details, .. } => details,
            _ => &[],
        }
    }

    fn failure(&self) -> Failure {
        match self {
            RunError::NoSource
            | RunError::SourceNotDir { .. }
            | RunError::SourceUnresolved { .. }
            | RunError::EmptyScope
            | RunError::ReportsNoCurrentFolder { .. }
            | RunError::ReportsNowhere { .. }
            | RunError::ReportsDir { .. }
            | RunError::ReportsNotADirectory { .. }
            | RunError::UntrustedReports { .. }
            | RunError::NoGit { .. }
            | RunError::ReportsDotDot { .. }
            | RunError::ReportsNotWritable { .. }
            | RunError::ReportsCannotBeMade { .. }
            | RunError::TestFileLink { .. }
            | RunError::TestFileMissing { .. }
            | RunError::NoQualifyLayer { .. }
            | RunError::StaleRecord { .. }
            | RunError::ManifestChanged { .. }
            | RunError::NoChangedRun { .. }
            | RunError::ForeignBatchDir { .. }
            | RunError::SourceUnreadable { .. } => Failure::Usage,
            // A reports folder cibox cannot clear or make is the user's to fix.
            RunError::BatchDir { what, .. } if matches!(*what, "clear" | "create") => {
                Failure::Usage
            }
            RunError::PoolTooSmall { .. } => Failure::Capacity,
            RunError::SlurmGpusHeld { .. }
            | RunError::SlurmGpusSick { .. }
            | RunError::SlurmGpuCount { .. }
            | RunError::SlurmGpuOutsidePool { .. }
            | RunError::SlurmUnitOutsidePool { .. } => Failure::Infra,
            RunError::OnNode { code, .. } => failure_of_code(*code),
            RunError::RunLocks { .. }
            | RunError::BatchDir { .. }
            | RunError::Panicked
            | RunError::Watchdog(_)
            | RunError::CurrentExe(_)
            | RunError::NodeJob(_)
            | RunError::Record { .. }
            | RunError::NoStopToken(_)
            | RunError::NoRunId(_)
            | RunError::NoRendezvous(_)
            | RunError::HolderNotStarted { .. }
            | RunError::PrivateLayerNowhere { .. } => Failure::Infra,
        }
    }
}
