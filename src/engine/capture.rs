//! A disposable container whose one command's output is the point (a test list's
//! collector): created, attached, started, its standard output kept up to a bound, its
//! standard error's tail kept, stopped at a deadline, and removed by the ID created,
//! whatever happened.

use std::time::Duration;

use futures_util::StreamExt;

use super::{Engine, EngineError};

/// The bounds of a captured command.
#[derive(Debug, Clone, Copy)]
pub struct CaptureBounds {
    /// From its start to its end; past it the container is killed.
    pub wall: Duration,
    /// The most bytes of standard output kept; one more and the container is killed.
    pub max_stdout: usize,
}

/// How a captured command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureEnd {
    /// It ended by itself, with this exit code (`None`: the engine could not say).
    Exited(Option<i64>),
    /// Its wall time passed: killed.
    TimedOut,
    /// It printed more than `max_stdout` bytes: killed.
    TooLarge,
}

/// What a captured command printed, and how it ended.
#[derive(Debug)]
pub struct Captured {
    pub stdout: Vec<u8>,
    /// The last [`STDERR_TAIL`] bytes of its standard error.
    pub stderr_tail: Vec<u8>,
    pub end: CaptureEnd,
}

/// How much of standard error is kept: its end, where a traceback says why.
pub const STDERR_TAIL: usize = 4096;

/// How long an ended container's exit code is waited for.
const EXIT_WAIT: Duration = Duration::from_secs(10);

impl Engine {
    /// Runs `body` (its command as its first process) as container `name` within
    /// `bounds`, and removes it (killing it if it runs, its anonymous volumes with it)
    /// before returning, whatever happened.
    pub fn capture(
        &self,
        name: &str,
        body: bollard::models::ContainerCreateBody,
        bounds: CaptureBounds,
    ) -> Result<Captured, EngineError> {
        let id = self.create_container(name, body)?;
        let captured = self.rt.block_on(self.follow_captured(&id, bounds));
        let removed = self.remove_container(&id);
        let captured = captured?;
        removed?;
        Ok(captured)
    }

    /// Attaches to container `id`, starts it and keeps what it prints until it ends or
    /// a bound is passed (see [`Engine::capture`]).
    async fn follow_captured(
        &self,
        id: &str,
        bounds: CaptureBounds,
    ) -> Result<Captured, EngineError> {
        let opts = bollard::query_parameters::AttachContainerOptions {
            logs: true,
            stream: true,
            stdout: true,
            stderr: true,
            ..Default::default()
        };
        let attached = self
            .docker
            .attach_container(id, Some(opts))
            .await
            .map_err(|e| Self::api("attaching to the container", e))?;
        self.docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|e| Self::api("starting the container", e))?;
        let deadline = tokio::time::Instant::now() + bounds.wall;
        let mut output = attached.output;
        let (mut stdout, mut stderr_tail) = (Vec::new(), Vec::new());
        let mut end = None;
        while end.is_none() {
            tokio::select! {
                chunk = output.next() => match chunk {
                    Some(Ok(bollard::container::LogOutput::StdOut { message })) => {
                        if stdout.len() + message.len() > bounds.max_stdout {
                            end = Some(CaptureEnd::TooLarge);
                        } else {
                            stdout.extend_from_slice(&message);
                        }
                    }
                    Some(Ok(bollard::container::LogOutput::StdErr { message })) => {
                        stderr_tail.extend_from_slice(&message);
                        let over = stderr_tail.len().saturating_sub(STDERR_TAIL);
                        stderr_tail.drain(..over);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(Self::api("reading the container's output", e)),
                    None => end = Some(CaptureEnd::Exited(self.exit_code(id).await)),
                },
                _ = tokio::time::sleep_until(deadline) => end = Some(CaptureEnd::TimedOut),
            }
        }
        Ok(Captured {
            stdout,
            stderr_tail,
            end: end.unwrap_or(CaptureEnd::Exited(None)),
        })
    }

    /// The exit code of a container whose output has closed, once the engine knows it
    /// (within [`EXIT_WAIT`]).
    async fn exit_code(&self, id: &str) -> Option<i64> {
        let until = tokio::time::Instant::now() + EXIT_WAIT;
        loop {
            let state = self
                .docker
                .inspect_container(
                    id,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await
                .ok()
                .and_then(|d| d.state);
            match state {
                Some(s) if s.running != Some(true) => return s.exit_code,
                None => return None,
                Some(_) if tokio::time::Instant::now() >= until => return None,
                Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}
