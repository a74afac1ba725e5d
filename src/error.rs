//! How an error says what kind of failure it is, and the one error every command ends
//! with.
//!
//! Every domain error implements [`ErrorKind`] next to its definition: which kind of
//! [`Failure`] it is (and so its exit code, through [`Failure::code`]) and the lines to
//! print under its headline. [`Error`] carries any of them, so that a layer's errors pass
//! up through the runner and the commands without a wrapper variant per type (and
//! without a table of their kinds kept twice).

use crate::exit::Failure;

/// What every error of cibox says about itself.
pub trait ErrorKind: std::error::Error + Send + Sync + 'static {
    /// Which kind of failure this is; its exit code follows.
    fn failure(&self) -> Failure;

    /// Lines to print under the headline (what was refused, and why).
    fn details(&self) -> &[String] {
        &[]
    }
}

/// Any error a run or a command ends with: one of the domain errors, as it was raised.
pub struct Error(Box<dyn ErrorKind>);

impl<E: ErrorKind> From<E> for Error {
    fn from(e: E) -> Error {
        Error(Box::new(e))
    }
}

impl Error {
    /// What kind of failure this is.
    pub fn failure(&self) -> Failure {
        self.0.failure()
    }

    /// The exit code for this error (docs/interface.md §2).
    pub fn exit_code(&self) -> u8 {
        self.failure().code()
    }

    /// Lines to print under the headline.
    pub fn details(&self) -> &[String] {
        self.0.details()
    }

    /// The error as raised, when it is an `E`.
    pub fn downcast_ref<E: ErrorKind>(&self) -> Option<&E> {
        let e: &(dyn std::error::Error + 'static) = &*self.0;
        e.downcast_ref::<E>()
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("no GPUs")]
    struct NoGpus;

    impl ErrorKind for NoGpus {
        fn failure(&self) -> Failure {
            Failure::Capacity
        }
    }

    #[test]
    fn an_error_keeps_its_kind_text_and_type() {
        let e = Error::from(NoGpus);
        assert_eq!(e.exit_code(), crate::exit::CAPACITY);
        assert_eq!(e.to_string(), "no GPUs");
        assert!(e.downcast_ref::<NoGpus>().is_some());
        assert!(e.details().is_empty());
    }
}
