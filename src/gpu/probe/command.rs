//! One query of a probe program (nvidia-smi, rocm-smi), running: started in its own
//! process group, waited for until a deadline and killed, with everything it started,
//! past it ([`crate::process::bounded`]). Its answer may hold at most
//! [`MAX_ANSWER_BYTES`]: one past it is a probe failure, never read whole.

use std::process::Command;
use std::time::{Duration, Instant};

use super::error::ProbeError;
use crate::process::bounded::{BoundedError, Bounds, Running};

/// The most a probe's answer may hold (its standard output): a host's GPUs and their
/// processes take kilobytes.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// The most of a probe's standard error kept, for the line that says why it failed.
const MAX_ERROR_BYTES: usize = 64 << 10;

/// A query running.
pub(super) struct Query {
    program: String,
    /// What it asks, as errors name it (`--query-gpu=…`).
    query: &'static str,
    /// The variable that names the program, for a refusal to start it.
    knob: &'static str,
    running: Running,
}

impl Query {
    /// Starts `program args…`; `query` names it in errors, `knob` the variable that
    /// chooses the program.
    pub(super) fn start(
        program: &str,
        query: &'static str,
        args: &[&str],
        knob: &'static str,
    ) -> Result<Query, ProbeError> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        let running = Running::start(cmd, false).map_err(|e| ProbeError::Spawn {
            program: program.into(),
            reason: e.to_string(),
            knob,
        })?;
        Ok(Query {
            program: program.into(),
            query,
            knob,
            running,
        })
    }

    /// Kills the query's whole process group and reaps it.
    pub(super) fn kill(self) {
        self.running.kill();
    }

    /// Waits for the query until `deadline` (its answer read whole by then, whatever
    /// its children hold); its output, or why there is none.
    pub(super) fn finish(self, deadline: Instant, timeout: Duration) -> Result<String, ProbeError> {
        let (program, query) = (self.program.clone(), self.query);
        let answer = self.finish_any(deadline, timeout)?;
        if !answer.success {
            return Err(answer.failed(program, query));
        }
        Ok(answer.stdout)
    }

    /// As [`Query::finish`], but an answer is given whatever the exit status (a tool
    /// whose exit status says more than whether its answer holds: rocm-smi's).
    pub(super) fn finish_any(
        self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Answer, ProbeError> {
        let (program, query, knob) = (self.program, self.query, self.knob);
        let bounds = Bounds {
            deadline,
            max_stdout: MAX_ANSWER_BYTES,
            max_stderr: MAX_ERROR_BYTES,
        };
        let answer = self.running.finish(b"", bounds).map_err(|e| match e {
            BoundedError::Timeout | BoundedError::Held => ProbeError::Timeout {
                program: program.clone(),
                query,
                secs: timeout.as_secs().max(1),
            },
            BoundedError::TooLarge { max } => ProbeError::Parse {
                program: program.clone(),
                query,
                line: 0,
                reason: format!(
                    "the answer is over {} MiB, more than any host's GPUs take",
                    max >> 20
                ),
            },
            BoundedError::Spawn(e) | BoundedError::Io(e) => ProbeError::Spawn {
                program: program.clone(),
                reason: e.to_string(),
                knob,
            },
        })?;
        let stderr = String::from_utf8_lossy(&answer.stderr).into_owned();
        let status = answer.status;
        let stdout = match String::from_utf8(answer.stdout) {
            Ok(s) => s,
            Err(e) if !status.success() => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            Err(_) => {
                return Err(ProbeError::Parse {
                    program,
                    query,
                    line: 0,
                    reason: "output is not UTF-8".into(),
                });
            }
        };
        Ok(Answer {
            success: status.success(),
            status: status.to_string(),
            stdout,
            stderr,
        })
    }
}

/// What a query answered, whatever its exit status.
pub(super) struct Answer {
    pub success: bool,
    /// The exit status, as said (`exit status: 2`).
    pub status: String,
    pub stdout: String,
    pub stderr: String,
}

impl Answer {
    /// The failure a non-zero exit is: its first line of standard error (else of its
    /// output).
    pub(super) fn failed(&self, program: String, query: &'static str) -> ProbeError {
        let first = self
            .stderr
            .lines()
            .chain(self.stdout.lines())
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output")
            .trim()
            .to_string();
        ProbeError::Failed {
            program,
            query,
            status: self.status.clone(),
            stderr: first,
        }
    }
}
