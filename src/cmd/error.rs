//! What several commands refuse or lack where no domain error says it. A command's own
//! errors are defined in its file.

use crate::error::ErrorKind;
use crate::exit::Failure;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot read the current folder: {0}")]
    CurrentFolder(#[source] std::io::Error),
    #[error("writing the manual page: {0}")]
    ManPage(#[source] std::io::Error),
    #[error("--retries {0}: give 0 to {max} (how many more times a batch that did not pass runs)", max = crate::manifest::MAX_RETRIES)]
    BadRetries(u32),
    /// The Buildkite agent's parallel-job variables do not say a part.
    #[error(
        "{0}: the Buildkite agent sets both for a step with `parallelism`; or give --partition K/N"
    )]
    BuildkiteParallel(String),
}

impl ErrorKind for CommandError {
    fn failure(&self) -> Failure {
        match self {
            CommandError::CurrentFolder(_)
            | CommandError::BadRetries(_)
            | CommandError::BuildkiteParallel(_) => Failure::Usage,
            CommandError::ManPage(_) => Failure::Infra,
        }
    }
}
