//! Nothing outlives its owner: containers of killed runs are swept host-wide, judged
//! in the lock dir their run used; a live run's are never touched; a killed run's
//! snapshot of its source is swept too, later if it was still in use.

use crate::common::*;

/// Whether the watchdog command line `cmdline` watches a container of `scope`.
fn container_of_scope(cmdline: &str, scope: &str) -> bool {
    let Some(id) = cmdline.split('\0').nth(2).map(str::trim) else {
        return false;
    };
    let out = std::process::Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{index .Config.Labels \"org.cibox.scope\"}}",
            id,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == scope
}

#[test]
fn a_dead_run_in_another_scope_is_swept_and_a_live_one_never() {
    let p = busybox_project(
        "  long:\n    gpus: 0\n    timeout: 10m\n    run: [\"sleep 600\"]\n  quick:\n    gpus: 0\n    timeout: 1m\n    allow_empty: true\n    run: [\"true\"]\n",
        "",
    );
    let locks = tempfile::tempdir().unwrap();
    let scope_a = format!("{}-a", p.scope());
    let mut long = p
        .batch_cmd(&["batch", "run", "long", "--scope", &scope_a])
        .env("CIBOX_GPU_LOCK_DIR", locks.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ours = |scope: &str| {
        let out = std::process::Command::new("docker")
            .args(["ps", "-a", "-q", "--filter"])
            .arg(format!("label=org.cibox.scope={scope}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    assert!(wait_until(30, || ours(&scope_a) == 1));
    // A cleanup of every scope, from where no manifest names that lock dir: the run is
    // alive in the lock dir its container names, so its container stays.
    let elsewhere = tempfile::tempdir().unwrap();
    let r = run(cibox(elsewhere.path()).arg("cleanup"));
    r.ok();
    assert_eq!(
        ours(&scope_a),
        1,
        "cleanup removed a live run's container: {}",
        r.stdout
    );
    // Nor does a run's own sweep in another scope, nor a cleanup of that very scope:
    // a sweep judges each container by its run, never by its scope.
    let scope_c = format!("{}-c", p.scope());
    p.run(&["batch", "run", "quick", "--scope", &scope_c]).ok();
    run(cibox(elsewhere.path()).args(["cleanup", "--scope", &scope_a])).ok();
    assert_eq!(
        ours(&scope_a),
        1,
        "a sweep removed another scope's live container"
    );
    // Killed with its watchdog (as a host's OOM killer might), the run is dead: the next
    // run in another scope (and another lock dir) removes its container.
    for pid in pids_with(&["__watchdog"]) {
        let container = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let container = String::from_utf8_lossy(&container).to_string();
        if container_of_scope(&container, &scope_a) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    long.kill().unwrap();
    long.wait().unwrap();
    assert_eq!(
        ours(&scope_a),
        1,
        "the container outlives its cibox and watchdog"
    );
    let scope_b = format!("{}-b", p.scope());
    p.run(&["batch", "run", "quick", "--scope", &scope_b]).ok();
    assert!(
        wait_until(10, || ours(&scope_a) == 0),
        "a dead run's container in another scope was left"
    );
}

/// A container of its own that holds a volume, so the engine refuses to remove it;
/// removed when dropped.
struct VolumeHolder(String);

impl VolumeHolder {
    fn new(image: &str, volume: &str) -> VolumeHolder {
        let name = format!("cibox-test-holder-{}", nonce());
        let made = std::process::Command::new("docker")
            .args(["create", "--name", &name, "-v"])
            .arg(format!("{volume}:/held"))
            .args([image, "true"])
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
        VolumeHolder(name)
    }
}

impl Drop for VolumeHolder {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

#[test]
fn a_dead_runs_snapshot_still_in_use_is_swept_once_it_is_free() {
    // Two batches of one user: the run ships its source once, into a volume.
    let p = busybox_project(
        "  long:\n    gpus: 0\n    timeout: 10m\n    run: [\"sleep 600\"]\n  after:\n    gpus: 0\n    timeout: 1m\n    allow_empty: true\n    run: [\"true\"]\n",
        "",
    );
    // A lock dir of its own: only this test's sweeps forget its run's record. The
    // snapshot is a volume where cibox cannot mount (here: it is not root; as root, it
    // is a tmpfs of the host, see `batch::work`).
    let home = tempfile::tempdir().unwrap();
    let volumes = || {
        let out = std::process::Command::new("docker")
            .args(["volume", "ls", "-q", "--filter"])
            .arg(format!("label=org.cibox.scope={}", p.scope()))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let mut c = p.batch_cmd(&["batch", "run", "long", "after"]);
    as_nobody(&mut c, &[p.project.path()], home.path());
    let mut cibox = c
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The batch runs (the volume is filled: its filler container is gone).
    assert!(wait_until(30, || {
        let running = p.containers();
        running.len() == 1 && running[0].contains("-long-") && volumes().len() == 1
    }));
    let snapshot = volumes().remove(0);
    assert!(snapshot.contains(".source-"), "{snapshot}");
    // Something the engine will not remove the volume from while it exists.
    let holder = VolumeHolder::new(&p.image.0, &snapshot);
    cibox.kill().unwrap();
    cibox.wait().unwrap();
    assert!(wait_until(15, || p.containers().is_empty()));
    // By the same user: its lock dir is nobody's.
    let cleanup = || {
        let mut c = p.batch_cmd_bare(&["cleanup", "--scope", &p.scope()]);
        as_nobody(&mut c, &[], home.path());
        run(&mut c)
    };
    // The run is dead, its volume in use: it stays, and so must the run's record, or
    // no later sweep could tell that the run is dead.
    cleanup().ok();
    assert_eq!(volumes(), std::slice::from_ref(&snapshot));
    drop(holder);
    cleanup().ok();
    assert!(
        wait_until(10, || volumes().is_empty()),
        "the dead run's snapshot {snapshot} was left for good: {:?}",
        volumes()
    );
}

#[test]
fn a_batch_container_dies_with_its_cibox() {
    let p = busybox_project(
        "  long:\n    gpus: 0\n    timeout: 10m\n    run: [\"sleep 600\"]\n",
        "",
    );
    let mut cibox = p.spawn(&["batch", "run", "long"]);
    assert!(wait_until(30, || p.containers().len() == 1));
    let id = BusyboxProject::inspect(&p.containers()[0], "{{.Id}}");
    // Its watchdog runs beside cibox, in a session of its own.
    assert!(wait_until(10, || pids_with(&["__watchdog", &id]).len() == 1));
    let watchdog = pids_with(&["__watchdog", &id])[0];
    cibox.kill().unwrap();
    cibox.wait().unwrap();
    assert!(
        wait_until(15, || p.containers().is_empty()),
        "the container of a SIGKILLed cibox is still there"
    );
    assert!(
        wait_until(15, || !pid_alive(watchdog)),
        "the watchdog did not leave"
    );
}

#[test]
fn a_container_removed_from_outside_is_an_infrastructure_error() {
    let p = busybox_project(
        "  long:\n    gpus: 0\n    timeout: 10m\n    run: [\"sleep 600\"]\n",
        "",
    );
    let mut child = p.spawn(&["batch", "run", "long"]);
    assert!(wait_until(30, || p.containers().len() == 1));
    // Asked again while the engine is still making it (under load, an inspect of a
    // container being created can come back without its mounts).
    let mut volume = String::new();
    assert!(
        wait_until(30, || {
            volume = BusyboxProject::inspect(
                &p.containers()[0],
                "{{range .Mounts}}{{if eq .Destination \"/reports\"}}{{.Name}}{{end}}{{end}}",
            );
            !volume.is_empty()
        }),
        "/reports is a volume"
    );
    std::process::Command::new("docker")
        .args(["rm", "-f", &p.containers()[0]])
        .output()
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(5));
    assert_eq!(
        p.result("long")["status"],
        "infra_error",
        "not a test failure"
    );
    // Removed without its volumes (`rm -f`, no `-v`): cibox removes the /reports one.
    let left = std::process::Command::new("docker")
        .args(["volume", "inspect", &volume])
        .output()
        .unwrap();
    assert!(
        !left.status.success(),
        "the /reports volume {volume} was left"
    );
}

#[test]
fn a_container_killed_from_outside_is_an_infrastructure_error() {
    let p = busybox_project(
        "  long:\n    gpus: 0\n    timeout: 10m\n    run: [\"sleep 600\"]\n",
        "",
    );
    // Killed while its batch runs, and as soon as it exists (before or as the batch
    // starts): both are the engine's doing, not the test's.
    for while_running in [true, false] {
        let mut child = p.spawn(&["batch", "run", "long"]);
        assert!(wait_until(30, || p.containers().len() == 1));
        if while_running {
            let log = p.reports().join("long/log.txt");
            assert!(wait_until(30, || std::fs::read_to_string(&log)
                .is_ok_and(|l| l.contains("cibox run: sleep 600"))));
        }
        // A container made but not started yet cannot be killed: ask until it can be
        // (or cibox has ended), or the batch would sleep its 600 s out.
        let name = p.containers()[0].clone();
        assert!(wait_until(30, || {
            let killed = std::process::Command::new("docker")
                .args(["kill", &name])
                .output()
                .unwrap()
                .status
                .success();
            killed || child.try_wait().unwrap().is_some()
        }));
        assert_eq!(child.wait().unwrap().code(), Some(5));
        let result = p.result("long");
        assert_eq!(result["status"], "infra_error", "not a test failure");
        assert!(
            result["message"]
                .as_str()
                .unwrap()
                .contains("killed from outside through the engine (signal 9"),
            "{result}"
        );
        if while_running {
            assert!(
                result["reports"]["stopped"]
                    .as_str()
                    .is_some_and(|s| s.contains("had stopped before /reports was copied")),
                "the record says the reports were lost: {result}"
            );
        }
    }
}

#[test]
fn a_batch_over_its_memory_limit_fails_and_says_so() {
    let p = busybox_project(
        "  hungry:\n    gpus: 0\n    timeout: 10m\n    run: [\"head -c 600000000 /dev/zero | sort > /dev/null\"]\n",
        "",
    );
    let r = p.run(&["batch", "run", "hungry"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let result = p.result("hungry");
    assert_eq!(result["status"], "failed");
    assert!(
        result["message"]
            .as_str()
            .unwrap()
            .contains("went over its memory limit (256m)"),
        "{result}"
    );
}

/// An engine on a socket of its own that answers the version handshake and never
/// answers a removal: how a hung engine looks to the watchdog. Counts the removals.
struct HangingEngine {
    dir: tempfile::TempDir,
    removals: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl HangingEngine {
    fn start() -> HangingEngine {
        use std::io::{BufRead, BufReader, Read, Write};
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().unwrap();
        let listener =
            std::os::unix::net::UnixListener::bind(dir.path().join("docker.sock")).unwrap();
        let removals = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = removals.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut out = stream;
                    loop {
                        let mut head = Vec::new();
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                            head.push(line);
                        }
                        if head.first().is_some_and(|l| l.starts_with("DELETE ")) {
                            seen.fetch_add(1, Ordering::SeqCst);
                            // Never answered: held until the client gives up.
                            let _ = reader.read_to_end(&mut Vec::new());
                            return;
                        }
                        let body =
                            r#"{"ApiVersion":"1.41","MinAPIVersion":"1.12","Version":"20.10.0"}"#;
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if out.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        HangingEngine { dir, removals }
    }

    fn host(&self) -> String {
        format!("unix://{}", self.dir.path().join("docker.sock").display())
    }

    fn removals(&self) -> usize {
        self.removals.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn a_hung_engine_holds_the_watchdog_only_briefly() {
    // cibox is gone (the watchdog's pipe is closed at once) and the engine takes the
    // removal but never answers it. Each engine call of the watchdog must give up soon
    // and try again, not wait out the client's two-minute default while it holds the
    // batch's GPUs.
    let engine = HangingEngine::start();
    let work = tempfile::tempdir().unwrap();
    let mut watchdog = cibox(work.path())
        .args(["__watchdog", "cibox-hung-engine-test"])
        .env("DOCKER_HOST", engine.host())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let retried = wait_until(60, || engine.removals() >= 2);
    let _ = watchdog.kill();
    let _ = watchdog.wait();
    assert!(
        retried,
        "one removal held the watchdog ({} asked)",
        engine.removals()
    );
}
