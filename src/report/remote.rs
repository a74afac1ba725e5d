//! A batch's events as they travel from its node to the submitter (docs/interface.md
//! §14): the node runs the batch as a local run does and tells a [`Remote`] for each
//! event; the submitter turns them back into [`crate::runner::Event`]s for its reporters.
//!
//! A frame is one message of [`crate::slurm::wire`]: `o` and the batch's output bytes,
//! or `j` and a [`Remote`] as JSON.

use serde::{Deserialize, Serialize};

use crate::gpu::WaitReport;
use crate::gpu::pool::PoolGpu;
use crate::report::event::{Event, Phase};
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
    Message(Box<Remote>),
}

/// The frame of some output.
pub fn output_frame(bytes: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(bytes.len() + 1);
    f.push(b'o');
    f.extend_from_slice(bytes);
    f
}

/// The frame of a message.
pub fn message_frame(message: &Remote) -> Vec<u8> {
    let mut f = vec![b'j'];
    f.extend(serde_json::to_vec(message).expect("a remote message serialises"));
    f
}

/// Reads a frame.
pub fn decode(frame: &[u8]) -> Result<Frame, String> {
    match frame.split_first() {
        Some((b'o', bytes)) => Ok(Frame::Output(bytes.to_vec())),
        Some((b'j', json)) => serde_json::from_slice(json)
            .map(|m| Frame::Message(Box::new(m)))
            .map_err(|e| format!("not a message cibox sends: {e}")),
        _ => Err("not a frame cibox sends".into()),
    }
}

/// The message a node sends for `event`, or `None` for events that stay on the node
/// (the run's own, and output, which goes as its own frame).
pub fn of_event(event: &Event<'_>) -> Option<Remote> {
    Some(match event {
        Event::Waiting { report, .. } => Remote::Waiting { report: report() },
        Event::LeaseGranted { gpus, .. } => Remote::Leased {
            gpus: gpus.to_vec(),
        },
        Event::Launching { .. } => Remote::Launching,
        Event::ContainerStarted { container, .. } => Remote::ContainerStarted {
            container: container.to_string(),
        },
        Event::OutputEnded { .. } => Remote::OutputEnded,
        Event::Phase {
            batch: Some(_),
            phase,
            detail,
            ..
        } => Remote::Phase {
            phase: *phase,
            detail: detail.clone(),
        },
        Event::TimedOut { .. } => Remote::TimedOut,
        Event::OutputBroke { error, .. } => Remote::OutputBroke {
            error: error.to_string(),
        },
        Event::BatchFailed { error, .. } => Remote::Failed {
            message: error.to_string(),
            details: error.details().to_vec(),
            code: error.failure().code(),
        },
        Event::BatchEnded { result } => Remote::Ended {
            record: Box::new(result.record.clone()),
            cases: result.cases.clone(),
            container_left: result.container_left,
        },
        Event::RunStarted { .. }
        | Event::Swept { .. }
        | Event::BatchStarted
        | Event::Output { .. }
        | Event::RunEnded { .. }
        | Event::Queued { .. }
        // The submitter ticks for itself; the run's own steps are the submitter's.
        | Event::Tick { .. }
        | Event::Phase { batch: None, .. } => return None,
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
        match decode(&message_frame(&m)).unwrap() {
            Frame::Message(m) => assert!(matches!(*m, Remote::Failed { code: 5, .. })),
            other => panic!("{other:?}"),
        }
        let m = Remote::Phase {
            phase: Phase::Copy,
            detail: "3 file(s)".into(),
        };
        match decode(&message_frame(&m)).unwrap() {
            Frame::Message(m) => assert!(
                matches!(*m, Remote::Phase { phase: Phase::Copy, ref detail } if detail == "3 file(s)")
            ),
            other => panic!("{other:?}"),
        }
        assert!(decode(b"x").is_err());
        assert!(decode(b"j{").is_err());
    }
}
