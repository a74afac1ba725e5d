//! The nodes' frames as the submitter's events: what a node says of its batch becomes
//! the event its reporters would have seen from a local run, for the submitter's
//! [`BatchPlan`]. A batch on several nodes shows each node's output lines prefixed
//! with its rank, and the events the batch has once (its log opening, its timeout)
//! once.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use crate::console;
use crate::engine::EngineError;
use crate::plan::BatchPlan;
use crate::report::event::{EventKind, Phase};
use crate::report::outcome::ContainerEnd;
use crate::report::remote::{self, Frame, Remote};
use crate::report::reporter::terminal::prefix_lines;
use crate::run::error::RunError;
use crate::run::slurm::records::{Ended, JobEnd};
use crate::run::slurm::{Result, Submission};

/// What the relay of one batch remembers.
pub(super) struct Relay {
    /// The batch spans several nodes: output lines carry their rank.
    ranked: bool,
    at_line_start: BTreeMap<u32, bool>,
    launched: bool,
    timed_out: bool,
    /// A node's container has started: the batch's timeout runs.
    pub(super) started: bool,
    /// When the batch was submitted: its steps are timed from here.
    clock: Instant,
    /// The same moment on the wall clock, to place what the nodes say.
    submitted_at: SystemTime,
}

impl Relay {
    pub(super) fn new(ranked: bool, clock: Instant) -> Relay {
        Relay {
            ranked,
            at_line_start: BTreeMap::new(),
            launched: false,
            timed_out: false,
            started: false,
            clock,
            submitted_at: SystemTime::now() - clock.elapsed(),
        }
    }

    /// One whole frame from the node of `rank`.
    pub(super) fn frame(
        &mut self,
        run: &Submission<'_>,
        b: &BatchPlan,
        rank: u32,
        bytes: &[u8],
        end: &mut JobEnd,
    ) -> Result<()> {
        match remote::decode(bytes) {
            Ok(Frame::Output(out)) => {
                end.printed += out.len() as u64;
                let out = if self.ranked {
                    let start = self.at_line_start.entry(rank).or_insert(true);
                    prefix_lines(&out, Some(&format!("node-{rank}")), start)
                } else {
                    out
                };
                run.emit(EventKind::Output {
                    batch: b,
                    bytes: &out,
                })
            }
            Ok(Frame::Message { at, remote }) => self.message(run, b, rank, *remote, at, end),
            Err(why) => {
                console::warn(format!(
                    "batch {}: its node (rank {rank}) sent {why}",
                    b.name
                ));
                Ok(())
            }
        }
    }

    fn message(
        &mut self,
        run: &Submission<'_>,
        b: &BatchPlan,
        rank: u32,
        m: Remote,
        at: SystemTime,
        end: &mut JobEnd,
    ) -> Result<()> {
        // What the node said, at the node's time (a clock behind the submitter's
        // counts as now): events, lease grants and steps keep when they happened.
        let since = at
            .duration_since(self.submitted_at)
            .unwrap_or_else(|_| self.clock.elapsed());
        match m {
            Remote::Waiting { report } => run.emit_at(
                at,
                EventKind::Waiting {
                    batch: b,
                    report: &|| report.clone(),
                },
            ),
            Remote::Leased { gpus } => {
                end.granted = Some(self.clock + since);
                run.emit_at(
                    at,
                    EventKind::LeaseGranted {
                        batch: b,
                        gpus: &gpus,
                    },
                )
            }
            Remote::Phase { phase, detail } => {
                if phase == Phase::Lease {
                    // A CPU batch's too: its wait ends where its node's lease would.
                    end.granted = Some(self.clock + since);
                }
                let detail = if self.ranked {
                    format!("node-{rank}: {detail}")
                } else {
                    detail
                };
                run.emit_at(
                    at,
                    EventKind::Phase {
                        batch: Some(b),
                        phase,
                        at: since,
                        detail,
                    },
                )
            }
            Remote::Launching if !self.launched => {
                self.launched = true;
                run.emit_at(at, EventKind::Launching { batch: b })
            }
            Remote::Launching => Ok(()),
            Remote::ContainerStarted { container } => {
                self.started = true;
                run.emit_at(
                    at,
                    EventKind::ContainerStarted {
                        batch: b,
                        container: &container,
                    },
                )
            }
            Remote::OutputEnded => run.emit_at(at, EventKind::OutputEnded { batch: b }),
            Remote::TimedOut if !self.timed_out => {
                self.timed_out = true;
                run.emit_at(at, EventKind::TimedOut { batch: b })
            }
            Remote::TimedOut => Ok(()),
            Remote::OutputBroke { error } => run.emit_at(
                at,
                EventKind::OutputBroke {
                    batch: b,
                    error: &EngineError::Api {
                        action: format!("following the batch on its node (rank {rank})"),
                        reason: error,
                    },
                },
            ),
            Remote::Failed {
                message,
                details,
                code,
            }
            | Remote::Refused {
                message,
                details,
                code,
            } => {
                let error = error_of(&message, &details, code);
                failed(run, b, rank, at, error, end)
            }
            Remote::Ended {
                record,
                cases,
                container_left,
            } => {
                end.ended.insert(
                    rank,
                    Ended {
                        record: *record,
                        cases,
                        container_left,
                    },
                );
                Ok(())
            }
        }
    }
}

/// A node's failure: said now where it ends the run (once, by the run's end), kept
/// for the batch's end.
fn failed(
    run: &Submission<'_>,
    b: &BatchPlan,
    rank: u32,
    at: SystemTime,
    error: crate::error::Error,
    end: &mut JobEnd,
) -> Result<()> {
    if ContainerEnd::of_error(&error).is_some() {
        run.emit_at(
            at,
            EventKind::BatchFailed {
                batch: b,
                error: &error,
            },
        )?;
    }
    end.failures.entry(rank).or_insert(error);
    Ok(())
}

/// The error a node's `Failed` or `Refused` stands for on the submitter.
pub fn error_of(message: &str, details: &[String], code: u8) -> crate::error::Error {
    RunError::OnNode {
        message: message.to_string(),
        details: details.to_vec(),
        code,
    }
    .into()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::report::event::{Event, RunClock};
    use crate::report::reporter::{Reporter, ReporterError};

    /// The steps it was told: when they happened, by the event and by the step.
    #[derive(Default)]
    struct Steps(Vec<(SystemTime, Duration)>);

    impl Reporter for Steps {
        fn handle(&mut self, event: &Event<'_>) -> std::result::Result<(), ReporterError> {
            if let EventKind::Phase { at, .. } = &event.kind {
                self.0.push((event.timestamp, *at));
            }
            Ok(())
        }
    }

    #[test]
    fn a_nodes_step_keeps_the_nodes_time_not_its_arrival() {
        let plan = crate::plan::run_plan::tests::run_plan();
        let policy = crate::host::SlurmPolicy {
            partition: None,
            account: None,
            qos: None,
            options: Vec::new(),
            grace: Duration::from_secs(60),
            cibox: None,
            gres_types: Vec::new(),
        };
        let mut steps = Steps::default();
        let reports = tempfile::tempdir().unwrap();
        let run = Submission {
            clock: RunClock::start(),
            reports: crate::nofollow::Folder::open(reports.path()).unwrap(),
            plan: &plan,
            policy: &policy,
            partition: "gpu".into(),
            cibox: "/usr/bin/cibox".into(),
            locksets: Default::default(),
            reporter: Mutex::new(&mut steps),
            first: Default::default(),
        };
        let b = &plan.batches[0];
        let mut relay = Relay::new(false, Instant::now());
        let mut end = JobEnd::default();
        // The node copied the source 5 s after the submission; the frame arrives now.
        let happened = relay.submitted_at + Duration::from_secs(5);
        let frame = remote::message_frame(
            &Remote::Phase {
                phase: Phase::Copy,
                detail: "3 file(s)".into(),
            },
            happened,
        );
        relay.frame(&run, b, 0, &frame, &mut end).unwrap();
        drop(run);
        let [(timestamp, at)] = steps.0[..] else {
            panic!("{:?}", steps.0);
        };
        // To the millisecond, as the wire carries it.
        assert!(happened.duration_since(timestamp).unwrap() < Duration::from_millis(1));
        assert!(at >= Duration::from_millis(4900), "{at:?}");
    }
}
