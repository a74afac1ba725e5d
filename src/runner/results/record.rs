//! What a run leaves behind: `<reports>/<batch>/result.json` (docs/interface.md §7), and at the
//! reports root `summary.md` and a merged `junit.xml`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::junit::Totals;
use crate::nofollow;

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
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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
    /// The Slurm node it is on, for a batch that ran through Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// The Slurm job a batch ran as (docs/interface.md §14).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmJob {
    /// The job's ID; `None` when it was never submitted or Slurm never named it.
    pub job_id: Option<String>,
    /// Its name, as `squeue` and the accounting show it.
    pub name: String,
    pub partition: Option<String>,
    /// Its nodes, by rank.
    pub nodes: Vec<String>,
}

/// Why a run record cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a cibox run record: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: run record schema {schema} is not one this cibox reads (1)")]
    Schema { path: String, schema: u32 },
    /// A field that names a folder or file cibox would use is not one it wrote.
    #[error("{path}: `{field}` is not one cibox writes ({why}); the record was altered")]
    Field {
        path: String,
        field: &'static str,
        why: String,
    },
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
    // Beyond the first contract (docs/interface.md §7): what a replay and a reader need.
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
    /// How many bytes the batch printed (`log.txt` keeps at most 256 MiB of them).
    #[serde(default)]
    pub output_bytes: u64,
    /// Test cases counted but left out of the merged `junit.xml` and the summary
    /// (more than 20,000 in the batch).
    #[serde(default)]
    pub cases_left_out: usize,
    /// What was copied out of the batch's `/reports`.
    #[serde(default)]
    pub reports: super::copy::Copied,
    /// What the batch's container allowed beyond cibox's locked-down default (host
    /// mounts, IPC, ulimits, capabilities, user, network); empty when nothing.
    #[serde(default)]
    pub loosened: serde_json::Value,
    /// The test file, for a batch `cibox changed run` made from `changed.run` (so
    /// `cibox reproduce` can make it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_file: Option<String>,
    /// The Slurm job it ran as, when the host submits batches to Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmJob>,
}

impl RunRecord {
    /// Writes `result.json` into `dir`, a folder the batch's container could write
    /// too: nothing there is followed (see [`nofollow::create_fresh`]), and the rename replaces
    /// whatever `result.json` is, a planted symlink included, without following it.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let text = serde_json::to_string_pretty(self).expect("record serialises");
        let tmp = dir.join(".result.json.partial");
        nofollow::create_fresh(&tmp)?.write_all((text + "\n").as_bytes())?;
        // A folder named result.json cannot be renamed over: remove it first.
        let path = dir.join("result.json");
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            nofollow::clear(&path)?;
        }
        std::fs::rename(tmp, path)
    }

    /// Reads a `result.json` (a user names it: `cibox reproduce`).
    pub fn read(path: &Path) -> Result<RunRecord, RecordError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| RecordError::Read {
            path: shown.clone(),
            source,
        })?;
        let record: RunRecord =
            serde_json::from_str(&text).map_err(|source| RecordError::Parse {
                path: shown.clone(),
                source,
            })?;
        if record.schema != 1 {
            return Err(RecordError::Schema {
                path: shown,
                schema: record.schema,
            });
        }
        // A record comes from elsewhere (an artifact, an attachment), and a replay makes
        // folders named by these: they must be what cibox itself writes.
        let bad = |field: &'static str, why: &str| RecordError::Field {
            path: shown.clone(),
            field,
            why: why.to_string(),
        };
        if !crate::manifest::is_batch_name(&record.batch) {
            return Err(bad("batch", "a batch name"));
        }
        if record.run.is_empty()
            || record.run.len() > 64
            || !record.run.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(bad("run", "hex digits"));
        }
        if let Some(file) = &record.changed_file
            && !crate::util::is_plain_relative(file)
        {
            return Err(bad("changed_file", "a relative path without `.` or `..`"));
        }
        Ok(record)
    }
}

/// The one line that replays a batch locally.
pub fn reproduce_line(result: &Path) -> String {
    format!("cibox reproduce {}", result.display())
}
