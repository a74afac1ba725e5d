//! cibox's error type: every failure a command can end with, and the one place they
//! become exit codes ([`Error::exit_code`], through [`Failure::code`]).
//!
//! Domain layers have error types of their own and say which kind of [`Failure`] each
//! is; this type only gathers them for the commands.

use crate::cache::CacheError;
use crate::changed::ChangedError;
use crate::claims::ClaimsError;
use crate::engine::EngineError;
use crate::exit::Failure;
use crate::git::GitError;
use crate::gpu::LeaseError;
use crate::gpu::probe::ProbeError;
use crate::host::{GrantError, PolicyError};
use crate::image::ImageError;
use crate::image::archive::ArchiveError;
use crate::image::build_context::BuildContextError;
use crate::image::lockset::LocksetError;
use crate::image::recipe::RecipeError;
use crate::lockdir::LockDirError;
use crate::manifest::ManifestError;
use crate::runner::RecordError;
use crate::runner::{PlanError, RunError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad flag or argument the parser could not catch.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error(transparent)]
    Lockset(#[from] LocksetError),
    #[error(transparent)]
    BuildContext(#[from] BuildContextError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// `image build`: the recipe could not be built, loaded or verified.
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Claims(#[from] ClaimsError),
    #[error(transparent)]
    LockDir(#[from] LockDirError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Slurm(#[from] crate::slurm::SlurmError),
    #[error(transparent)]
    Changed(#[from] ChangedError),
    #[error(transparent)]
    Git(#[from] GitError),
    /// A run record a user named cannot be read.
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// `capacity --require`: the GPUs a layer needs are not there.
    #[error("{0}")]
    Capacity(String),
    /// The host lacks something cibox needs (a tool, a runtime).
    #[error("{0}")]
    Infra(String),
}

impl Error {
    /// An image refusal found by a command (not by verification).
    pub fn refused(message: impl Into<String>) -> Error {
        Error::Image(ImageError::refused(message))
    }

    /// What kind of failure this is.
    pub fn failure(&self) -> Failure {
        match self {
            Error::Usage(_) | Error::Manifest(_) | Error::Lockset(_) | Error::Record(_) => {
                Failure::Usage
            }
            Error::Policy(e) => e.failure(),
            Error::Grant(e) => e.failure(),
            Error::BuildContext(e) => e.failure(),
            Error::Changed(e) => e.failure(),
            // git is asked about the user's checkout and revisions.
            Error::Git(_) => Failure::Usage,
            Error::Image(e) => e.failure(),
            Error::Archive(e) => e.failure(),
            Error::Recipe(e) => e.failure(),
            Error::Engine(e) => e.failure(),
            Error::Probe(e) => e.failure(),
            Error::Claims(e) => e.failure(),
            Error::LockDir(e) => e.failure(),
            Error::Lease(e) => e.failure(),
            Error::Plan(e) => e.failure(),
            Error::Run(e) => e.failure(),
            Error::Cache(e) => e.failure(),
            Error::Slurm(e) => e.failure(),
            Error::Capacity(_) => Failure::Capacity,
            Error::Infra(_) => Failure::Infra,
        }
    }

    /// The exit code for this error (docs/interface.md §2).
    pub fn exit_code(&self) -> u8 {
        self.failure().code()
    }

    /// Lines to print under the headline.
    pub fn details(&self) -> &[String] {
        match self {
            Error::Image(e) | Error::Run(RunError::Image(e)) => e.details(),
            Error::Recipe(e) => e.details(),
            _ => &[],
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
