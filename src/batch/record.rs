//! What a run leaves behind: `<reports>/<batch>/result.json` (SPEC section 7), and at the
//! reports root `summary.md` and a merged `junit.xml`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::junit::{Case, Outcome, Totals};
use crate::exit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Failed,
    Timeout,
    Cancelled,
    InfraError,
    ImageRefused,
    Capacity,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Timeout => "timeout",
            Status::Cancelled => "cancelled",
            Status::InfraError => "infra_error",
            Status::ImageRefused => "image_refused",
            Status::Capacity => "capacity",
        }
    }

    /// The SPEC exit code of a batch that ended so (cancellation: 128+N, given apart).
    pub fn exit_code(self) -> u8 {
        match self {
            Status::Passed => exit::SUCCESS,
            Status::Failed => exit::TESTS_FAILED,
            Status::Timeout => exit::TIMEOUT,
            Status::Cancelled => exit::signal(15),
            Status::InfraError => exit::INFRA,
            Status::ImageRefused => exit::IMAGE_REFUSED,
            Status::Capacity => exit::CAPACITY,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SourceInfo {
    /// The commit, when the source is a git checkout.
    pub sha: Option<String>,
    pub dirty: Option<bool>,
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuRef {
    pub index: u32,
    pub uuid: String,
}

/// The run record of one batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub schema: u32,
    pub batch: String,
    pub status: Status,
    pub exit_code: u8,
    pub image: String,
    pub lockset: String,
    pub source: SourceInfo,
    pub gpus: Vec<GpuRef>,
    pub host: String,
    pub scope: String,
    pub run: String,
    pub container: String,
    pub fast: bool,
    pub started_at: String,
    pub finished_at: String,
    pub duration_s: f64,
    pub tests: Totals,
    pub cibox_version: String,
    pub manifest_digest: String,
    // Beyond the SPEC: what a replay and a reader need.
    /// How many GPUs the batch asked for.
    pub gpu_count: u32,
    /// The variables the manifest set in the container (never `pass_env` values).
    pub env: BTreeMap<String, String>,
    /// Failing and erroring test cases (`classname::name`).
    pub failed_tests: Vec<String>,
    /// Why the batch ended so, in one line, when it did not simply pass or fail.
    pub message: Option<String>,
    /// The container's exit code, when it ran to the end.
    pub container_exit_code: Option<i64>,
}

/// Creates `path` as a new file, first removing whatever has that name. A container
/// that can write the folder could have planted a symlink there (to `/etc/passwd`,
/// say); removing unlinks the symlink itself, and creating with `O_EXCL` refuses, rather
/// than follows, one planted in between.
pub fn create_fresh(path: &Path) -> std::io::Result<std::fs::File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

impl RunRecord {
    /// Writes `result.json` into `dir`, a folder the batch's container could write
    /// too: nothing there is followed (see [`create_fresh`]), and the rename replaces
    /// whatever `result.json` is, a planted symlink included, without following it.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let text = serde_json::to_string_pretty(self).expect("record serialises");
        let tmp = dir.join(".result.json.partial");
        create_fresh(&tmp)?.write_all((text + "\n").as_bytes())?;
        std::fs::rename(tmp, dir.join("result.json"))
    }

    pub fn read(path: &Path) -> Result<RunRecord, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let record: RunRecord = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a cibox run record: {e}", path.display()))?;
        if record.schema != 1 {
            return Err(format!(
                "{}: run record schema {} is not one this cibox reads (1)",
                path.display(),
                record.schema
            ));
        }
        Ok(record)
    }
}

/// `summary.md`: one table row per batch, then the failing tests and replay commands.
pub fn summary_markdown(records: &[(RunRecord, Vec<Case>)], reports: &Path) -> String {
    let mut s = String::from(
        "## cibox run\n\n| batch | status | tests | passed | failed | errors | skipped | GPUs | duration |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for (r, _) in records {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s |\n",
            r.batch,
            r.status.as_str(),
            r.tests.total,
            r.tests.passed,
            r.tests.failed,
            r.tests.errors,
            r.tests.skipped,
            r.gpus.len(),
            r.duration_s
        ));
    }
    for (r, cases) in records {
        if r.status == Status::Passed {
            continue;
        }
        s.push_str(&format!("\n### {} ({})\n\n", r.batch, r.status.as_str()));
        if let Some(m) = &r.message {
            s.push_str(&format!("{m}\n\n"));
        }
        for c in cases
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed | Outcome::Error))
        {
            s.push_str(&format!(
                "- `{}`: {}\n",
                c.id(),
                c.message.as_deref().unwrap_or("(no message)")
            ));
        }
        s.push_str(&format!(
            "\nReplay locally: `{}`\n",
            reproduce_line(&reports.join(&r.batch).join("result.json"))
        ));
    }
    s
}

/// The one line that replays a batch locally.
pub fn reproduce_line(result: &Path) -> String {
    format!("cibox reproduce {}", result.display())
}

/// The merged `junit.xml`: one suite per batch with its cases.
pub fn merged_junit(records: &[(RunRecord, Vec<Case>)]) -> String {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut report = Report::new("cibox");
    for (r, cases) in records {
        let mut suite = TestSuite::new(r.batch.clone());
        for c in cases {
            let mut status = match c.outcome {
                Outcome::Passed => TestCaseStatus::success(),
                Outcome::Failed => TestCaseStatus::non_success(NonSuccessKind::Failure),
                Outcome::Error => TestCaseStatus::non_success(NonSuccessKind::Error),
                Outcome::Skipped => TestCaseStatus::skipped(),
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
