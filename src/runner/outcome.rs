//! How batches and runs end: the verdict of one batch (one place that turns an ending
//! into a status and an exit code), and what a run hands back to its caller.

use std::path::PathBuf;

use nix::sys::signal::Signal;

use super::error::RunError;
use super::junit::{Case, Totals};
use super::record::{RunRecord, Status};
use crate::exit::{self, Failure};

/// How one batch ended. The record's `status` and `exit_code` both come from here
/// (docs/interface.md §2 and §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    Failed,
    Timeout,
    /// cibox was asked to stop by this signal while the batch waited or ran.
    Cancelled(Signal),
    InfraError,
    ImageRefused,
    Capacity,
}

impl Ended {
    /// The container's exit code, when it had one.
    pub fn container_exit(&self) -> Option<i64> {
        match self {
            Ended::Exited(code) => Some(*code),
            Ended::Stopped { exit, .. } => *exit,
            Ended::Unknown => None,
        }
    }
}

impl Verdict {
    pub fn status(self) -> Status {
        match self {
            Verdict::Passed => Status::Passed,
            Verdict::Failed => Status::Failed,
            Verdict::Timeout => Status::Timeout,
            Verdict::Cancelled(_) => Status::Cancelled,
            Verdict::InfraError => Status::InfraError,
            Verdict::ImageRefused => Status::ImageRefused,
            Verdict::Capacity => Status::Capacity,
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Passed => exit::SUCCESS,
            Verdict::Failed => exit::TESTS_FAILED,
            Verdict::Timeout => exit::TIMEOUT,
            Verdict::Cancelled(sig) => exit::signal(sig as i32),
            Verdict::InfraError => exit::INFRA,
            Verdict::ImageRefused => exit::IMAGE_REFUSED,
            Verdict::Capacity => exit::CAPACITY,
        }
    }

    /// The verdict on a batch that an error kept from running to its end, or `None`
    /// when the error is not the batch's but the run's (bad configuration: it stops
    /// the run with its own exit code).
    pub fn of_error(e: &RunError) -> Option<Verdict> {
        match e.failure() {
            Failure::Usage => None,
            Failure::Signal(sig) => Some(Verdict::Cancelled(sig)),
            Failure::Capacity => Some(Verdict::Capacity),
            Failure::ImageRefused => Some(Verdict::ImageRefused),
            Failure::Infra => Some(Verdict::InfraError),
        }
    }
}

/// How the container of a batch ended, before its reports are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// It ran to its end with this exit code.
    Exited(i64),
    /// It ended otherwise (timeout, cancel, an engine or lease failure): the verdict
    /// is decided, and why.
    Stopped {
        verdict: Verdict,
        message: String,
        /// The container's exit code, when it had one (a timed-out container's 143).
        exit: Option<i64>,
    },
    /// Its output closed but its exit code could not be learnt.
    Unknown,
}

/// The batch's verdict from how its container ended and what its reports say.
pub fn judge(
    ended: &Ended,
    totals: &Totals,
    junit_problem: Option<String>,
    allow_empty: bool,
) -> (Verdict, Option<String>) {
    match ended {
        Ended::Stopped {
            verdict, message, ..
        } => return (*verdict, Some(message.clone())),
        Ended::Unknown => {
            return (
                Verdict::InfraError,
                Some("the container's exit code is unknown".into()),
            );
        }
        Ended::Exited(0) => {}
        Ended::Exited(code) => {
            return (
                Verdict::Failed,
                Some(format!("a step exited with {code}; see log.txt")),
            );
        }
    }
    if let Some(p) = junit_problem {
        return (Verdict::Failed, Some(p));
    }
    if totals.failed + totals.errors > 0 {
        return (
            Verdict::Failed,
            Some(format!(
                "{} failed, {} errors",
                totals.failed, totals.errors
            )),
        );
    }
    if totals.total == 0 && !allow_empty {
        return (
            Verdict::Failed,
            Some("the batch ran no test (no JUnit test case under $CIBOX_REPORTS); set allow_empty to accept that".into()),
        );
    }
    (Verdict::Passed, None)
}

/// One batch's result: its record (as written to `result.json`), its test cases.
#[derive(Debug, Clone)]
pub struct BatchResult {
    pub verdict: Verdict,
    pub record: RunRecord,
    pub cases: Vec<Case>,
    /// Where its `result.json` is.
    pub record_path: PathBuf,
    /// Its container could not be removed.
    pub container_left: bool,
}

impl BatchResult {
    /// The failing and erroring test cases.
    pub fn failing(&self) -> impl Iterator<Item = &Case> {
        self.cases.iter().filter(|c| {
            matches!(
                c.outcome,
                super::junit::Outcome::Failed | super::junit::Outcome::Error
            )
        })
    }
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The batches that ran (or were refused), in the order they ended.
    pub batches: Vec<BatchResult>,
    /// The signal that stopped the run, if one did.
    pub stopped_by: Option<Signal>,
    pub reports: PathBuf,
}

impl RunOutcome {
    /// The run's exit code: the signal's when one stopped it, else the most severe of
    /// its batches' (docs/interface.md §2).
    pub fn exit_code(&self) -> u8 {
        match self.stopped_by {
            Some(sig) => exit::signal(sig as i32),
            None => exit::most_severe(self.batches.iter().map(|b| b.verdict.exit_code())),
        }
    }

    pub fn passed(&self) -> bool {
        self.stopped_by.is_none() && self.batches.iter().all(|b| b.verdict == Verdict::Passed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineError;
    use crate::gpu::LeaseError;

    fn totals(total: usize, failed: usize, errors: usize) -> Totals {
        Totals {
            total,
            passed: total - failed - errors,
            failed,
            errors,
            ..Totals::default()
        }
    }

    #[test]
    fn a_batch_passes_only_when_its_steps_and_its_tests_do() {
        let ok = Ended::Exited(0);
        assert_eq!(judge(&ok, &totals(3, 0, 0), None, false).0, Verdict::Passed);
        assert_eq!(judge(&ok, &totals(0, 0, 0), None, true).0, Verdict::Passed);
        let (v, why) = judge(&ok, &totals(0, 0, 0), None, false);
        assert_eq!(v, Verdict::Failed);
        assert!(why.unwrap().contains("set allow_empty"));
        let (v, why) = judge(&ok, &totals(3, 1, 1), None, false);
        assert_eq!(
            (v, why.as_deref()),
            (Verdict::Failed, Some("1 failed, 1 errors"))
        );
        let (v, why) = judge(&ok, &totals(3, 0, 0), Some("bad xml".into()), true);
        assert_eq!((v, why.as_deref()), (Verdict::Failed, Some("bad xml")));
        let (v, why) = judge(&Ended::Exited(3), &totals(3, 0, 0), None, true);
        assert_eq!(v, Verdict::Failed);
        assert!(why.unwrap().contains("exited with 3"));
        assert_eq!(
            judge(&Ended::Unknown, &totals(3, 0, 0), None, true).0,
            Verdict::InfraError
        );
        let stopped = Ended::Stopped {
            verdict: Verdict::Timeout,
            message: "the batch hit its timeout of 5s".into(),
            exit: Some(143),
        };
        // A timeout stays a timeout whatever the reports say.
        assert_eq!(
            judge(&stopped, &totals(3, 0, 0), None, true).0,
            Verdict::Timeout
        );
    }

    #[test]
    fn verdicts_map_to_the_documented_codes() {
        assert_eq!(Verdict::Cancelled(Signal::SIGINT).exit_code(), 130);
        assert_eq!(Verdict::Cancelled(Signal::SIGHUP).exit_code(), 129);
        assert_eq!(
            Verdict::Cancelled(Signal::SIGTERM).status(),
            Status::Cancelled
        );
        assert_eq!(Verdict::Timeout.exit_code(), 124);
        assert_eq!(Verdict::ImageRefused.exit_code(), 3);
        let lease = |e| RunError::Lease(e);
        assert_eq!(
            Verdict::of_error(&lease(LeaseError::Interrupted(Signal::SIGINT))),
            Some(Verdict::Cancelled(Signal::SIGINT))
        );
        assert_eq!(Verdict::of_error(&RunError::Pool("x".into())), None);
        assert_eq!(
            Verdict::of_error(&lease(LeaseError::Capacity("x".into()))),
            Some(Verdict::Capacity)
        );
        assert_eq!(
            Verdict::of_error(&RunError::PoolTooSmall {
                batch: "b".into(),
                need: 9,
                pool: 8
            }),
            Some(Verdict::Capacity)
        );
        assert_eq!(
            Verdict::of_error(&RunError::Panicked),
            Some(Verdict::InfraError)
        );
        assert_eq!(
            Verdict::of_error(&RunError::Engine(EngineError::ImageMissing {
                image: "sha256:x".into()
            })),
            Some(Verdict::ImageRefused)
        );
    }
}
