//! Why a run, or one of its batches, could not go on.

use crate::claims::ClaimsError;
use crate::engine::EngineError;
use crate::exit::Failure;
use crate::gpu::LeaseError;
use crate::gpu::probe::ProbeError;
use crate::image::ImageError;
use crate::lockdir::LockDirError;

use super::reporter::ReportError;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    LockDir(#[from] LockDirError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Claims(#[from] ClaimsError),
    #[error(transparent)]
    Report(#[from] ReportError),
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
    #[error("cannot write the source's git config without its credentials: {0}")]
    GitMask(#[source] std::io::Error),
}

impl RunError {
    /// Lines to print under the headline.
    pub fn details(&self) -> &[String] {
        match self {
            RunError::Image(e) => e.details(),
            _ => &[],
        }
    }

    pub fn failure(&self) -> Failure {
        match self {
            RunError::Image(e) => e.failure(),
            RunError::Engine(e) => e.failure(),
            RunError::LockDir(e) => e.failure(),
            RunError::Lease(e) => e.failure(),
            RunError::Probe(e) => e.failure(),
            RunError::Claims(e) => e.failure(),
            RunError::Report(_) => Failure::Infra,
            RunError::Pool(_)
            | RunError::ForeignBatchDir { .. }
            | RunError::SourceUnreadable { .. } => Failure::Usage,
            // A reports folder cibox cannot clear or make is the user's to fix.
            RunError::BatchDir { what, .. } if matches!(*what, "clear" | "create") => {
                Failure::Usage
            }
            RunError::PoolTooSmall { .. } => Failure::Capacity,
            RunError::RunLocks { .. }
            | RunError::BatchDir { .. }
            | RunError::Panicked
            | RunError::Watchdog(_)
            | RunError::GitMask(_) => Failure::Infra,
        }
    }
}
