//! cibox's error type and the one place errors become exit codes.

use crate::engine::EngineError;
use crate::exit;
use crate::gpu::probe::ProbeError;
use crate::image::ImageError;
use crate::image::lockset::LocksetError;
use crate::lockdir::LockDirError;
use crate::manifest::ManifestError;
use crate::runner::PlanError;
use crate::runner::record::RecordError;
use crate::runner::reporter::ReportError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad flag or argument the parser could not catch.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Lockset(#[from] LocksetError),
    /// The image cannot be used; `details` are printed under the headline, one per line.
    #[error("image refused: {message}")]
    ImageRefused {
        message: String,
        details: Vec<String>,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    LockDir(#[from] LockDirError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A run record a user named cannot be read.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A reports file cannot be written.
    #[error(transparent)]
    Report(#[from] ReportError),
    /// The GPUs asked for could not be leased within the wait allowed.
    #[error("{0}")]
    Capacity(String),
    /// cibox was asked to stop while it waited or ran.
    #[error("stopped by {0}")]
    Interrupted(nix::sys::signal::Signal),
    /// The host lacks something cibox needs (a tool, a runtime).
    #[error("{0}")]
    Infra(String),
}

impl Error {
    pub fn refused(message: impl Into<String>) -> Error {
        Error::ImageRefused {
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// The exit code for this error (docs/interface.md §2): the one place errors
    /// become codes.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_)
            | Error::Manifest(_)
            | Error::Lockset(_)
            | Error::Record(_)
            | Error::Plan(
                PlanError::UnknownLayer { .. }
                | PlanError::UnknownBatch { .. }
                | PlanError::NotInLayer { .. }
                | PlanError::NothingToRun
                | PlanError::NoImage,
            ) => exit::USAGE,
            Error::ImageRefused { .. }
            | Error::Plan(PlanError::BadImageId(_))
            | Error::Engine(EngineError::Rejected { .. } | EngineError::ImageMissing { .. }) => {
                exit::IMAGE_REFUSED
            }
            // A lock dir that cannot be used is configuration (gpu.lock_dir), like a bad
            // pool entry.
            Error::LockDir(_) => exit::USAGE,
            Error::Capacity(_) => exit::CAPACITY,
            Error::Interrupted(sig) => exit::signal(*sig as i32),
            Error::Engine(_) | Error::Probe(_) | Error::Report(_) | Error::Infra(_) => exit::INFRA,
        }
    }

    /// Lines to print under the headline.
    pub fn details(&self) -> &[String] {
        match self {
            Error::ImageRefused { details, .. } => details,
            _ => &[],
        }
    }
}

impl From<ImageError> for Error {
    fn from(e: ImageError) -> Error {
        match e {
            ImageError::Refused { message, details } => Error::ImageRefused { message, details },
            ImageError::Engine(e) => Error::Engine(e),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
