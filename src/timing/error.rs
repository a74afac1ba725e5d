//! Why a timings file or a partition cannot be used.

#[derive(Debug, thiserror::Error)]
pub enum TimingError {
    #[error("--timings {path}: {why}")]
    File { path: String, why: String },
    #[error("--partition `{given}`: {why}; give K/N, part K (1 to N) of N (`--partition 2/4`)")]
    Partition { given: String, why: String },
}

impl crate::error::ErrorKind for TimingError {
    /// Both are the user's input: a flag, and a file a workflow handed on.
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
}
