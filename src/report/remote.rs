//! A batch's events as they travel from its node to the submitter (docs/interface.md
//! §14): the node runs the batch as a local run does and tells a [`Remote`] for each
//! event; the submitter turns them back into [`crate::report::Event`]s for its reporters.
//!
//! A frame is one message of [`crate::slurm::wire`]: `o` and the batch's output bytes,
//! or `j` and a [`Remote`] as JSON with when it happened on the node (`at_ms`, since
//! the Unix epoch), so that the submitter's events keep the node's time.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::gpu::WaitReport;
use crate::gpu::pool::PoolGpu;
use crate::report::event::{Event, EventKind, Phase};
use crate::report::junit::Case;
use crate::report::record::RunRecord;

/// What a node says of its batch, besides its output.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Remote {
    /// The batch waits for the GPUs Slurm allocated (held by something else here).
    Waiting { report: WaitReport },
    /// It holds them.
    Leased { gpus: Vec<PoolGpu> },
    /// Its container is about to be made.
    Launching,
    /// Its container runs.
    ContainerStarted { container: String },
    /// Its output has closed.
    OutputEnded,
    /// A step of the batch began or ended (what `-v` shows); the submitter times it
    /// from the batch's submission.
    Phase { phase: Phase, detail: String },
    /// It hit its timeout; its container is being stopped.
    TimedOut,
    /// Its output could not be followed to its end.
    OutputBroke { error: String },
    /// Something kept it from running to its end.
    Failed {
        message: String,
        details: Vec<String>,
        code: u8,
    },
    /// Its status and record, with its test cases.
    Ended {
        record: Box<RunRecord>,
        cases: Vec<Case>,
        container_left: bool,
    },
    /// The node could not run the batch at all (a manifest that changed, an image it
    /// lacks, a policy that does not grant what it asks): exit `code`.
    Refused {
        message: String,
        details: Vec<String>,
        code: u8,
    },
}

/// One frame, decoded.
#[derive(Debug)]
pub enum Frame {
    Output(Vec<u8>),
    /// A message, and when it happened on the node.
    Message {
        at: SystemTime,
        remote: Box<Remote>,
    },
}

/// A message as it travels: with its time.
#[derive(Serialize, Deserialize)]
struct Stamped {
    at_ms: u64,
    m: Remote,
}

/// The frame of some output.
pub fn output_frame(bytes: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(bytes.len() + 1);
    f.push(b'o');
    f.extend_from_slice(bytes);
    f
}

/// The frame of a message that happened `at`.
pub fn message_frame(message: &Remote, at: SystemTime) -> Vec<u8> {
    let at_ms = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut f = vec![b'j'];
    f.extend(
        serde_json::to_vec(&Stamped {
            at_ms,
            m: message.clone(),
        })
        .expect("a remote message serialises"),
    );
    f
}

/// Reads a frame.
pub fn decode(frame: &[u8]) -> Result<Frame, String> {
    match frame.split_first() {
        Some((b'o', bytes)) => Ok(Frame::Output(bytes.to_vec())),
        Some((b'j', json)) => serde_json::from_slice::<Stamped>(json)
            .map(|s| Frame::Message {
                at: SystemTime::UNIX_EPOCH + Duration::from_millis(s.at_ms),
                remote: Box::new(s.m),
            })
            .map_err(|e| format!("not a message cibox sends: {e}")),
        _ => Err("not a frame cibox sends".into()),
    }
}

/// The message a node sends for `event`, or `None` for events that stay on the node
/// (the run's own, and output, which goes as its own frame).
pub fn of_event(event: &Event<'_>) -> Option<Remote> {
    Some(match &event.kind {
        EventKind::Waiting { report, .. } => Remote::Waiting { report: report() },
        EventKind::LeaseGranted { gpus, .. } => Remote::Leased {
            gpus: gpus.to_vec(),
        },
        EventKind::Launching { .. } => Remote::Launching,
        EventKind::ContainerStarted { container, .. } => Remote::ContainerStarted {
            container: container.to_string(),
        },
        EventKind::OutputEnded { .. } => Remote::OutputEnded,
        EventKind::Phase {
            batch: Some(_),
            phase,
            detail,
            ..
        } => Remote::Phase {
            phase: *phase,
            detail: detail.clone(),
        },
        EventKind::TimedOut { .. } => Remote::TimedOut,
        EventKind::OutputBroke { error, .. } => Remote::OutputBroke {
            error: error.to_string(),
        },
        EventKind::BatchFailed { error, .. } => Remote::Failed {
            message: error.to_string(),
            details: error.details().to_vec(),
            code: error.failure().code(),
        },
        EventKind::BatchEnded { result } => Remote::Ended {
            record: Box::new(result.record.clone()),
            cases: result.cases.clone(),
            container_left: result.container_left,
        },
        EventKind::RunStarted { .. }
        | EventKind::Swept { .. }
        | EventKind::BatchStarted { .. }
        | EventKind::Output { .. }
        | EventKind::RunEnded { .. }
        | EventKind::Queued { .. }
        // A node runs one attempt: the submitter decides whether another follows.
        | EventKind::AttemptEnded { .. }
        // The submitter ticks for itself; the run's own steps are the submitter's.
        | EventKind::Tick { .. }
        | EventKind::Phase { batch: None, .. } => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        match decode(&output_frame(b"hi\n")).unwrap() {
            Frame::Output(b) => assert_eq!(b, b"hi\n"),
            other => panic!("{other:?}"),
        }
        let m = Remote::Failed {
            message: "m".into(),
            details: vec!["d".into()],
            code: 5,
        };
        // The node's time travels with the message, to the millisecond.
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_000_000_123);
        match decode(&message_frame(&m, at)).unwrap() {
            Frame::Message { at: got, remote } => {
                assert!(matches!(*remote, Remote::Failed { code: 5, .. }));
                assert_eq!(got, at);
            }
            other => panic!("{other:?}"),
        }
        let m = Remote::Phase {
            phase: Phase::Copy,
            detail: "3 file(s)".into(),
        };
        match decode(&message_frame(&m, at)).unwrap() {
            Frame::Message { remote, .. } => assert!(
                matches!(*remote, Remote::Phase { phase: Phase::Copy, ref detail } if detail == "3 file(s)")
            ),
            other => panic!("{other:?}"),
        }
        assert!(decode(b"x").is_err());
        assert!(decode(b"j{").is_err());
    }
}
