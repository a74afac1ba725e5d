//! The reports folder: each batch's `log.txt` and `result.json`, and at the root
//! `summary.md` and a merged `junit.xml` (docs/interface.md §7 and §8).
//!
//! Everything is written by name in the folders the runner holds open ([`Folder`]):
//! nothing there is followed, so a link planted where cibox writes (as root, maybe) is
//! replaced, never written through, and a folder swapped after it was opened changes
//! nothing. `result.json` and the run's files are renamed into place.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;

use super::summary::summary_markdown;
use super::{Reporter, ReporterError};
use crate::nofollow::Folder;
use crate::report::event::{Event, EventKind};
use crate::report::junit::CaseStatus;
use crate::report::outcome::{BatchResult, Status};
use crate::timing::file::{BatchTiming, TimingsFile};

/// The most of a batch's output `log.txt` keeps; past it the log ends with a marker
/// (the terminal still shows everything). The record says how much there was.
pub const MAX_LOG_BYTES: u64 = 256 << 20;

/// A batch's `log.txt` and how much has gone into it.
struct Log {
    file: File,
    written: u64,
    cut: bool,
}

/// Writes the reports folder of a run.
#[derive(Default)]
pub struct Files {
    /// The reports folder, from the run's start.
    reports: Option<Folder>,
    /// Each batch's folder, from its start.
    dirs: HashMap<String, Folder>,
    /// Each running batch's `log.txt`.
    logs: HashMap<String, Log>,
    /// The run's project, for `timings.json`.
    project: String,
}

impl Files {
    pub fn new() -> Files {
        Files::default()
    }
}

impl Reporter for Files {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        match &event.kind {
            EventKind::RunStarted { reports, plan } => {
                self.reports = Some(held(reports)?);
                self.project = plan.manifest.project.clone();
            }
            EventKind::BatchStarted { batch, dir } => {
                self.dirs.insert(batch.name.clone(), held(dir)?);
            }
            EventKind::Launching { batch } => {
                let Some(dir) = self.dirs.get(&batch.name) else {
                    return Ok(());
                };
                let log = dir.create_fresh("log.txt").map_err(|e| {
                    ReporterError::new(
                        format!("cannot write {}", dir.path().join("log.txt").display()),
                        e,
                    )
                })?;
                self.logs.insert(
                    batch.name.clone(),
                    Log {
                        file: log,
                        written: 0,
                        cut: false,
                    },
                );
            }
            EventKind::Output { batch, bytes } => {
                if let Some(log) = self.logs.get_mut(&batch.name)
                    && !log.cut
                {
                    let room = MAX_LOG_BYTES - log.written;
                    let take = (bytes.len() as u64).min(room) as usize;
                    let _ = log.file.write_all(&bytes[..take]);
                    log.written += take as u64;
                    if take < bytes.len() {
                        log.cut = true;
                        let _ = write!(
                            log.file,
                            "\n[cibox: log.txt cut at {} MiB; the record says how much the batch printed]\n",
                            MAX_LOG_BYTES >> 20
                        );
                    }
                }
            }
            EventKind::AttemptEnded {
                batch,
                result,
                next,
            } => {
                // Its log closes; what the attempt left goes into its own folder, so
                // the next attempt starts in an empty one.
                self.logs.remove(&batch.name);
                let Some(dir) = self.dirs.get(&batch.name) else {
                    return Ok(());
                };
                set_aside(dir, *next - 1, result).map_err(|e| {
                    ReporterError::new(
                        format!(
                            "setting attempt {} aside in {}",
                            *next - 1,
                            dir.path().display()
                        ),
                        e,
                    )
                })?;
            }
            EventKind::BatchEnded { result } => {
                self.logs.remove(&result.record.batch);
                let Some(dir) = self.dirs.remove(&result.record.batch) else {
                    return Ok(());
                };
                result.record.write(&dir).map_err(|e| {
                    ReporterError::new(format!("writing {}/result.json", dir.path().display()), e)
                })?;
            }
            EventKind::RunEnded { run } => {
                let Some(root) = self.reports.as_ref() else {
                    return Ok(());
                };
                let io =
                    |e| ReporterError::new(format!("reports dir {}", run.reports.display()), e);
                let mut summary = summary_markdown(&run.batches);
                summary.push_str(&earlier_runs(root, run));
                root.write_replacing("summary.md", summary.as_bytes())
                    .map_err(io)?;
                root.write_replacing("junit.xml", merged_junit(&run.batches).as_bytes())
                    .map_err(io)?;
                root.write_replacing(
                    crate::timing::file::FILE_NAME,
                    timings(&self.project, run).to_json().as_bytes(),
                )
                .map_err(io)?;
                let picture = crate::report::reporter::summary::TIMELINE_FILE;
                match crate::report::reporter::timeline::svg(&run.batches) {
                    Some(svg) => root.write_replacing(picture, svg.as_bytes()).map_err(io)?,
                    // No batch to draw: no picture of an earlier run stays.
                    None => root.remove(picture).map_err(io)?,
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// A line naming the batch folders earlier runs left in the reports folder (cibox's,
/// by their marker), which this run's summary does not cover; empty when there are
/// none. They stay: a folder may gather several runs' batches on purpose.
fn earlier_runs(root: &Folder, run: &crate::report::outcome::RunResult) -> String {
    let ours: std::collections::HashSet<&str> = run
        .batches
        .iter()
        .map(|b| b.record.batch.as_str())
        .collect();
    let earlier: Vec<String> = root
        .names()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| !ours.contains(n.as_str()))
        .filter(|n| {
            root.open_dir(n)
                .and_then(|d| d.kind(crate::report::record::BATCH_MARKER))
                .is_ok_and(|k| k.is_some())
        })
        .map(|n| format!("`{}`", crate::report::reporter::markdown::markdown_text(&n)))
        .collect();
    if earlier.is_empty() {
        return String::new();
    }
    format!(
        "\nAlso in this folder, from earlier runs (not in this summary): {}.\n",
        earlier.join(", ")
    )
}

/// Moves what attempt `n` left in the batch's folder (its log, its reports, a node's
/// folders) into `attempt-<n>/`, with the attempt's record; the folder's marker and the
/// earlier attempts' folders stay.
fn set_aside(dir: &Folder, n: u32, result: &BatchResult) -> std::io::Result<()> {
    let name = crate::report::junit::attempt_folder(n);
    dir.remove(&name)?;
    let into = dir.make_dir(&name, 0o755)?;
    for entry in dir.names()? {
        if entry == crate::report::record::BATCH_MARKER
            || crate::report::junit::is_attempt_folder(&entry)
        {
            continue;
        }
        dir.move_into(&entry, &into)?;
    }
    result.record.write(&into)
}

/// `timings.json`: how long each batch that ran took (its last attempt), for a later
/// run's `--timings`.
fn timings(project: &str, run: &crate::report::outcome::RunResult) -> TimingsFile {
    let batches = run
        .batches
        .iter()
        .map(|b| &b.record)
        // Only a batch that ran to an end says how long it takes.
        .filter(|r| matches!(r.status, Status::Passed | Status::Failed | Status::Timeout))
        .map(|r| {
            (
                r.batch.clone(),
                BatchTiming {
                    seconds: (r.ran_s * 1000.0).round() / 1000.0,
                    gpus: r.gpu_count,
                    status: r.status.as_str().to_string(),
                    attempts: r.attempts,
                },
            )
        })
        .collect();
    TimingsFile {
        schema: crate::timing::file::SCHEMA,
        project: project.to_string(),
        run: run.run.clone(),
        batches,
    }
}

/// A second hold of a folder the runner holds.
fn held(dir: &Folder) -> Result<Folder, ReporterError> {
    dir.try_clone()
        .map_err(|e| ReporterError::new(format!("holding {}", dir.path().display()), e))
}

/// The merged `junit.xml`: one suite per batch with its cases.
fn merged_junit(results: &[BatchResult]) -> String {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestRerun, TestSuite};
    let mut report = Report::new("cibox");
    for BatchResult {
        record: r,
        cases,
        earlier,
        ..
    } in results
    {
        let mut suite = TestSuite::new(r.batch.clone());
        // Earlier attempts' failures of a case: JUnit's reruns of it (`flakyFailure`
        // when it passed at last, `rerunFailure` when it did not), as nextest writes.
        let reruns_of = |id: &str| -> Vec<TestRerun> {
            earlier
                .iter()
                .flat_map(|a| a.failing.iter())
                .filter(|f| f.id() == id)
                .map(|f| {
                    let mut rerun = TestRerun::new(match f.status {
                        CaseStatus::Error => NonSuccessKind::Error,
                        _ => NonSuccessKind::Failure,
                    });
                    if let Some(m) = &f.message {
                        rerun.set_message(m.clone());
                    }
                    rerun
                })
                .collect()
        };
        let mut rerun_named = false;
        for c in cases {
            let mut status = match c.status {
                CaseStatus::Passed => TestCaseStatus::success(),
                CaseStatus::Failed => TestCaseStatus::non_success(NonSuccessKind::Failure),
                CaseStatus::Error => TestCaseStatus::non_success(NonSuccessKind::Error),
                CaseStatus::Skipped => TestCaseStatus::skipped(),
            };
            if let Some(m) = &c.message {
                status.set_message(m.clone());
            }
            // The traceback, as the batch's own report gave it.
            if let Some(t) = &c.text {
                status.set_description(t.clone());
            }
            let reruns = reruns_of(&c.id());
            rerun_named |= !reruns.is_empty();
            status.add_reruns(reruns);
            let mut tc = TestCase::new(c.name.clone(), status);
            tc.set_classname(c.classname.clone());
            if let Some(t) = c.time_s.filter(|t| t.is_finite() && *t >= 0.0) {
                tc.set_time(std::time::Duration::from_secs_f64(t));
            }
            suite.add_test_case(tc);
        }
        if r.status == Status::NotRun {
            // Kept from starting by another batch's failure: skipped, saying why.
            let mut status = TestCaseStatus::skipped();
            status.set_message(r.message.clone().unwrap_or_default());
            suite.add_test_case(TestCase::new("cibox: batch not_run", status));
        } else if r.status != Status::Passed && r.status != Status::Failed {
            // A batch that did not get to report still shows up as an error.
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
            status.set_message(
                r.message
                    .clone()
                    .unwrap_or_else(|| r.status.as_str().to_string()),
            );
            suite.add_test_case(TestCase::new(
                format!("cibox: batch {}", r.status.as_str()),
                status,
            ));
        } else if r.flaky && !rerun_named {
            // Flaky, and no test case of its own says so (an earlier attempt timed
            // out, or failed a step): the batch itself carries its earlier attempts.
            let mut status = TestCaseStatus::success();
            status.add_reruns(earlier.iter().map(|a| {
                let mut rerun = TestRerun::new(NonSuccessKind::Failure);
                rerun.set_message(crate::report::record::attempt_said(
                    a.attempt,
                    a.status,
                    a.message.as_deref(),
                ));
                rerun
            }));
            suite.add_test_case(TestCase::new("cibox: batch flaky", status));
        }
        report.add_test_suite(suite);
    }
    report.to_string().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::reporter::sample;

    #[test]
    fn the_merged_junit_of_a_mixed_run() {
        let run = sample::run();
        let xml = merged_junit(&run.batches);
        // Every batch a suite of its own, each case in it.
        assert_eq!(
            xml.matches("<testsuite ").count(),
            run.batches.len(),
            "{xml}"
        );
        insta::assert_snapshot!(xml);
    }
}
