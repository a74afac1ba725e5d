//! What a run leaves behind: `<reports>/<batch>/result.json` (docs/interface.md §7), and at the
//! reports root `summary.md` and a merged `junit.xml`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::gpu::probe::GpuHardware;
use crate::nofollow;
use crate::plan::{BatchPlan, RunPlan, SourceInfo};
use crate::report::junit::Totals;

/// Marks a batch folder as cibox's from the moment it is made, so that the folder of a
/// run that was killed (no `result.json` yet) is still known to be ours.
pub const BATCH_MARKER: &str = ".cibox-batch";

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
    /// It never started: a batch before it failed, and the run stops at the first
    /// failure (`fail_fast`).
    NotRun,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::NotRun => "not_run",
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

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuRef {
    pub index: u32,
    pub uuid: String,
    /// The Slurm node it is on, for a batch that ran through Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Why the driver read it unhealthy when the batch ended in an infrastructure
    /// error (the GPU, not the tests, is the likely cause; a retry goes elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sick: Option<String>,
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

/// What a batch ran on: its GPUs as the probe described them, the host's kernel and the
/// engine. A replay elsewhere compares these (`cibox reproduce`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hardware {
    /// Each GPU leased to the batch, in the order leased (empty for a CPU batch).
    pub gpus: Vec<GpuHardware>,
    /// The host's kernel release (`uname -r`).
    pub kernel: String,
    /// The container engine's version.
    pub engine: String,
    /// Why the GPUs' model, driver and CUDA version are missing, when the probe could
    /// not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_unknown: Option<String>,
    /// The GPUs were fake (`cibox gpu fake`), not hardware: the batch ran on none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fake_gpus: bool,
}

impl Hardware {
    /// What a replay compares, one named text each: the GPUs' models (with compute
    /// capability), their memory, the driver, the CUDA version, the kernel, the engine.
    pub fn aspects(&self) -> Vec<(&'static str, String)> {
        let each = |f: &dyn Fn(&GpuHardware) -> String| {
            if self.gpus.is_empty() {
                return "none".to_string();
            }
            let mut seen: Vec<String> = self.gpus.iter().map(f).collect();
            seen.dedup();
            seen.join(", ")
        };
        let unknown = || "unknown".to_string();
        vec![
            (
                "GPU model",
                each(&|g| {
                    let name = g.name.clone().unwrap_or_else(unknown);
                    match &g.compute_capability {
                        Some(cc) => format!("{name} (compute {cc})"),
                        None => name,
                    }
                }),
            ),
            (
                "GPU memory",
                each(&|g| g.memory_mib.map_or_else(unknown, |m| format!("{m} MiB"))),
            ),
            (
                "driver",
                each(&|g| g.driver.clone().unwrap_or_else(unknown)),
            ),
            ("CUDA", each(&|g| g.cuda.clone().unwrap_or_else(unknown))),
            ("kernel", self.kernel.clone()),
            ("engine", self.engine.clone()),
            (
                "fake GPUs",
                if self.fake_gpus {
                    "yes (not real hardware)"
                } else {
                    "no"
                }
                .into(),
            ),
        ]
    }

    /// Where `other` differs from this: (what, this, other), in [`Hardware::aspects`]'
    /// order.
    pub fn differences(&self, other: &Hardware) -> Vec<(&'static str, String, String)> {
        self.aspects()
            .into_iter()
            .zip(other.aspects())
            .filter(|((_, a), (_, b))| a != b)
            .map(|((what, a), (_, b))| (what, a, b))
            .collect()
    }
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

impl crate::error::ErrorKind for RecordError {
    /// A run record a user named is their input.
    fn failure(&self) -> crate::exit::Failure {
        crate::exit::Failure::Usage
    }
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
    // Past the first contract's fields (docs/interface.md §7): what a replay and a reader need.
    /// How many GPUs the batch asked for.
    pub gpu_count: u32,
    /// The model the batch's GPUs had to be (its `gpu_model` glob), when it asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
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
    pub reports: Copied,
    /// What the batch's container allowed beyond cibox's locked-down default (host
    /// mounts, IPC, ulimits, capabilities, user, network); empty when nothing.
    #[serde(default)]
    pub loosened: serde_json::Value,
    /// How long the batch waited for its GPUs, until they were granted or refused (0 for
    /// a CPU batch; 0 in records of older cibox versions).
    #[serde(default)]
    pub gpu_wait_s: f64,
    /// What the batch ran on; `None` in records of older cibox versions.
    #[serde(default)]
    pub hardware: Option<Hardware>,
    /// The test file, for a batch `cibox changed run` made from `changed.run` (so
    /// `cibox reproduce` can make it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_file: Option<String>,
    /// What the batch did with each of its caches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<CacheRecord>,
    /// The Slurm job it ran as, when the host submits batches to Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmJob>,
    /// The manifest's name of the image it ran in (`image` is its ID); empty in records
    /// of older cibox versions.
    #[serde(default)]
    pub image_name: String,
    /// The layer it ran as part of (whose image and fast mode it took), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
    /// How many times it ran (its `retries`); this record is the last attempt's, its
    /// `started_at` and `duration_s` those of all of them.
    #[serde(default = "one_attempt")]
    pub attempts: u32,
    /// It passed after an earlier attempt did not: flaky, not simply green.
    #[serde(default)]
    pub flaky: bool,
    /// The attempts before the last, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_attempts: Vec<AttemptRecord>,
    /// Its failure does not fail the run (`soft_fail`): the run's exit code leaves it
    /// out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub soft_fail: bool,
    /// Seconds its last attempt ran, from its container's start to its end: what
    /// `timings.json` records (0 when it never ran). A sharded batch's: its shards'
    /// together, the work of the whole batch on one container.
    #[serde(default)]
    pub ran_s: f64,
    /// The shard of a sharded batch this record is (a shard's own `result.json`, in
    /// `<batch>/shard-<K>/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardOf>,
    /// A sharded batch's shards, in index order (the batch's own `result.json`, which
    /// merges theirs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardEnd>,
}

/// Which shard of which batch a record is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardOf {
    pub batch: String,
    /// From 0, as `CIBOX_SHARD_INDEX`.
    pub index: u32,
    pub count: u32,
}

/// How one shard of a sharded batch ended, in the batch's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardEnd {
    /// From 0, as `CIBOX_SHARD_INDEX`.
    pub index: u32,
    pub status: Status,
    pub exit_code: u8,
    pub message: Option<String>,
    /// Its GPUs, by UUID.
    pub gpus: Vec<String>,
    pub container: String,
    pub duration_s: f64,
    /// Its own `result.json`, relative to the batch's folder.
    pub result: String,
}

fn one_attempt() -> u32 {
    1
}

/// An attempt at a batch that was run again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// 1-based.
    pub attempt: u32,
    pub status: Status,
    pub exit_code: u8,
    pub message: Option<String>,
    pub started_at: String,
    pub duration_s: f64,
    /// Its failing test cases (the first 100).
    #[serde(default)]
    pub failed_tests: Vec<String>,
    /// The GPUs it ran on, by UUID.
    #[serde(default)]
    pub gpus: Vec<String>,
}

/// An earlier attempt in a line: `attempt 1 failed: MESSAGE`.
pub fn attempt_said(attempt: u32, status: Status, message: Option<&str>) -> String {
    format!(
        "attempt {attempt} {}{}",
        status.as_str(),
        message.map(|m| format!(": {m}")).unwrap_or_default()
    )
}

impl RunRecord {
    /// An earlier attempt ended in `infra_error` (and was retried): the host's failure,
    /// which `soft_fail` never forgives (docs/interface.md §4).
    fn met_infra_error(&self) -> bool {
        self.earlier_attempts
            .iter()
            .any(|a| a.status == Status::InfraError)
    }

    /// The code it adds to the run's (the most severe wins): none when it does not
    /// count; a soft failure that met an infrastructure error on the way counts as
    /// that error (exit 5), not as the failure it forgives.
    pub fn run_exit_code(&self) -> Option<u8> {
        if !self.counts_against_run() {
            return None;
        }
        if self.soft_fail && matches!(self.status, Status::Failed | Status::Timeout) {
            return Some(crate::exit::INFRA);
        }
        Some(self.exit_code)
    }

    /// Whether its failure fails the run: not when it passed, never ran because of
    /// another's, or failed softly (`soft_fail` on a failure or a timeout; an error of
    /// the host still counts).
    pub fn counts_against_run(&self) -> bool {
        match self.status {
            Status::Passed | Status::NotRun => false,
            Status::Failed | Status::Timeout => !self.soft_fail || self.met_infra_error(),
            _ => true,
        }
    }
}

/// One cache as a batch used it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CacheRecord {
    pub name: String,
    /// Where the batch saw it.
    pub path: String,
    /// The generation it read.
    pub generation: String,
    /// `through` (the host trusts its runs: kept if the batch passed), `pull-request`
    /// (kept, if it passed, in its pull request's scope only) or `private` (thrown away
    /// with the batch).
    pub writes: String,
    /// The pull request whose scope it read over `generation` and kept into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<u64>,
    /// The scope's generation it read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_generation: Option<String>,
    /// Bytes it wrote into its layer.
    pub wrote_bytes: u64,
    /// The generation its writes became, when they were kept.
    pub kept: Option<String>,
    /// Entries dropped to keep the cache within its cap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evicted: Vec<String>,
    /// Its private layer filled up.
    #[serde(default)]
    pub full: bool,
    /// What went wrong with the cache, if anything.
    pub problem: Option<String>,
}

impl RunRecord {
    /// Writes `result.json` into `dir`, by name: the rename replaces whatever has the
    /// name, a planted link included, without following it.
    pub fn write(&self, dir: &nofollow::Folder) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).expect("record serialises");
        dir.write_replacing("result.json", (text + "\n").as_bytes())
    }

    /// Reads a `result.json` (a user names it: `cibox reproduce`).
    pub fn read(path: &Path) -> Result<RunRecord, RecordError> {
        let shown = path.display().to_string();
        let read_err = |source| RecordError::Read {
            path: shown.clone(),
            source,
        };
        // Downloaded, so anyone's: a plain file (a FIFO would block), read only as far as
        // a record can go (1,000 failing tests of 1 KiB, the rest small).
        let (file, _) = crate::util::open_plain(path, true).map_err(read_err)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_RECORD_BYTES + 1),
            &mut bytes,
        )
        .map_err(read_err)?;
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(read_err(std::io::Error::other(format!(
                "larger than {} MiB: no record cibox writes is",
                MAX_RECORD_BYTES >> 20
            ))));
        }
        let text = String::from_utf8(bytes)
            .map_err(|_| read_err(std::io::Error::other("not UTF-8 text: no cibox record")))?;
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
        // Named again by a replay (and printed): a manifest's names, or nothing.
        if !record.image_name.is_empty() && !crate::manifest::is_batch_name(&record.image_name) {
            return Err(bad("image_name", "an image name"));
        }
        if let Some(layer) = &record.layer
            && !crate::manifest::is_batch_name(layer)
        {
            return Err(bad("layer", "a layer name"));
        }
        // Replayed as the commit it names: a name (`HEAD`, a branch) would replay
        // whatever it points at now, and an option (`--…`) would reach git.
        if let Some(sha) = &record.source.sha
            && !is_commit_id(sha)
        {
            return Err(bad(
                "source.sha",
                "a full commit ID: 40 lowercase hex digits, 64 in a SHA-256 repository",
            ));
        }
        Ok(record)
    }
}

/// Whether `sha` is a full commit ID as git writes one (`rev-parse HEAD`): 40 lowercase
/// hex digits, or 64 in a SHA-256 repository.
fn is_commit_id(sha: &str) -> bool {
    matches!(sha.len(), 40 | 64) && sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The largest record read: what cibox writes is far smaller.
const MAX_RECORD_BYTES: u64 = 16 << 20;

/// The one line that replays a batch locally.
pub fn reproduce_line(result: &Path) -> String {
    format!("cibox reproduce {}", result.display())
}

/// How many skipped entries are named in the record.
const NAMED_SKIPS: usize = 20;

/// What was copied out (the `reports` field of `result.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Copied {
    pub files: usize,
    pub bytes: u64,
    /// Entries not copied, and why (the first [`NAMED_SKIPS`]).
    pub skipped: Vec<String>,
    pub skipped_count: usize,
    /// Why the copy stopped before the end, if it did (a cap, a broken stream).
    pub stopped: Option<String>,
}

impl Copied {
    /// Counts an entry not copied, naming the first [`NAMED_SKIPS`].
    pub fn skip(&mut self, why: String) {
        self.skipped_count += 1;
        if self.skipped.len() < NAMED_SKIPS {
            self.skipped.push(why);
        }
    }
}

impl RunRecord {
    /// The record of batch `b` with what `plan` says of it (image, lockset, source,
    /// host, scope, run, container, settings), ended `status` after running since
    /// `started` (`clock`): no GPUs, tests, output or reports yet.
    pub fn planned(
        plan: &RunPlan,
        b: &BatchPlan,
        lockset: String,
        status: Status,
        exit_code: u8,
        started: std::time::SystemTime,
        clock: std::time::Instant,
    ) -> RunRecord {
        RunRecord {
            schema: 1,
            batch: b.name.clone(),
            status,
            exit_code,
            image: b.image.to_string(),
            image_name: b.image_name.clone(),
            layer: plan.layer.clone(),
            lockset,
            source: plan.source_info.clone(),
            gpus: Vec::new(),
            host: plan.host.clone(),
            scope: plan.scope.clone(),
            run: plan.run_id.clone(),
            container: b.container.name.clone(),
            fast: plan.fast,
            started_at: crate::units::rfc3339(started),
            finished_at: crate::units::rfc3339(std::time::SystemTime::now()),
            duration_s: (clock.elapsed().as_millis() as f64) / 1000.0,
            tests: Default::default(),
            cibox_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest_digest: plan.manifest.digest.clone(),
            gpu_count: b.gpus,
            gpu_model: b.gpu_model.clone(),
            env: b.container.manifest_env.clone(),
            failed_tests: Vec::new(),
            message: None,
            container_exit_code: None,
            output_bytes: 0,
            cases_left_out: 0,
            reports: Default::default(),
            loosened: b.container.loosened(),
            changed_file: b.changed_file.clone(),
            slurm: None,
            caches: Vec::new(),
            gpu_wait_s: 0.0,
            hardware: None,
            attempts: 1,
            flaky: false,
            earlier_attempts: Vec::new(),
            soft_fail: b.soft_fail,
            ran_s: 0.0,
            shard: b.shard.as_ref().map(|s| ShardOf {
                batch: s.batch.clone(),
                index: s.index,
                count: s.count,
            }),
            shards: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_downloaded_record_is_read_only_as_far_as_a_record_goes() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("result.json");
        std::fs::write(&big, " ".repeat(17 << 20)).unwrap();
        let e = RunRecord::read(&big).unwrap_err().to_string();
        assert!(
            e.ends_with("larger than 16 MiB: no record cibox writes is"),
            "{e}"
        );
        // A FIFO in its place would block a plain read for ever.
        let fifo = dir.path().join("fifo.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = RunRecord::read(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a plain file"), "{e}");
    }

    fn gpu(index: u32, name: &str, cc: &str) -> GpuHardware {
        GpuHardware {
            index,
            uuid: format!("GPU-00000000-0000-0000-0000-00000000000{index}"),
            name: Some(name.into()),
            memory_mib: Some(81559),
            driver: Some("550.54.15".into()),
            cuda: Some("12.4".into()),
            compute_capability: Some(cc.into()),
        }
    }

    #[test]
    fn a_replay_names_what_hardware_differs() {
        let recorded = Hardware {
            gpus: vec![gpu(0, "NVIDIA A100-SXM4-80GB", "8.0")],
            kernel: "6.1.0-18-amd64".into(),
            engine: "20.10.24".into(),
            gpus_unknown: None,
            fake_gpus: false,
        };
        assert!(recorded.differences(&recorded).is_empty());
        let mut replayed = recorded.clone();
        replayed.gpus = vec![gpu(3, "NVIDIA H100 80GB HBM3", "9.0")];
        assert_eq!(
            recorded.differences(&replayed),
            [(
                "GPU model",
                "NVIDIA A100-SXM4-80GB (compute 8.0)".to_string(),
                "NVIDIA H100 80GB HBM3 (compute 9.0)".to_string()
            )]
        );
        // Another index of the same model is the same hardware.
        let mut moved = recorded.clone();
        moved.gpus[0].index = 5;
        assert!(recorded.differences(&moved).is_empty());
        // Two GPUs of a model read as one.
        let two = Hardware {
            gpus: vec![gpu(0, "X", "9.0"), gpu(1, "X", "9.0")],
            ..recorded.clone()
        };
        assert_eq!(two.aspects()[0].1, "X (compute 9.0)");
    }
}
