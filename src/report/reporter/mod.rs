//! Reporters render the runner's [`Event`]s: the terminal (output with batch prefixes,
//! wait lines, verdict lines), GitHub Actions (log groups, annotations, step outputs,
//! step summary), the Buildkite agent (log headings, the build's annotation) and the
//! reports folder (`log.txt`, `result.json`, `summary.md`,
//! merged `junit.xml`). The runner knows none of them; a front end picks its set.

pub mod buildkite;
pub mod files;
pub mod github;
mod hardware;
pub mod markdown;
pub mod pump;
pub mod summary;
pub mod terminal;
pub mod timeline;
pub mod wire;

pub use crate::report::error::ReporterError;
use crate::report::event::Event;

/// Something that renders the runner's events. An error is the runner's to handle: a
/// batch whose `log.txt` cannot be made fails as an infrastructure error, a run whose
/// `result.json` or `summary.md` cannot be written ends with one.
pub trait Reporter: Send {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError>;
}

/// Several reporters, in order. An error stops the event there: the reporters after
/// the one that failed do not see it (a run whose `summary.md` cannot be written
/// publishes no GitHub summary either).
#[derive(Default)]
pub struct Fanout(Vec<Box<dyn Reporter>>);

impl Fanout {
    pub fn new() -> Fanout {
        Fanout::default()
    }

    pub fn with(mut self, reporter: impl Reporter + 'static) -> Fanout {
        self.0.push(Box::new(reporter));
        self
    }
}

impl Reporter for Fanout {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        self.0.iter_mut().try_for_each(|r| r.handle(event))
    }
}

/// A run of three batches (passed; failed with two failing tests; timed out), for the
/// reporters' snapshot tests.
#[cfg(test)]
pub(crate) mod sample {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use crate::plan::SourceInfo;
    use crate::report::junit::{Case, CaseStatus, Totals};
    use crate::report::outcome::{BatchResult, RunResult, Status};
    use crate::report::record::{GpuHardware, GpuRef, Hardware, RunRecord};

    fn case(name: &str, status: CaseStatus, message: Option<&str>, file: Option<&str>) -> Case {
        Case {
            classname: "tests.test_model".into(),
            name: name.into(),
            status,
            message: message.map(str::to_string),
            text: None,
            time_s: Some(0.5),
            file: file.map(str::to_string),
            line: file.map(|_| 42),
        }
    }

    fn result(batch: &str, status: Status, message: Option<&str>, cases: Vec<Case>) -> BatchResult {
        let tests = Totals::of(&cases);
        let record = RunRecord {
            schema: 1,
            batch: batch.into(),
            status,
            exit_code: status.exit_code(None),
            image: format!("sha256:{}", "a".repeat(64)),
            image_name: "default".into(),
            layer: None,
            lockset: format!("sha256:{}", "b".repeat(64)),
            source: SourceInfo {
                sha: Some("c".repeat(40)),
                dirty: Some(false),
                path: "/src/p".into(),
            },
            gpus: vec![GpuRef {
                index: 0,
                uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                node: None,
                sick: None,
            }],
            host: "gpu-host".into(),
            scope: "gh-1-1".into(),
            run: "0123456789abcdef".into(),
            container: format!("cibox-p-gh-1-1-{batch}-01234567"),
            fast: false,
            started_at: "2026-11-30T03:00:00Z".into(),
            finished_at: "2026-11-30T03:00:12Z".into(),
            duration_s: 12.25,
            gpu_wait_s: 0.0,
            hardware: Some(Hardware {
                gpus: vec![GpuHardware {
                    index: 0,
                    uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                    name: Some("NVIDIA H100 80GB HBM3".into()),
                    memory_mib: Some(81559),
                    driver: Some("550.54.15".into()),
                    cuda: Some("12.4".into()),
                    compute_capability: Some("9.0".into()),
                }],
                kernel: "6.1.0-18-amd64".into(),
                engine: "20.10.24+dfsg1".into(),
                gpus_unknown: None,
                fake_gpus: false,
            }),
            tests,
            cibox_version: "0.1.0".into(),
            manifest_digest: format!("sha256:{}", "d".repeat(64)),
            gpu_count: 1,
            gpu_model: None,
            env: BTreeMap::new(),
            failed_tests: Vec::new(),
            message: message.map(str::to_string),
            container_exit_code: None,
            output_bytes: 0,
            cases_left_out: 0,
            reports: Default::default(),
            loosened: serde_json::Value::Object(Default::default()),
            changed_file: None,
            caches: Vec::new(),
            slurm: None,
            attempts: 1,
            flaky: false,
            earlier_attempts: Vec::new(),
            soft_fail: false,
            ran_s: 12.25,
            shard: None,
            shards: Vec::new(),
        };
        BatchResult {
            record,
            cases,
            earlier: Vec::new(),
            record_path: PathBuf::from(format!("/r/{batch}/result.json")),
            container_left: false,
        }
    }

    /// A run shaped by time: a flaky batch, a soft failure, a hard one, and one the
    /// stop at the first failure kept from starting.
    pub fn shaped_run() -> RunResult {
        use crate::report::outcome::EarlierAttempt;
        use crate::report::record::AttemptRecord;
        let mut flaky = result(
            "shaky",
            Status::Passed,
            None,
            vec![case("test_net", CaseStatus::Passed, None, None)],
        );
        flaky.record.attempts = 2;
        flaky.record.flaky = true;
        flaky.record.earlier_attempts = vec![AttemptRecord {
            attempt: 1,
            status: Status::Failed,
            exit_code: 1,
            message: Some("1 failed, 0 errors".into()),
            started_at: "2026-11-30T03:00:00Z".into(),
            duration_s: 3.5,
            failed_tests: vec!["tests.test_model::test_net".into()],
            gpus: vec!["GPU-00000000-0000-0000-0000-000000000000".into()],
        }];
        flaky.earlier = vec![EarlierAttempt {
            attempt: 1,
            status: Status::Failed,
            message: Some("1 failed, 0 errors".into()),
            failing: vec![case(
                "test_net",
                CaseStatus::Failed,
                Some("connection reset"),
                None,
            )],
        }];
        let mut soft = result(
            "experimental",
            Status::Failed,
            Some("1 failed, 0 errors"),
            vec![case("test_fp4", CaseStatus::Failed, Some("nan loss"), None)],
        );
        soft.record.soft_fail = true;
        let hard = result(
            "e2e",
            Status::Failed,
            Some("1 failed, 0 errors"),
            vec![case("test_e2e", CaseStatus::Failed, Some("diverged"), None)],
        );
        let mut not_run = result(
            "nightly",
            Status::NotRun,
            Some("batch e2e failed first, and this run stops at its first failure (fail_fast)"),
            Vec::new(),
        );
        not_run.record.exit_code = 0;
        not_run.record.gpus.clear();
        not_run.record.hardware = None;
        not_run.record.duration_s = 0.0;
        RunResult {
            run: "0123456789abcdef".into(),
            batches: vec![flaky, soft, hard, not_run],
            stopped_by: None,
            reports: PathBuf::from("/r"),
        }
    }

    pub fn run() -> RunResult {
        RunResult {
            run: "0123456789abcdef".into(),
            batches: vec![
                result(
                    "unit",
                    Status::Passed,
                    None,
                    vec![case("test_ok", CaseStatus::Passed, None, None)],
                ),
                result(
                    "4a",
                    Status::Failed,
                    Some("1 failed, 1 errors"),
                    vec![
                        case("test_ok", CaseStatus::Passed, None, None),
                        case(
                            "test_loss",
                            CaseStatus::Failed,
                            Some("loss 0.9 > 0.5: diverged, again"),
                            Some("tests/test_model.py"),
                        ),
                        case("test_nccl", CaseStatus::Error, None, None),
                    ],
                ),
                result(
                    "8b",
                    Status::Timeout,
                    Some("the batch hit its timeout of 30m"),
                    Vec::new(),
                ),
            ],
            stopped_by: None,
            reports: PathBuf::from("/r"),
        }
    }
}
