//! What a command refuses or lacks where no domain error says it.

use crate::error::{Error, ErrorKind};
use crate::exit::Failure;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// A bad flag or argument the parser could not catch.
    #[error("{0}")]
    Usage(String),
    /// `capacity --require`: the GPUs a layer needs are not there.
    #[error("{0}")]
    Capacity(String),
    /// The host lacks something cibox needs (a tool, a runtime).
    #[error("{0}")]
    Infra(String),
}

impl CommandError {
    pub fn usage(message: impl Into<String>) -> Error {
        CommandError::Usage(message.into()).into()
    }

    pub fn capacity(message: impl Into<String>) -> Error {
        CommandError::Capacity(message.into()).into()
    }

    pub fn infra(message: impl Into<String>) -> Error {
        CommandError::Infra(message.into()).into()
    }
}

impl ErrorKind for CommandError {
    fn failure(&self) -> Failure {
        match self {
            CommandError::Usage(_) => Failure::Usage,
            CommandError::Capacity(_) => Failure::Capacity,
            CommandError::Infra(_) => Failure::Infra,
        }
    }
}
