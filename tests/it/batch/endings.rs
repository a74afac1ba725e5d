//! Batches and runs that end other than by passing: timeouts, SIGTERM, SIGKILL and the
//! cleanup after it, engine refusals, killed runs' folders, background workers.

use std::time::{Duration, Instant};

use super::{batch, two_passing_batches};
use crate::common::*;

#[test]
fn a_timeout_kills_stubborn_workers_and_exits_124() {
    // The step forks workers that ignore SIGTERM and prints nothing.
    let stubborn = "for i in 1 2 3; do (trap '' TERM; while :; do sleep 1; done) & done; wait";
    let p = busybox_project(&batch("slow", 0, "2s", &[stubborn], ""), "");
    let start = Instant::now();
    let r = p.run(&["batch", "run", "slow"]);
    assert_eq!(r.code, 124, "{}", r.stderr);
    assert_eq!(p.result("slow")["status"], "timeout");
    assert!(
        p.containers().is_empty(),
        "left behind: {:?}",
        p.containers()
    );
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn sigterm_cancels_removes_and_exits_143() {
    let p = busybox_project(
        &batch(
            "long",
            0,
            "10m",
            &["echo '<testsuite/>' > $CIBOX_REPORTS/partial.xml; echo started; sleep 600"],
            "",
        ),
        "",
    );
    let mut child = p
        .batch_cmd(&["batch", "run", "long"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log = p.reports().join("long/log.txt");
    assert!(
        wait_until(30, || std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("started"))),
        "the batch never started"
    );
    let t = Instant::now();
    unsafe { nix::libc::kill(child.id() as i32, nix::libc::SIGTERM) };
    let status = child.wait().unwrap();
    let took = t.elapsed();
    assert_eq!(status.code(), Some(143));
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_eq!(p.result("long")["status"], "cancelled");
    assert_eq!(p.result("long")["exit_code"], 143);
    assert!(p.containers().is_empty());
    // What the cancelled batch had written is still copied out.
    assert!(
        p.reports().join("long/partial.xml").is_file(),
        "{}",
        p.result("long")["reports"]
    );
}

#[test]
fn a_signal_while_the_source_is_copied_in_runs_no_step() {
    // The batch's exec starts while its source is copied in, its script waiting for
    // cibox's word: a SIGTERM before that word is given ends the batch with no step run.
    let p = busybox_project(&batch("b", 0, "10m", &["echo STEP-RAN"], ""), "");
    // 100 MB to copy: the signal lands while the engine extracts it.
    for f in ["big-1", "big-2"] {
        std::fs::write(p.project.path().join(f), vec![0u8; 50 << 20]).unwrap();
    }
    let mut child = p.spawn(&["batch", "run", "b"]);
    assert!(wait_until(30, || p.containers().len() == 1));
    unsafe { nix::libc::kill(child.id() as i32, nix::libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(143));
    assert_eq!(p.result("b")["status"], "cancelled");
    let log = std::fs::read_to_string(p.reports().join("b/log.txt")).unwrap();
    assert!(!log.contains("STEP-RAN"), "a step ran: {log}");
    assert!(p.containers().is_empty());
}

#[test]
fn after_sigkill_cleanup_removes_exactly_our_leftovers() {
    let p = busybox_project(
        &format!(
            "{}{}",
            batch("long", 0, "10m", &["sleep 600"], ""),
            batch("quick", 0, "1m", &[JUNIT_OK], "")
        ),
        "",
    );
    let mut child = p.batch_cmd(&["batch", "run", "long"]).spawn().unwrap();
    assert!(wait_until(30, || p.containers().len() == 1));
    let run_id = BusyboxProject::inspect(
        &p.containers()[0],
        "{{index .Config.Labels \"org.cibox.run\"}}",
    );
    let record = std::path::Path::new("/run/lock/cibox/runs").join(format!("{run_id}.lock"));
    assert!(
        record.exists(),
        "no record of the live run at {}",
        record.display()
    );
    // While its run lives, neither another run of the scope (as a sibling job of the
    // same workflow run would) nor a cleanup touches it.
    p.run(&["batch", "run", "quick"]).ok();
    let r = run(cibox(p.project.path()).args(["cleanup", "--scope", &p.scope()]));
    r.ok();
    assert!(
        r.stdout.contains("removed 0 container(s)")
            && r.stdout.contains("left 1 of runs still alive"),
        "{}",
        r.stdout
    );
    assert_eq!(p.containers().len(), 1, "a live run's container was swept");
    child.kill().unwrap();
    child.wait().unwrap();
    // Its container is now a dead run's: the next sweep on this host removes it, in
    // whatever scope (another test's run may be first).
    // A look-alike without cibox's labels, a cibox container of another scope, and
    // one that another host made (only that host can tell whether its run lives).
    let stranger = format!("cibox-bt-{}-long-stranger", p.scope());
    let other_scope = format!("other-{}", &p.image.0[7..19]);
    let other_host = format!("cibox-bt-{}-long-otherhost", p.scope());
    for (name, labels) in [
        (stranger.clone(), vec![]),
        (
            other_host.clone(),
            vec![
                "org.cibox.owner=cibox".to_string(),
                format!("org.cibox.scope={}", p.scope()),
                "org.cibox.project=bt".into(),
                "org.cibox.run=0123456789abcdef".into(),
                "org.cibox.host=some-other-host".into(),
            ],
        ),
        (
            format!("cibox-bt-{other_scope}-long-x"),
            vec![
                "org.cibox.owner=cibox".to_string(),
                format!("org.cibox.scope={other_scope}"),
                "org.cibox.project=bt".into(),
            ],
        ),
    ] {
        let mut c = std::process::Command::new("docker");
        c.args(["create", "--name", &name]);
        for l in &labels {
            c.args(["--label", l]);
        }
        assert!(
            c.arg(&p.image.0)
                .arg("/bin/true")
                .output()
                .unwrap()
                .status
                .success()
        );
    }
    let r = run(cibox(p.project.path()).args(["cleanup", "--scope", &p.scope()]));
    r.ok();
    assert!(
        r.stdout.contains("removed 1 container") || r.stdout.contains("removed 0 container"),
        "{}",
        r.stdout
    );
    assert!(
        !record.exists(),
        "the dead run's record outlived its containers"
    );
    assert!(
        r.stderr.contains(&format!(
            "leaving {other_host}: made on host some-other-host"
        )),
        "{}",
        r.stderr
    );
    assert_eq!(p.containers(), std::slice::from_ref(&other_host));
    for name in [
        &stranger,
        &other_host,
        &format!("cibox-bt-{other_scope}-long-x"),
    ] {
        let gone = !std::process::Command::new("docker")
            .args(["inspect", name])
            .output()
            .unwrap()
            .status
            .success();
        assert!(!gone, "cleanup removed {name}, which was not its own");
        std::process::Command::new("docker")
            .args(["rm", "-f", name])
            .output()
            .unwrap();
    }
}

#[test]
fn an_engine_refusal_ends_its_batch_not_the_run() {
    // The engine refuses to create these containers (below its 6 MB memory minimum):
    // each batch is an infra error with the engine's reason, and the run still writes
    // every record and the summary.
    let p = two_passing_batches();
    let manifest = p.project.path().join("cibox.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("memory: 256m", "memory: 4m")).unwrap();
    let r = p.run(&["batch", "run", "unit", "second"]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    for b in ["unit", "second"] {
        let v = p.result(b);
        assert_eq!(v["status"], "infra_error", "{v}");
        assert!(v["message"].as_str().unwrap().contains("memory"), "{v}");
    }
    assert!(p.reports().join("summary.md").exists());
    assert!(p.containers().is_empty());
}

#[test]
fn a_run_after_a_killed_run_takes_over_its_reports_folder() {
    // A SIGKILLed run leaves its batch folder without result.json; the next run must
    // know it as cibox's, not refuse it as someone else's.
    let p = busybox_project(&batch("nap", 0, "1m", &["sleep 2", JUNIT_OK], ""), "");
    let mut child = p.batch_cmd(&["batch", "run", "nap"]).spawn().unwrap();
    assert!(wait_until(30, || p.containers().len() == 1));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!p.reports().join("nap/result.json").exists());
    p.run(&["batch", "run", "nap"]).ok();
    assert_eq!(p.result("nap")["status"], "passed");
    assert!(p.containers().is_empty());
}

#[test]
fn a_worker_left_in_the_background_does_not_hold_the_batch_open() {
    // The worker keeps the batch's output open; the batch is over when its steps are.
    let p = busybox_project(
        "  bg:\n    gpus: 0\n    timeout: 5m\n    allow_empty: true\n    run: [\"sleep 600 & echo left\"]\n",
        "",
    );
    let r = p.run(&["batch", "run", "bg"]);
    r.ok();
    assert_eq!(p.result("bg")["status"], "passed");
    assert!(p.containers().is_empty(), "the worker's container is gone");
}
