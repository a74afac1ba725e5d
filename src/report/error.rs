//! Why a reporter could not write what it owns.

use crate::error::ErrorKind;
use crate::exit::Failure;

/// A reporter could not write what it owns (a reports file).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct ReporterError {
    pub what: String,
    #[source]
    pub source: std::io::Error,
}

impl ReporterError {
    pub fn new(what: impl Into<String>, source: std::io::Error) -> ReporterError {
        ReporterError {
            what: what.into(),
            source,
        }
    }
}

impl ErrorKind for ReporterError {
    fn failure(&self) -> Failure {
        Failure::Infra
    }
}
