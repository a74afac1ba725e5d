//! One query of a probe program (nvidia-smi, rocm-smi), running: started in its own
//! process group, its output read on threads, waited for until a deadline and killed,
//! with everything it started, past it.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::error::ProbeError;

/// A query running.
pub(super) struct Query {
    program: String,
    /// What it asks, as errors name it (`--query-gpu=…`).
    query: &'static str,
    /// The variable that names the program, for a refusal to start it.
    knob: &'static str,
    child: std::process::Child,
    out_reader: std::thread::JoinHandle<Vec<u8>>,
    err_reader: std::thread::JoinHandle<Vec<u8>>,
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
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a timeout kills a wrapper script and its children.
            .process_group(0)
            .spawn()
            .map_err(|e| ProbeError::Spawn {
                program: program.into(),
                reason: e.to_string(),
                knob,
            })?;
        // Read both pipes on threads so a chatty child cannot block on a full pipe.
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let out_reader = std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = stdout.read_to_end(&mut s);
            s
        });
        let err_reader = std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = stderr.read_to_end(&mut s);
            s
        });
        Ok(Query {
            program: program.into(),
            query,
            knob,
            child,
            out_reader,
            err_reader,
        })
    }

    /// Kills the query's whole process group and reaps it.
    pub(super) fn kill(mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// Waits for the query until `deadline`; its output, or why there is none.
    pub(super) fn finish(
        mut self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<String, ProbeError> {
        let (program, query, knob) = (self.program.clone(), self.query, self.knob);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    self.kill();
                    return Err(ProbeError::Timeout {
                        program,
                        query,
                        secs: timeout.as_secs().max(1),
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    self.kill();
                    return Err(ProbeError::Spawn {
                        program,
                        reason: e.to_string(),
                        knob,
                    });
                }
            }
        };
        let stdout = self.out_reader.join().unwrap_or_default();
        let stderr = self.err_reader.join().unwrap_or_default();
        if !status.success() {
            let stderr = String::from_utf8_lossy(&stderr);
            let first = stderr
                .lines()
                .chain(std::str::from_utf8(&stdout).unwrap_or("").lines())
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output")
                .trim()
                .to_string();
            return Err(ProbeError::Failed {
                program,
                query,
                status: status.to_string(),
                stderr: first,
            });
        }
        String::from_utf8(stdout).map_err(|_| ProbeError::Parse {
            program,
            query,
            line: 0,
            reason: "output is not UTF-8".into(),
        })
    }
}
