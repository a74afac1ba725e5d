//! On a node of a Slurm job: the batch's events as messages to the submitter, on
//! standard output (which `srun` carries back), framed by [`crate::slurm::wire`].
//! The submitter renders them with its own reporters and writes the record.

use std::io::Write;
use std::time::Duration;

use crate::report::event::{Event, EventKind};
use crate::report::remote::{self, Remote};
use crate::report::reporter::{Reporter, ReporterError};
use crate::slurm::wire;

/// How often a wait is told: waits are polled every 10 ms.
const WAIT_EVERY: Duration = Duration::from_secs(2);
/// The most output in one frame, so the submitter shows it as it comes.
const OUTPUT_FRAME: usize = 16 << 10;

/// Sends a node's events to the submitter.
pub struct Wire<W: Write + Send> {
    out: W,
    /// When a wait was last told (the run's elapsed time).
    last_wait: Option<Duration>,
}

impl<W: Write + Send> Wire<W> {
    pub fn new(out: W) -> Wire<W> {
        Wire {
            out,
            last_wait: None,
        }
    }

    fn send(&mut self, frame: &[u8]) -> Result<(), ReporterError> {
        self.out
            .write_all(wire::encode(frame).as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|e| ReporterError::new("telling the submitter (srun's output)", e))
    }

    /// Tells the submitter the node could not run the batch at all (exit `code`).
    pub fn refused(
        &mut self,
        message: &str,
        details: &[String],
        code: u8,
    ) -> Result<(), ReporterError> {
        self.send(&remote::message_frame(
            &Remote::Refused {
                message: message.to_string(),
                details: details.to_vec(),
                code,
            },
            std::time::SystemTime::now(),
        ))
    }
}

impl Wire<std::io::Stdout> {
    pub fn stdout() -> Wire<std::io::Stdout> {
        Wire::new(std::io::stdout())
    }
}

impl<W: Write + Send> Reporter for Wire<W> {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        match &event.kind {
            EventKind::Output { bytes, .. } => {
                for chunk in bytes.chunks(OUTPUT_FRAME) {
                    self.send(&remote::output_frame(chunk))?;
                }
                Ok(())
            }
            EventKind::Waiting { .. } => {
                if self
                    .last_wait
                    .is_some_and(|t| event.elapsed.saturating_sub(t) < WAIT_EVERY)
                {
                    return Ok(());
                }
                self.last_wait = Some(event.elapsed);
                match remote::of_event(event) {
                    Some(m) => self.send(&remote::message_frame(&m, event.timestamp)),
                    None => Ok(()),
                }
            }
            _ => match remote::of_event(event) {
                Some(m) => self.send(&remote::message_frame(&m, event.timestamp)),
                None => Ok(()),
            },
        }
    }
}
