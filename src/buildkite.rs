//! Buildkite primitives: whether cibox runs as a job of the Buildkite agent, and
//! `buildkite-agent annotate`, bounded in size and time. A leaf: the run's Buildkite
//! reporter ([`crate::report::reporter::buildkite`]) builds on it.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::bounded::BoundedError;

/// Whether cibox runs as a Buildkite job (`BUILDKITE=true`, as the agent sets it).
pub fn active() -> bool {
    std::env::var("BUILDKITE").is_ok_and(|v| v == "true")
}

/// The most an annotation's body may hold (Buildkite refuses bodies over 1 MiB).
pub const MAX_ANNOTATION_BYTES: usize = 1 << 20;

/// How long `buildkite-agent annotate` may take: it talks to Buildkite over the
/// network, and a run's end must not hang on it.
pub const ANNOTATE_TIMEOUT: Duration = Duration::from_secs(30);

/// The agent's program: `buildkite-agent` from `PATH`.
const AGENT: &str = "buildkite-agent";

/// Why an annotation was not made.
#[derive(Debug, thiserror::Error)]
pub enum AnnotateError {
    #[error("`{AGENT}` is not on PATH, so the build has no annotation of this run")]
    NoAgent,
    #[error("`{AGENT} annotate` could not run: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("`{AGENT} annotate` took over {}s and was stopped", ANNOTATE_TIMEOUT.as_secs())]
    Timeout,
    #[error("`{AGENT} annotate` failed ({status}): {stderr}")]
    Failed { status: String, stderr: String },
}

/// The agent on `PATH`, if any.
fn agent() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(AGENT))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Annotates the build with `body` (Markdown, cut to [`MAX_ANNOTATION_BYTES`]) under
/// `context` in `style` (`success`, `warning`, `error`, `info`): the body goes on the
/// agent's standard input, never its command line; the agent gets
/// [`ANNOTATE_TIMEOUT`] to answer, whatever a child it leaves holds, then is killed
/// with its process group.
pub fn annotate(context: &str, style: &str, body: &str) -> Result<(), AnnotateError> {
    let program = agent().ok_or(AnnotateError::NoAgent)?;
    let mut body = body.to_string();
    if body.len() > MAX_ANNOTATION_BYTES {
        let note = "\n\n(cut at 1 MiB, the most an annotation holds)\n";
        let mut cut = MAX_ANNOTATION_BYTES - note.len();
        while !body.is_char_boundary(cut) {
            cut -= 1;
        }
        body.truncate(cut);
        body.push_str(note);
    }
    let mut cmd = Command::new(program);
    cmd.args(["annotate", "--context", context, "--style", style]);
    // Bounded as a whole: its answer read, or given up, by the deadline, whatever a
    // child it leaves behind holds (its group is killed once it exits).
    let answer = crate::process::bounded::run(
        cmd,
        body.as_bytes(),
        crate::process::bounded::Bounds {
            deadline: Instant::now() + ANNOTATE_TIMEOUT,
            max_stdout: 64 << 10,
            max_stderr: 4096,
        },
    );
    let answer = match answer {
        Ok(answer) => answer,
        Err(BoundedError::Spawn(e)) => return Err(AnnotateError::Spawn(e)),
        // Still running, or its output held open by what it left, at the deadline.
        Err(BoundedError::Timeout | BoundedError::Held) => return Err(AnnotateError::Timeout),
        Err(BoundedError::TooLarge { max }) => {
            return Err(AnnotateError::Failed {
                status: "stopped".into(),
                stderr: format!("it printed over {} KiB", max >> 10),
            });
        }
        Err(BoundedError::Io(e)) => return Err(AnnotateError::Spawn(e)),
    };
    let (status, stderr) = (answer.status, String::from_utf8_lossy(&answer.stderr));
    if status.success() {
        Ok(())
    } else {
        Err(AnnotateError::Failed {
            status: status.to_string(),
            stderr: crate::util::escape(stderr.lines().next().unwrap_or("").trim()).into_owned(),
        })
    }
}

/// The part of a parallel step this job is, `(K, N)` counted from 1, from
/// `BUILDKITE_PARALLEL_JOB` (from 0) and `BUILDKITE_PARALLEL_JOB_COUNT`, as the agent
/// sets them for a step with `parallelism: N`; `None` where they are not set.
pub fn parallel_job() -> Result<Option<(u32, u32)>, String> {
    parallel_job_of(
        std::env::var("BUILDKITE_PARALLEL_JOB").ok().as_deref(),
        std::env::var("BUILDKITE_PARALLEL_JOB_COUNT")
            .ok()
            .as_deref(),
    )
}

fn parallel_job_of(job: Option<&str>, count: Option<&str>) -> Result<Option<(u32, u32)>, String> {
    let number = |name: &str, v: &str| -> Result<u32, String> {
        v.trim()
            .parse::<u32>()
            .map_err(|_| format!("{name}={} is not a whole number", crate::util::escape(v)))
    };
    match (job, count) {
        (None, None) => Ok(None),
        (Some(j), Some(c)) => {
            let (j, c) = (
                number("BUILDKITE_PARALLEL_JOB", j)?,
                number("BUILDKITE_PARALLEL_JOB_COUNT", c)?,
            );
            if j >= c {
                return Err(format!(
                    "BUILDKITE_PARALLEL_JOB={j} is not below BUILDKITE_PARALLEL_JOB_COUNT={c}"
                ));
            }
            Ok(Some((j + 1, c)))
        }
        (Some(_), None) => {
            Err("BUILDKITE_PARALLEL_JOB is set without BUILDKITE_PARALLEL_JOB_COUNT".into())
        }
        (None, Some(_)) => {
            Err("BUILDKITE_PARALLEL_JOB_COUNT is set without BUILDKITE_PARALLEL_JOB".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parallel_jobs_part_counts_from_one() {
        assert_eq!(parallel_job_of(None, None), Ok(None));
        assert_eq!(parallel_job_of(Some("0"), Some("4")), Ok(Some((1, 4))));
        assert_eq!(parallel_job_of(Some("3"), Some("4")), Ok(Some((4, 4))));
        assert!(
            parallel_job_of(Some("4"), Some("4"))
                .unwrap_err()
                .contains("not below")
        );
        assert!(
            parallel_job_of(Some("x"), Some("4"))
                .unwrap_err()
                .contains("not a whole number")
        );
        assert!(parallel_job_of(Some("1"), None).is_err());
    }
}
