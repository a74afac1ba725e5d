//! How batches and runs end: how a batch's container ended ([`ContainerEnd`]), the one
//! place that turns that and its reports into the batch's [`Status`] ([`judge`]), and
//! what a run hands back to its caller ([`BatchResult`], [`RunResult`]).

use std::path::PathBuf;

use nix::sys::signal::Signal;

use crate::exit::{self, Failure};
use crate::report::junit::{Case, CaseStatus, Totals};
use crate::report::record::RunRecord;
pub use crate::report::record::Status;

/// How the container of a batch ended, before its reports are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerEnd {
    /// It ran to its end with this exit code.
    Exited(i64),
    /// It ended otherwise (timeout, an engine or lease failure): the status is
    /// decided, and why.
    Stopped {
        status: Status,
        message: String,
        /// The container's exit code, when it had one (a timed-out container's 143).
        exit: Option<i64>,
    },
    /// cibox was asked to stop by `signal` while the batch waited or ran.
    Cancelled {
        signal: Signal,
        message: String,
        exit: Option<i64>,
    },
    /// Its output closed but its exit code could not be learnt.
    Unknown,
}

impl ContainerEnd {
    /// The container's exit code, when it had one.
    pub fn container_exit(&self) -> Option<i64> {
        match self {
            ContainerEnd::Exited(code) => Some(*code),
            ContainerEnd::Stopped { exit, .. } | ContainerEnd::Cancelled { exit, .. } => *exit,
            ContainerEnd::Unknown => None,
        }
    }

    /// The signal that cancelled the batch, if one did.
    pub fn cancelled_by(&self) -> Option<Signal> {
        match self {
            ContainerEnd::Cancelled { signal, .. } => Some(*signal),
            _ => None,
        }
    }

    /// The ending of a batch that `e` kept from running to its end, or `None` when the
    /// error is not the batch's but the run's (bad configuration: it stops the run
    /// with its own exit code).
    pub fn of_error(e: &crate::error::Error) -> Option<ContainerEnd> {
        let message = e.to_string();
        let status = match e.failure() {
            Failure::Usage => return None,
            Failure::Signal(signal) => {
                return Some(ContainerEnd::Cancelled {
                    signal,
                    message,
                    exit: None,
                });
            }
            Failure::Capacity => Status::Capacity,
            Failure::ImageRefused => Status::ImageRefused,
            Failure::Infra => Status::InfraError,
        };
        Some(ContainerEnd::Stopped {
            status,
            message,
            exit: None,
        })
    }
}

impl Status {
    /// The exit code of a batch with this status (docs/interface.md §2); a cancelled
    /// one counts as the signal that cancelled it.
    pub fn exit_code(self, cancelled_by: Option<Signal>) -> u8 {
        match self {
            Status::Passed => exit::SUCCESS,
            Status::Failed => exit::TESTS_FAILED,
            Status::Timeout => exit::TIMEOUT,
            Status::Cancelled => exit::signal(cancelled_by.unwrap_or(Signal::SIGTERM) as i32),
            Status::InfraError => exit::INFRA,
            Status::ImageRefused => exit::IMAGE_REFUSED,
            Status::Capacity => exit::CAPACITY,
            // Another batch's failure stopped it: that one says what happened.
            Status::NotRun => exit::SUCCESS,
        }
    }
}

/// The batch's status from how its container ended and what its reports say, and why
/// it did not pass, in one line.
pub fn judge(
    ended: &ContainerEnd,
    totals: &Totals,
    junit_problem: Option<String>,
    allow_empty: bool,
) -> (Status, Option<String>) {
    match ended {
        ContainerEnd::Stopped {
            status, message, ..
        } => return (*status, Some(message.clone())),
        ContainerEnd::Cancelled { message, .. } => {
            return (Status::Cancelled, Some(message.clone()));
        }
        ContainerEnd::Unknown => {
            return (
                Status::InfraError,
                Some("the container's exit code is unknown".into()),
            );
        }
        ContainerEnd::Exited(0) => {}
        ContainerEnd::Exited(code) => {
            return (
                Status::Failed,
                Some(format!("a step exited with {code}; see log.txt")),
            );
        }
    }
    if let Some(p) = junit_problem {
        return (Status::Failed, Some(p));
    }
    if totals.failed + totals.errors > 0 {
        return (
            Status::Failed,
            Some(format!(
                "{} failed, {} errors",
                totals.failed, totals.errors
            )),
        );
    }
    if totals.total == 0 && !allow_empty {
        return (
            Status::Failed,
            Some("the batch ran no test (no JUnit test case under $CIBOX_REPORTS); set allow_empty to accept that".into()),
        );
    }
    (Status::Passed, None)
}

/// One batch's result: its record (as written to `result.json`), its test cases.
#[derive(Debug, Clone)]
pub struct BatchResult {
    pub record: RunRecord,
    pub cases: Vec<Case>,
    /// The attempts before the last, when it ran again (`retries`).
    pub earlier: Vec<EarlierAttempt>,
    /// Where its `result.json` is.
    pub record_path: PathBuf,
    /// Its container could not be removed.
    pub container_left: bool,
}

impl BatchResult {
    pub fn status(&self) -> Status {
        self.record.status
    }

    pub fn passed(&self) -> bool {
        self.record.status == Status::Passed
    }

    /// The signal that cancelled the batch, if one did (its exit code is 128 + N).
    pub fn cancelled_by(&self) -> Option<Signal> {
        (self.record.status == Status::Cancelled)
            .then(|| Signal::try_from(i32::from(self.record.exit_code) - 128).ok())
            .flatten()
    }

    /// The failing and erroring test cases.
    pub fn failing(&self) -> impl Iterator<Item = &Case> {
        self.cases
            .iter()
            .filter(|c| matches!(c.status, CaseStatus::Failed | CaseStatus::Error))
    }
}

/// What an attempt before the last left for the reports: how it ended and its failing
/// cases (JUnit's reruns of them).
#[derive(Debug, Clone)]
pub struct EarlierAttempt {
    pub attempt: u32,
    pub status: Status,
    pub message: Option<String>,
    pub failing: Vec<Case>,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The run's ID.
    pub run: String,
    /// The batches that ran (or were refused), in the order they ended.
    pub batches: Vec<BatchResult>,
    /// The signal that stopped the run, if one did.
    pub stopped_by: Option<Signal>,
    pub reports: PathBuf,
}

impl RunResult {
    /// The run's exit code: the signal's when one stopped it, else the most severe of
    /// its batches' (docs/interface.md §2).
    /// A soft failure (`soft_fail`) is left out: it is shown, and fails nothing.
    pub fn exit_code(&self) -> u8 {
        match self.stopped_by {
            Some(sig) => exit::signal(sig as i32),
            None => exit::most_severe(self.batches.iter().filter_map(|b| b.record.run_exit_code())),
        }
    }

    /// No signal stopped it and no batch failed it (soft failures fail nothing).
    pub fn passed(&self) -> bool {
        self.stopped_by.is_none() && !self.batches.iter().any(|b| b.record.counts_against_run())
    }

    /// The run's outcome as `--json` prints it (docs/interface.md §3): the run, its
    /// status and exit code, where its reports are, and each batch's record with the
    /// path of its `result.json`.
    pub fn to_json(&self) -> serde_json::Value {
        let batches: Vec<serde_json::Value> = self
            .batches
            .iter()
            .map(|b| {
                let mut record = serde_json::to_value(&b.record).expect("records serialise");
                if let Some(map) = record.as_object_mut() {
                    map.insert(
                        "result".into(),
                        serde_json::Value::from(b.record_path.display().to_string()),
                    );
                }
                record
            })
            .collect();
        serde_json::json!({
            "run": self.run,
            "status": if self.passed() { "passed" } else { "failed" },
            "exit_code": self.exit_code(),
            "stopped_by": self.stopped_by.map(|s| s.as_str()),
            "reports": self.reports,
            "summary": self.reports.join("summary.md"),
            "junit": self.reports.join("junit.xml"),
            "batches": batches,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineError;
    use crate::gpu::LeaseError;
    use crate::run::error::RunError;

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
        let ok = ContainerEnd::Exited(0);
        assert_eq!(judge(&ok, &totals(3, 0, 0), None, false).0, Status::Passed);
        assert_eq!(judge(&ok, &totals(0, 0, 0), None, true).0, Status::Passed);
        let (v, why) = judge(&ok, &totals(0, 0, 0), None, false);
        assert_eq!(v, Status::Failed);
        assert!(why.unwrap().contains("set allow_empty"));
        let (v, why) = judge(&ok, &totals(3, 1, 1), None, false);
        assert_eq!(
            (v, why.as_deref()),
            (Status::Failed, Some("1 failed, 1 errors"))
        );
        let (v, why) = judge(&ok, &totals(3, 0, 0), Some("bad xml".into()), true);
        assert_eq!((v, why.as_deref()), (Status::Failed, Some("bad xml")));
        let (v, why) = judge(&ContainerEnd::Exited(3), &totals(3, 0, 0), None, true);
        assert_eq!(v, Status::Failed);
        assert!(why.unwrap().contains("exited with 3"));
        assert_eq!(
            judge(&ContainerEnd::Unknown, &totals(3, 0, 0), None, true).0,
            Status::InfraError
        );
        let stopped = ContainerEnd::Stopped {
            status: Status::Timeout,
            message: "the batch hit its timeout of 5s".into(),
            exit: Some(143),
        };
        // A timeout stays a timeout whatever the reports say.
        assert_eq!(
            judge(&stopped, &totals(3, 0, 0), None, true).0,
            Status::Timeout
        );
    }

    /// Issue 48: a soft-fail batch whose infrastructure error was retried, and which
    /// then failed, exited 0: `soft_fail` forgives the batch's failures, never the
    /// host's.
    #[test]
    fn a_soft_failure_after_an_infrastructure_error_fails_the_run_as_one() {
        use crate::report::record::AttemptRecord;
        let mut run = crate::report::reporter::sample::shaped_run();
        run.batches
            .retain(|b| b.record.batch == "experimental" || b.record.status == Status::Passed);
        assert!(run.batches.iter().any(|b| b.record.soft_fail));
        assert_eq!((run.exit_code(), run.passed()), (0, true));
        for b in &mut run.batches {
            if b.record.soft_fail {
                b.record.attempts = 2;
                b.record.earlier_attempts.push(AttemptRecord {
                    attempt: 1,
                    status: Status::InfraError,
                    exit_code: exit::INFRA,
                    message: Some("the engine lost the container".into()),
                    started_at: b.record.started_at.clone(),
                    duration_s: 1.0,
                    failed_tests: Vec::new(),
                    gpus: Vec::new(),
                });
            }
        }
        assert_eq!((run.exit_code(), run.passed()), (exit::INFRA, false));
    }

    #[test]
    fn statuses_map_to_the_documented_codes() {
        assert_eq!(Status::Cancelled.exit_code(Some(Signal::SIGINT)), 130);
        assert_eq!(Status::Cancelled.exit_code(Some(Signal::SIGHUP)), 129);
        assert_eq!(Status::Timeout.exit_code(None), 124);
        assert_eq!(Status::ImageRefused.exit_code(None), 3);
        let of = |e: crate::error::Error| {
            ContainerEnd::of_error(&e).map(|end| {
                (
                    judge(&end, &Totals::default(), None, true).0,
                    end.cancelled_by(),
                )
            })
        };
        assert_eq!(
            of(LeaseError::Interrupted(Signal::SIGINT).into()),
            Some((Status::Cancelled, Some(Signal::SIGINT)))
        );
        assert_eq!(
            of(crate::gpu::pool::PoolError::NotOnHost {
                item: "9".into(),
                probed: vec![0]
            }
            .into()),
            None
        );
        assert_eq!(
            of(LeaseError::QueueTimedOut { dir: "x".into() }.into()),
            Some((Status::Capacity, None))
        );
        assert_eq!(
            of(RunError::PoolTooSmall {
                batch: "b".into(),
                need: 9,
                pool: 8
            }
            .into()),
            Some((Status::Capacity, None))
        );
        assert_eq!(
            of(RunError::Panicked.into()),
            Some((Status::InfraError, None))
        );
        assert_eq!(
            of(EngineError::ImageMissing {
                image: "sha256:x".into()
            }
            .into()),
            Some((Status::ImageRefused, None))
        );
    }

    #[test]
    fn the_json_outcome_of_a_mixed_run() {
        let run = crate::report::reporter::sample::run();
        insta::assert_snapshot!(serde_json::to_string_pretty(&run.to_json()).unwrap());
    }
}
