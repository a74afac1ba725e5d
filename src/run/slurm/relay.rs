//! The nodes' frames as the submitter's events: what a node says of its batch becomes
//! the event its reporters would have seen from a local run, for the submitter's
//! [`BatchPlan`]. A batch on several nodes shows each node's output lines prefixed
//! with its rank, and the events the batch has once (its log opening, its timeout)
//! once.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::console;
use crate::engine::EngineError;
use crate::plan::BatchPlan;
use crate::report::event::{Event, Phase};
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
                run.emit(&Event::Output {
                    batch: b,
                    bytes: &out,
                })
            }
            Ok(Frame::Message(m)) => self.message(run, b, rank, *m, end),
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
        end: &mut JobEnd,
    ) -> Result<()> {
        match m {
            Remote::Waiting { report } => run.emit(&Event::Waiting {
                batch: b,
                report: &|| report.clone(),
            }),
            Remote::Leased { gpus } => {
                end.granted = Some(Instant::now());
                run.emit(&Event::LeaseGranted {
                    batch: b,
                    gpus: &gpus,
                })
            }
            Remote::Phase { phase, detail } => {
                if phase == Phase::Lease {
                    // A CPU batch's too: its wait ends where its node's lease would.
                    end.granted = Some(Instant::now());
                }
                let detail = if self.ranked {
                    format!("node-{rank}: {detail}")
                } else {
                    detail
                };
                run.emit(&Event::Phase {
                    batch: Some(b),
                    phase,
                    at: self.clock.elapsed(),
                    detail,
                })
            }
            Remote::Launching if !self.launched => {
                self.launched = true;
                run.emit(&Event::Launching {
                    batch: b,
                    dir: &b.dir,
                })
            }
            Remote::Launching => Ok(()),
            Remote::ContainerStarted { container } => {
                self.started = true;
                run.emit(&Event::ContainerStarted {
                    batch: b,
                    container: &container,
                })
            }
            Remote::OutputEnded => run.emit(&Event::OutputEnded { batch: b }),
            Remote::TimedOut if !self.timed_out => {
                self.timed_out = true;
                run.emit(&Event::TimedOut { batch: b })
            }
            Remote::TimedOut => Ok(()),
            Remote::OutputBroke { error } => run.emit(&Event::OutputBroke {
                batch: b,
                error: &EngineError::Api {
                    action: format!("following the batch on its node (rank {rank})"),
                    reason: error,
                },
            }),
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
                // An error that ends the run is said once, by the run's end.
                if ContainerEnd::of_error(&error).is_some() {
                    run.emit(&Event::BatchFailed {
                        batch: b,
                        error: &error,
                    })?;
                }
                end.failures.entry(rank).or_insert(error);
                Ok(())
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

/// The error a node's `Failed` or `Refused` stands for on the submitter.
pub fn error_of(message: &str, details: &[String], code: u8) -> crate::error::Error {
    RunError::OnNode {
        message: message.to_string(),
        details: details.to_vec(),
        code,
    }
    .into()
}
