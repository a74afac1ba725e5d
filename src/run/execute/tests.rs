//! The run loop's decisions, driven by a fake engine: how a batch ends when its steps
//! pass or fail, when it times out, is cancelled, is killed or removed from outside,
//! loses its reports, or when its image is gone. The integration tests play the same
//! out against a real engine; these pin the decisions themselves.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;

use bollard::models::ContainerCreateBody;

use super::*;
use crate::engine::{
    ContainerInfo, EndCause, EngineError, FollowEnd, Followed, ImageDetails, Removal, Steps, Stop,
};
use crate::image::lockset::{LABEL_DIGEST, LABEL_FILES};
use crate::plan::{HostFacts, RunRequest};
use crate::report::error::ReporterError;
use crate::report::event::Event;
use crate::report::outcome::Status;

const IMAGE: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// How the fake engine plays a batch out.
#[derive(Clone)]
struct Script {
    /// The image is present (with the source's lockset labels).
    image_present: bool,
    /// `create_container` fails with this.
    create_fails: Option<fn() -> EngineError>,
    /// Copying the source in fails.
    upload_fails: bool,
    /// What following the steps ends with, and what they print first.
    output: &'static [u8],
    follow: Result<FollowEnd, fn() -> EngineError>,
    /// The container still runs after its steps (its keeper waits) when reports are
    /// copied.
    alive_after: bool,
    /// The tar archive of `/reports`.
    reports: Vec<u8>,
    end_cause: EndCause,
    removal: Removal,
    /// Removing the batch's container fails (it may still run).
    remove_fails: bool,
}

impl Default for Script {
    fn default() -> Script {
        Script {
            image_present: true,
            create_fails: None,
            upload_fails: false,
            output: b"cibox run: true\n",
            follow: Ok(FollowEnd {
                stopped: None,
                exit: Some(0),
            }),
            alive_after: true,
            reports: junit_archive(),
            end_cause: EndCause::Itself,
            removal: Removal::Removed,
            remove_fails: false,
        }
    }
}

/// What the engine was asked to do.
#[derive(Default)]
struct Calls {
    created: Vec<String>,
    removed: Vec<String>,
    /// Each upload's folder and the names in its archive.
    uploaded: Vec<(String, Vec<String>)>,
    /// The folders downloaded.
    downloaded: Vec<String>,
}

struct FakeEngine {
    script: Script,
    labels: HashMap<String, String>,
    calls: Mutex<Calls>,
}

impl FakeEngine {
    fn new(script: Script, lockset: &Lockset) -> FakeEngine {
        FakeEngine {
            script,
            labels: HashMap::from([
                (LABEL_DIGEST.to_string(), lockset.digest.clone()),
                (LABEL_FILES.to_string(), lockset.text.clone()),
            ]),
            calls: Mutex::default(),
        }
    }
}

impl ContainerEngine for FakeEngine {
    fn version(&self) -> String {
        "20.10.24+fake".into()
    }

    fn inspect(&self, reference: &str) -> Result<Option<ImageDetails>, EngineError> {
        Ok(self.script.image_present.then(|| ImageDetails {
            id: reference.to_string(),
            labels: self.labels.clone(),
            repo_tags: Vec::new(),
            layers: Vec::new(),
            platform: Default::default(),
            onbuild: 0,
        }))
    }

    fn containers_with_labels(&self, _: &[String]) -> Result<Vec<ContainerInfo>, EngineError> {
        Ok(Vec::new())
    }

    fn recursive_read_only(&self) -> bool {
        true
    }

    fn on_this_host(&self) -> bool {
        // Nothing it would mount: its batches get the source through `upload`.
        false
    }

    fn create_container(&self, name: &str, _: ContainerCreateBody) -> Result<String, EngineError> {
        if let Some(fail) = self.script.create_fails {
            return Err(fail());
        }
        self.calls.lock().unwrap().created.push(name.to_string());
        Ok(format!("id-{name}"))
    }

    fn start_container(&self, _: &str) -> Result<(), String> {
        Ok(())
    }

    fn upload(
        &self,
        _: &str,
        path: &str,
        mut archive: Box<dyn Read + Send>,
    ) -> Result<(), EngineError> {
        let mut tar = Vec::new();
        archive.read_to_end(&mut tar).unwrap();
        let names: Vec<String> = tar::Archive::new(&tar[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        self.calls
            .lock()
            .unwrap()
            .uploaded
            .push((path.to_string(), names));
        if self.script.upload_fails {
            return Err(EngineError::Api {
                action: "copying the source in".into(),
                reason: "no space left on device".into(),
            });
        }
        Ok(())
    }

    fn follow_exec(
        &self,
        _: &str,
        _: Steps<'_>,
        prepare: &mut dyn FnMut() -> Option<&'static str>,
        _: &mut dyn FnMut() -> bool,
        on: &mut dyn FnMut(Followed<'_>),
    ) -> Result<FollowEnd, EngineError> {
        if prepare().is_none() {
            return Err(EngineError::Api {
                action: "starting the batch".into(),
                reason: "not made ready".into(),
            });
        }
        on(Followed::Output(self.script.output));
        match &self.script.follow {
            Ok(end) => {
                if end.stopped == Some(Stop::Deadline) {
                    on(Followed::DeadlinePassed);
                }
                Ok(*end)
            }
            Err(fail) => Err(fail()),
        }
    }

    fn is_running(&self, _: &str) -> bool {
        self.script.alive_after
    }

    fn remove_volume(&self, _: &str) -> Result<(), EngineError> {
        Ok(())
    }

    fn create_volume(
        &self,
        _: &str,
        _: std::collections::HashMap<String, String>,
    ) -> Result<String, EngineError> {
        Ok(String::new())
    }

    fn volumes_with_labels(
        &self,
        _: &[String],
    ) -> Result<Vec<crate::engine::VolumeInfo>, EngineError> {
        Ok(Vec::new())
    }

    fn mount_source(&self, _: &str, target: &str) -> Option<String> {
        Some(format!("/var/lib/engine/volumes{target}"))
    }

    fn download<'a>(
        &'a self,
        _: &str,
        path: &str,
        _: Box<dyn Fn() -> Option<String> + 'a>,
    ) -> Box<dyn Read + 'a> {
        self.calls.lock().unwrap().downloaded.push(path.to_string());
        Box::new(std::io::Cursor::new(self.script.reports.clone()))
    }

    fn remove(&self, id: &str) -> Result<Removal, EngineError> {
        self.calls.lock().unwrap().removed.push(id.to_string());
        if self.script.remove_fails {
            return Err(EngineError::Api {
                action: "removing the container".into(),
                reason: "did not receive an exit event".into(),
            });
        }
        Ok(self.script.removal)
    }

    fn end_cause(&self, _: &str, _: u64) -> Result<EndCause, EngineError> {
        Ok(self.script.end_cause.clone())
    }
}

/// `/reports` holding one passing JUnit case.
fn junit_archive() -> Vec<u8> {
    let xml = br#"<testsuite><testcase classname="t" name="ok"/></testsuite>"#;
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(xml.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "reports/junit.xml", &xml[..])
        .unwrap();
    b.into_inner().unwrap()
}

/// Remembers the events' kinds (the phases apart, and not the ticks).
#[derive(Default)]
struct Recorder(Vec<&'static str>, Vec<&'static str>);

impl Reporter for Recorder {
    fn handle(&mut self, event: &Event<'_>) -> Result<(), ReporterError> {
        self.0.push(match &event.kind {
            EventKind::Tick { .. } => return Ok(()),
            EventKind::Phase { phase, .. } => {
                self.1.push(phase.as_str());
                return Ok(());
            }
            EventKind::RunStarted { .. } => "run started",
            EventKind::Swept { .. } => "swept",
            EventKind::BatchStarted { .. } => "batch started",
            EventKind::Waiting { .. } => "waiting",
            EventKind::Queued { .. } => "queued",
            EventKind::LeaseGranted { .. } => "lease granted",
            EventKind::Launching { .. } => "launching",
            EventKind::ContainerStarted { .. } => "container started",
            EventKind::Output { .. } => "output",
            EventKind::OutputEnded { .. } => "output ended",
            EventKind::TimedOut { .. } => "timed out",
            EventKind::OutputBroke { .. } => "output broke",
            EventKind::BatchFailed { .. } => "batch failed",
            EventKind::AttemptEnded { .. } => "attempt ended",
            EventKind::BatchEnded { .. } => "batch ended",
            EventKind::RunEnded { .. } => "run ended",
        });
        Ok(())
    }
}

/// A project in a temporary folder (its own lock dir and reports folder), planned for
/// one CPU batch `b`.
struct Project {
    _dir: tempfile::TempDir,
    plan: RunPlan,
    lockset: Lockset,
}

fn project() -> Project {
    project_with(None)
}

/// One whose batch uses cache `m`, in a store at `store` that the host trusts.
fn project_with(store: Option<&std::path::Path>) -> Project {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("requirements.lock"), "torch==2.5\n").unwrap();
    let text = format!(
        "version: 1\nproject: p\nimage: {{locks: [requirements.lock], install: [\"pip install .\"]}}\ngpu: {{lock_dir: {}}}\n{}batches:\n  b: {{gpus: 0, timeout: 1m, run: [\"true\"]}}\n",
        root.join("locks").display(),
        if store.is_some() {
            "caches: {m: /cache/m}\n"
        } else {
            ""
        }
    );
    let manifest_path = root.join("cibox.yaml");
    std::fs::write(&manifest_path, &text).unwrap();
    let manifest = crate::manifest::Manifest::parse(&text, &manifest_path).unwrap();
    let lockset = Lockset::compute(root, &manifest.images["default"].locks).unwrap();
    std::fs::create_dir(root.join("reports")).unwrap();
    let request = RunRequest {
        names: vec!["b".into()],
        image: Some(IMAGE.into()),
        source: root.to_path_buf(),
        reports: root.join("reports"),
        scope: "unit".into(),
        ..RunRequest::default()
    };
    let me = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let host = HostFacts {
        host: "h".into(),
        uid: me.0,
        gid: me.1,
        run_id: crate::plan::run_plan::new_run_id().unwrap(),
        pass_env: Default::default(),
        mounts: Default::default(),
        policy_digest: None,
        caches: store.map(|root| crate::host::caches::CachePolicy {
            root: root.to_path_buf(),
            host_root: None,
            size: 1 << 30,
            sizes: Default::default(),
            private_size: 1 << 20,
            trusted: true,
            projects: Default::default(),
            pull_requests: Default::default(),
        }),
        devices: Default::default(),
    };
    let mut plan = crate::plan::plan(manifest, request, &host).unwrap();
    // Root runs batches as nobody; here they run as whoever runs the tests.
    for b in &mut plan.batches {
        b.user = me;
    }
    Project {
        _dir: dir,
        plan,
        lockset,
    }
}

/// Runs project `p` on a fake engine that plays `script`.
fn run_with(script: Script) -> (Result<RunResult>, Vec<&'static str>, Calls) {
    let (result, events, _, calls) = run_project_with_phases(&project(), script);
    (result, events, calls)
}

/// As [`run_with`], with the phases the run went through.
fn run_with_phases(
    script: Script,
) -> (
    Result<RunResult>,
    Vec<&'static str>,
    Vec<&'static str>,
    Calls,
) {
    run_project_with_phases(&project(), script)
}

/// Runs project `p` on a fake engine that plays `script`.
fn run_project(p: &Project, script: Script) -> (Result<RunResult>, Vec<&'static str>, Calls) {
    let (result, events, _, calls) = run_project_with_phases(p, script);
    (result, events, calls)
}

fn run_project_with_phases(
    p: &Project,
    script: Script,
) -> (
    Result<RunResult>,
    Vec<&'static str>,
    Vec<&'static str>,
    Calls,
) {
    let engine = FakeEngine::new(script, &p.lockset);
    let locksets = indexmap::IndexMap::from([("default".to_string(), p.lockset.clone())]);
    let mut reporter = Recorder::default();
    let result = execute_with(
        &p.plan,
        &locksets,
        &engine,
        |_, _| Ok(Watchdog::inert()),
        &mut reporter,
    );
    let calls = engine.calls.into_inner().unwrap();
    (result, reporter.0, reporter.1, calls)
}

/// The one batch's record.
fn record(result: &Result<RunResult>) -> &crate::report::RunRecord {
    &result.as_ref().expect("the run ends").batches[0].record
}

#[test]
fn a_batch_whose_steps_and_tests_pass_passes_and_leaves_nothing() {
    let (result, events, calls) = run_with(Script::default());
    let r = record(&result);
    assert_eq!((r.status, r.exit_code), (Status::Passed, 0));
    assert_eq!(r.tests.total, 1);
    assert_eq!(calls.created.len(), 1);
    assert_eq!(calls.removed, vec![format!("id-{}", calls.created[0])]);
    // The source went into /work, its reports folder and the project's lock dir not.
    let (path, names) = &calls.uploaded[0];
    assert_eq!(path, "/work");
    assert!(names.contains(&"cibox.yaml".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("reports")), "{names:?}");
    assert_eq!(calls.downloaded, ["/reports"]);
    assert_eq!(
        events,
        [
            "swept",
            "run started",
            "batch started",
            "launching",
            "container started",
            "output",
            "output ended",
            "batch ended",
            "run ended"
        ]
    );
}

#[test]
fn a_batch_goes_through_its_phases_in_order() {
    let (result, _, phases, _) = run_with_phases(Script {
        output: b"cibox install: pip install .\nok\ncibox run: pytest\n.\n",
        ..Script::default()
    });
    assert_eq!(record(&result).status, Status::Passed);
    assert_eq!(
        phases,
        [
            "verify", "lease", "create", "copy", "install", "run", "collect"
        ]
    );
}

#[test]
fn a_failing_install_step_fails_the_batch_with_its_code() {
    let (result, _, calls) = run_with(Script {
        follow: Ok(FollowEnd {
            stopped: None,
            exit: Some(1),
        }),
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!((r.status, r.exit_code), (Status::Failed, 1));
    assert_eq!(
        r.message.as_deref(),
        Some("a step exited with 1; see log.txt")
    );
    assert_eq!(r.container_exit_code, Some(1));
    assert_eq!(calls.removed.len(), 1, "removed whatever happened");
}

#[test]
fn a_batch_past_its_deadline_times_out_whatever_its_reports_say() {
    let (result, events, _) = run_with(Script {
        follow: Ok(FollowEnd {
            stopped: Some(Stop::Deadline),
            exit: Some(143),
        }),
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!((r.status, r.exit_code), (Status::Timeout, 124));
    assert_eq!(
        r.message.as_deref(),
        Some("the batch hit its timeout of 1m")
    );
    assert!(events.contains(&"timed out"));
}

#[test]
fn a_cancelled_batch_counts_as_its_signal_and_stops_the_run() {
    let (result, _, calls) = run_with(Script {
        follow: Ok(FollowEnd {
            stopped: Some(Stop::Interrupted),
            exit: None,
        }),
        ..Script::default()
    });
    let run = result.as_ref().unwrap();
    let r = record(&result);
    // No signal reached this process: a stop cibox did not ask for counts as SIGTERM.
    assert_eq!((r.status, r.exit_code), (Status::Cancelled, 143));
    assert_eq!(run.stopped_by, Some(nix::sys::signal::Signal::SIGTERM));
    assert_eq!(run.exit_code(), 143);
    assert_eq!(calls.removed.len(), 1);
}

#[test]
fn a_container_killed_from_outside_is_an_infrastructure_error() {
    let (result, _, _) = run_with(Script {
        follow: Ok(FollowEnd {
            stopped: None,
            exit: Some(137),
        }),
        end_cause: EndCause::KilledThroughEngine("9".into()),
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!((r.status, r.exit_code), (Status::InfraError, 5));
    assert!(
        r.message
            .as_deref()
            .unwrap()
            .contains("killed from outside"),
        "{:?}",
        r.message
    );
    assert_eq!(r.container_exit_code, Some(137));
}

#[test]
fn a_batch_over_its_memory_limit_fails_and_says_so() {
    let (result, _, _) = run_with(Script {
        follow: Ok(FollowEnd {
            stopped: None,
            exit: Some(137),
        }),
        end_cause: EndCause::OutOfMemory,
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!((r.status, r.exit_code), (Status::Failed, 1));
    assert!(
        r.message
            .as_deref()
            .unwrap()
            .contains("over its memory limit")
    );
}

#[test]
fn a_container_removed_by_someone_else_is_an_infrastructure_error() {
    let (result, _, _) = run_with(Script {
        removal: Removal::ByOthers,
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!((r.status, r.exit_code), (Status::InfraError, 5));
    assert_eq!(
        r.message.as_deref(),
        Some("the container was removed by someone else while the batch ran")
    );
}

#[test]
fn reports_lost_with_the_container_are_named() {
    let (result, _, _) = run_with(Script {
        alive_after: false,
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!(r.status, Status::Failed, "no test was seen");
    assert!(
        r.reports
            .stopped
            .as_deref()
            .unwrap()
            .contains("had stopped before /reports was copied"),
        "{:?}",
        r.reports.stopped
    );
}

#[test]
fn an_image_gone_before_the_run_stops_it_before_any_container() {
    let (result, events, calls) = run_with(Script {
        image_present: false,
        ..Script::default()
    });
    let e = result.expect_err("refused");
    assert_eq!(e.failure(), crate::exit::Failure::ImageRefused);
    assert!(calls.created.is_empty());
    assert!(events.is_empty(), "{events:?}");
}

#[test]
fn an_image_gone_at_create_refuses_the_batch_not_the_run() {
    let (result, events, _) = run_with(Script {
        create_fails: Some(|| EngineError::ImageMissing {
            image: IMAGE.into(),
        }),
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!((r.status, r.exit_code), (Status::ImageRefused, 3));
    assert!(events.contains(&"batch failed") && events.contains(&"run ended"));
}

#[test]
fn an_engine_that_cannot_follow_the_steps_fails_the_batch_as_infrastructure() {
    let (result, _, calls) = run_with(Script {
        follow: Err(|| EngineError::Api {
            action: "following the batch".into(),
            reason: "connection reset".into(),
        }),
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!((r.status, r.exit_code), (Status::InfraError, 5));
    assert!(r.message.as_deref().unwrap().contains("connection reset"));
    assert_eq!(calls.removed.len(), 1);
}

#[test]
fn a_container_killed_from_outside_lost_its_reports_even_while_it_reads_as_running() {
    // The engine may still call a container it just killed running for a moment: the
    // copy then reads an empty `/reports`, which is a loss, not "nothing written".
    let mut empty = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_size(0);
    h.set_mode(0o755);
    h.set_cksum();
    empty.append_data(&mut h, "reports/", &[][..]).unwrap();
    let (result, _, _) = run_with(Script {
        follow: Ok(FollowEnd {
            stopped: None,
            exit: Some(137),
        }),
        end_cause: EndCause::KilledThroughEngine("9".into()),
        alive_after: true,
        reports: empty.into_inner().unwrap(),
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!(r.status, Status::InfraError);
    assert!(
        r.reports
            .stopped
            .as_deref()
            .is_some_and(|s| s.contains("had stopped before /reports was copied")),
        "{:?}",
        r.reports
    );
}

#[test]
fn a_failed_install_is_named_and_counts_no_test() {
    let (result, _, _) = run_with(Script {
        output: b"cibox install: pip install -e .\nERROR: no matching distribution for torch\n",
        follow: Ok(FollowEnd {
            stopped: None,
            exit: Some(1),
        }),
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!((r.status, r.exit_code), (Status::Failed, 1));
    assert_eq!(
        r.message.as_deref(),
        Some(
            "the install step `pip install -e .` failed with exit 1, before any test ran; its output ends: ERROR: no matching distribution for torch"
        )
    );
    assert_eq!(r.tests.total, 0, "no test ran");
}

#[test]
fn a_trusted_layer_is_left_alone_while_its_container_may_still_write_it() {
    use std::os::unix::fs::PermissionsExt;
    let store = tempfile::tempdir().unwrap();
    std::fs::set_permissions(store.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = project_with(Some(store.path()));
    let work = store.path().join("p/m/work");
    // Passed, but its container could not be removed: whatever still runs in it writes
    // the layer, and a merge or a removal there would follow what it plants.
    let (result, _, _) = run_project(
        &p,
        Script {
            remove_fails: true,
            ..Script::default()
        },
    );
    let r = record(&result);
    assert!(r.caches[0].kept.is_none(), "{:?}", r.caches);
    assert!(
        r.caches[0]
            .problem
            .as_deref()
            .is_some_and(|p| p.contains("could not be removed")),
        "{:?}",
        r.caches
    );
    let layers: Vec<_> = std::fs::read_dir(&work).unwrap().flatten().collect();
    assert!(layers.iter().any(|e| e.path().is_dir()), "{layers:?}");
    // Once it is gone, its layer goes with the next clean-up; one that passes is kept.
    let (result, _, _) = run_project(&project_with(Some(store.path())), Script::default());
    assert!(record(&result).caches[0].kept.is_some());
    let layers: Vec<_> = std::fs::read_dir(&work).unwrap().flatten().collect();
    assert!(layers.is_empty(), "{layers:?}");
}

#[test]
fn reports_said_empty_by_a_batch_that_ended_well_are_not_copied() {
    let said = b"cibox run: true\ncibox reports: none\n";
    let (result, _, calls) = run_with(Script {
        output: said,
        ..Script::default()
    });
    assert!(calls.downloaded.is_empty(), "{:?}", calls.downloaded);
    let r = record(&result);
    // What it said it has: no test case (this batch does not allow that).
    assert_eq!((r.tests.total, r.status), (0, Status::Failed));
    assert_eq!(r.reports.files, 0);
    assert_eq!(r.reports.stopped, None);
    assert_eq!(calls.removed.len(), 1);
    // Said by a batch that did not end well, or not as its last word: copied.
    for (output, exit) in [
        (&said[..], Some(1)),
        (&said[..], None),
        (&b"cibox reports: none\nlate worker\n"[..], Some(0)),
    ] {
        let (_, _, calls) = run_with(Script {
            output,
            follow: Ok(FollowEnd {
                stopped: None,
                exit,
            }),
            ..Script::default()
        });
        assert_eq!(
            calls.downloaded,
            ["/reports"],
            "{:?} {exit:?}",
            String::from_utf8_lossy(output)
        );
    }
    // Stopped at its deadline after saying so: copied.
    let (_, _, calls) = run_with(Script {
        output: said,
        follow: Ok(FollowEnd {
            stopped: Some(Stop::Deadline),
            exit: Some(0),
        }),
        ..Script::default()
    });
    assert_eq!(calls.downloaded, ["/reports"]);
}

#[test]
fn a_source_that_cannot_be_copied_in_runs_no_step() {
    let (result, events, calls) = run_with(Script {
        upload_fails: true,
        ..Script::default()
    });
    let r = record(&result);
    assert_eq!((r.status, r.exit_code), (Status::InfraError, 5));
    let message = r.message.as_deref().unwrap();
    assert!(
        message.starts_with("could not copy the source (")
            && message.ends_with("into the container's /work: container engine: copying the source in failed: no space left on device"),
        "{message}"
    );
    assert!(!events.contains(&"output"), "the steps went on: {events:?}");
    assert_eq!(calls.removed.len(), 1);
}
