//! Why a run, or one of its batches, could not go on, where no error of the layers
//! below says it: those (engine, leases, images, …) pass through as they are
//! ([`crate::error::Error`]).

use crate::error::ErrorKind;
use crate::exit::Failure;

/// What kept a run, or one of its batches, from going on, where no domain error says it.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Where to run (source, reports folder, scope) or which test file cannot be used.
    #[error("{0}")]
    Usage(String),
    /// A file the run writes for its caller (`qualification.json`) could not be written.
    #[error("{0}")]
    Infra(String),
    /// A `gpu.pool` entry names no GPU of this host.
    #[error("{0}")]
    Pool(String),
    #[error("batch {batch} needs {need} GPUs; the pool has {pool}")]
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
    /// The GPUs Slurm allocated on a node cannot be leased there (fail closed).
    #[error("{0}")]
    SlurmGpus(String),
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
            RunError::Usage(_)
            | RunError::Pool(_)
            | RunError::ForeignBatchDir { .. }
            | RunError::SourceUnreadable { .. } => Failure::Usage,
            // A reports folder cibox cannot clear or make is the user's to fix.
            RunError::BatchDir { what, .. } if matches!(*what, "clear" | "create") => {
                Failure::Usage
            }
            RunError::PoolTooSmall { .. } => Failure::Capacity,
            RunError::SlurmGpus(_) => Failure::Infra,
            RunError::OnNode { code, .. } => failure_of_code(*code),
            RunError::RunLocks { .. }
            | RunError::BatchDir { .. }
            | RunError::Panicked
            | RunError::Watchdog(_)
            | RunError::Infra(_) => Failure::Infra,
        }
    }
}
