//! The reports folder: each batch's `log.txt` and `result.json`, and at the root
//! `summary.md` and a merged `junit.xml` (docs/interface.md §7 and §8).
//!
//! A batch's folder is writable by its container, so nothing in it is followed: files
//! are created fresh ([`create_fresh`]) and `result.json` is renamed into place.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use super::summary::summary_markdown;
use super::{Reporter, ReporterError};
use crate::nofollow::create_fresh;
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
            EventKind::Launching { batch, dir } => {
                // Created before the container exists, so it cannot be a link the
                // batch planted.
                let path = dir.join("log.txt");
                let log = create_fresh(&path).map_err(|e| {
                    ReporterError::new(format!("cannot write {}", path.display()), e)
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
                let dir = result
                    .record_path
                    .parent()
                    .map(PathBuf::from)
                    .unwrap_or_default();
                result.record.write(&dir).map_err(|e| {
                    ReporterError::new(format!("writing {}/result.json", dir.display()), e)
                })?;
            }
            EventKind::RunEnded { run } => {
                let root = &run.reports;
                let io = |e| ReporterError::new(format!("reports dir {}", root.display()), e);
                std::fs::write(root.join("summary.md"), summary_markdown(&run.batches))
                    .map_err(io)?;
                std::fs::write(root.join("junit.xml"), merged_junit(&run.batches)).map_err(io)?;
                let picture = root.join(crate::report::reporter::summary::TIMELINE_FILE);
                match crate::report::reporter::timeline::svg(&run.batches) {
                    Some(svg) => std::fs::write(&picture, svg).map_err(io)?,
                    // No batch to draw: no picture of an earlier run stays.
                    None => match std::fs::remove_file(&picture) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io(e)),
                    },
                }
            }
            _ => {}
        }
        Ok(())
    }
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
