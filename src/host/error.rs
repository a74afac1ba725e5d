//! Why the host policy cannot be used.

use crate::exit::Failure;
use crate::yaml::Mark;

/// Why the host policy cannot be used. Always the host's configuration (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("host policy {path}: {message}")]
    Unusable { path: String, message: String },
    #[error("host policy {path}:{mark}: {message}")]
    At {
        path: String,
        mark: Mark,
        message: String,
    },
    /// A project's manifest sets one of the host's GPU facts.
    #[error("{message}")]
    HostFact { message: String },
}

impl crate::error::ErrorKind for PolicyError {
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}
