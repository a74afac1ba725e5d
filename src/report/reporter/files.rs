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
}

impl Files {
    pub fn new() -> Files {
        Files::default()
    }
}

impl Reporter for Files {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        match &event.kind {
            EventKind::RunStarted { reports, .. } => {
                self.reports = Some(held(reports)?);
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

/// A second hold of a folder the runner holds.
fn held(dir: &Folder) -> Result<Folder, ReporterError> {
    dir.try_clone()
        .map_err(|e| ReporterError::new(format!("holding {}", dir.path().display()), e))
}

/// The merged `junit.xml`: one suite per batch with its cases.
fn merged_junit(results: &[BatchResult]) -> String {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut report = Report::new("cibox");
    for BatchResult {
        record: r, cases, ..
    } in results
    {
        let mut suite = TestSuite::new(r.batch.clone());
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
            let mut tc = TestCase::new(c.name.clone(), status);
            tc.set_classname(c.classname.clone());
            if let Some(t) = c.time_s.filter(|t| t.is_finite() && *t >= 0.0) {
                tc.set_time(std::time::Duration::from_secs_f64(t));
            }
            suite.add_test_case(tc);
        }
        if r.status != Status::Passed && r.status != Status::Failed {
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
        }
        report.add_test_suite(suite);
    }
    report.to_string().unwrap_or_default()
}
