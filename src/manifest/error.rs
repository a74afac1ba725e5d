//! Why a manifest cannot be used.

use crate::yaml::Mark;

pub const FILE_NAME: &str = "cibox.yaml";

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(
        "no {FILE_NAME} in {start} or any folder above it (up to the git root); pass --manifest PATH or set CIBOX_MANIFEST"
    )]
    NotFound { start: String },
    #[error("cannot read manifest {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}:{mark}: {message}")]
    At {
        path: String,
        mark: Mark,
        message: String,
    },
    #[error("{var}: {message}")]
    Env { var: &'static str, message: String },
}

impl crate::error::ErrorKind for ManifestError {
    /// The manifest is the user's input.
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
}
