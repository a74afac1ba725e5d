//! Batches in disposable containers on the real engine.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

fn yaml_list(steps: &[&str]) -> String {
    let quoted: Vec<String> = steps
        .iter()
        .map(|s| serde_json::to_string(s).unwrap())
        .collect();
    format!("[{}]", quoted.join(", "))
}

fn batch(name: &str, gpus: u32, timeout: &str, steps: &[&str], extra: &str) -> String {
    format!(
        "  {name}:\n    gpus: {gpus}\n    timeout: {timeout}\n    run: {}\n{extra}",
        yaml_list(steps)
    )
}

#[test]
fn symlinks_a_batch_plants_in_its_reports_are_never_followed() {
    // The batch may write its reports folder; it plants symlinks to a host file where
    // cibox writes (result.json and its temporary) and reads (a JUnit file).
    let victim_dir = tempfile::tempdir().unwrap();
    let victim = victim_dir.path().join("precious.xml");
    std::fs::write(
        &victim,
        "<testsuite><testcase classname=\"t\" name=\"stolen\"/></testsuite>",
    )
    .unwrap();
    let v = victim.display().to_string();
    let plant = format!(
        "ln -s {v} $CIBOX_REPORTS/.result.json.partial && ln -s {v} $CIBOX_REPORTS/result.json && ln -s {v} $CIBOX_REPORTS/stolen.xml"
    );
    let p = busybox_project(&batch("unit", 0, "1m", &[JUNIT_OK, &plant], ""), "");
    p.run(&["batch", "run", "unit"]).ok();
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "<testsuite><testcase classname=\"t\" name=\"stolen\"/></testsuite>",
        "cibox wrote through a planted symlink"
    );
    let dir = p.reports().join("unit");
    assert!(
        !std::fs::symlink_metadata(dir.join("result.json"))
            .unwrap()
            .is_symlink()
    );
    let v = p.result("unit");
    assert_eq!(v["tests"]["total"], 1, "a symlinked report was read: {v}");
}

/// A project with two CPU batches, `unit` and `second`, that each pass one test.
fn two_passing_batches() -> BusyboxProject {
    busybox_project(
        &format!(
            "{}{}",
            batch("unit", 0, "1m", &[JUNIT_OK], ""),
            batch("second", 0, "1m", &[JUNIT_OK], "")
        ),
        "",
    )
}

#[test]
fn a_passing_batch_leaves_reports_and_no_container() {
    let p = busybox_project(
        &batch(
            "unit",
            0,
            "1m",
            &["echo hello from the batch", JUNIT_OK],
            "",
        ),
        "",
    );
    let r = p.run(&["batch", "run", "unit"]);
    r.ok();
    assert!(r.stdout.contains("hello from the batch"), "{}", r.stdout);
    let v = p.result("unit");
    assert_eq!(v["status"], "passed");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["image"], p.image.0.as_str());
    assert_eq!(v["tests"]["total"], 1);
    assert_eq!(v["scope"], p.scope().as_str());
    assert!(
        v["container"]
            .as_str()
            .unwrap()
            .starts_with(&format!("cibox-bt-{}-unit-", p.scope()))
    );
    for key in [
        "lockset",
        "started_at",
        "finished_at",
        "duration_s",
        "cibox_version",
        "manifest_digest",
        "host",
        "run",
    ] {
        assert!(!v[key].is_null(), "{key} missing");
    }
    assert!(
        std::fs::read_to_string(p.reports().join("unit/log.txt"))
            .unwrap()
            .contains("hello from the batch")
    );
    assert!(p.reports().join("summary.md").exists() && p.reports().join("junit.xml").exists());
    assert!(
        p.containers().is_empty(),
        "left behind: {:?}",
        p.containers()
    );
}

#[test]
fn the_container_is_locked_down() {
    let checks = [
        // The invoking uid (never root: nobody's when cibox runs as root), HOME=/tmp, no
        // capabilities, no network but loopback.
        "test \"$(id -u)\" = \"$HOST_UID\"",
        "test \"$HOME\" = /tmp",
        "grep -q '^CapEff:[[:space:]]*0000000000000000$' /proc/self/status",
        "grep -q '^NoNewPrivs:[[:space:]]*1$' /proc/self/status",
        "test \"$(grep -c : /proc/net/dev)\" = 1",
        // Source read-only at /src, copied into /work.
        "! touch /src/x 2>/dev/null",
        "test -f /work/cibox.yaml",
        // No host variable but pass_env; CUDA hidden for a CPU batch.
        "test -z \"${CIBOX_TEST_SECRET:-}\"",
        "test \"$CIBOX_TEST_PASSED\" = yes",
        "test \"$NVIDIA_VISIBLE_DEVICES\" = void",
        "test -z \"$CUDA_VISIBLE_DEVICES\"",
        "test \"$FROM_MANIFEST\" = 1",
        "! test -e /var/run/docker.sock",
        JUNIT_OK,
    ];
    let extra = "    env: {FROM_MANIFEST: \"1\"}\n";
    let uid = if nix::unistd::getuid().is_root() {
        "65534".to_string()
    } else {
        nix::unistd::getuid().to_string()
    };
    let p = busybox_project(
        &batch("sec", 0, "1m", &checks, extra),
        &format!("  pass_env: [CIBOX_TEST_PASSED, HOST_UID]\n  env: {{X: \"{uid}\"}}\n"),
    );
    let r = run(p
        .batch_cmd(&["batch", "run", "sec"])
        .env("CIBOX_TEST_SECRET", "leak")
        .env("CIBOX_TEST_PASSED", "yes")
        .env("HOST_UID", &uid));
    r.ok();
}

#[test]
fn a_failing_step_is_status_failed_exit_1() {
    let p = busybox_project(
        &batch("bad", 0, "1m", &[JUNIT_OK, "echo boom; exit 3"], ""),
        "",
    );
    let r = p.run(&["batch", "run", "bad"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let v = p.result("bad");
    assert_eq!(v["status"], "failed");
    assert_eq!(v["container_exit_code"], 3);
    assert!(r.stderr.contains("cibox reproduce"), "{}", r.stderr);
    assert!(p.containers().is_empty());
}

#[test]
fn failing_test_cases_fail_the_batch_and_are_named() {
    let junit = "echo '<testsuite><testcase classname=\"m\" name=\"t1\"><failure message=\"nope\"/></testcase><testcase classname=\"m\" name=\"t2\"><skipped message=\"needs 2 GPUs\"/></testcase></testsuite>' > $CIBOX_REPORTS/j.xml";
    let p = busybox_project(&batch("tf", 0, "1m", &[junit], ""), "");
    let r = p.run(&["batch", "run", "tf"]);
    assert_eq!(r.code, 1);
    let v = p.result("tf");
    assert_eq!(v["failed_tests"], serde_json::json!(["m::t1"]));
    assert_eq!(v["tests"]["skipped_reasons"]["needs 2 GPUs"], 1);
    let merged = std::fs::read_to_string(p.reports().join("junit.xml")).unwrap();
    assert!(merged.contains("t1") && merged.contains("nope"), "{merged}");
}

#[test]
fn a_batch_without_tests_fails_unless_allowed() {
    let p = busybox_project(
        &(batch("empty", 0, "1m", &["true"], "")
            + &batch("fine", 0, "1m", &["true"], "    allow_empty: true\n")),
        "",
    );
    let r = p.run(&["batch", "run", "empty"]);
    assert_eq!(r.code, 1);
    assert!(
        p.result("empty")["message"]
            .as_str()
            .unwrap()
            .contains("ran no test")
    );
    p.run(&["batch", "run", "fine"]).ok();
}

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
fn a_gpu_batch_on_an_engine_without_gpu_runtime_is_exit_5_and_cleaned_up() {
    let p = busybox_project(&batch("g", 1, "1m", &[JUNIT_OK], ""), "");
    let smi = FakeSmi::with_gpus(2);
    let locks = tempfile::tempdir().unwrap();
    let mut c = p.batch_cmd(&["batch", "run", "g"]);
    smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", locks.path());
    let r = run(&mut c);
    // The fixture's UUIDs exist on no host, so even an engine with a GPU runtime fails
    // to start this container: always exit 5.
    assert_eq!(r.code, 5, "{}", r.stderr);
    let v = p.result("g");
    assert_eq!(v["status"], "infra_error");
    assert!(
        v["message"].as_str().unwrap().contains("could not start"),
        "{v}"
    );
    assert_eq!(v["gpus"][0]["uuid"], uuid(0));
    assert!(p.containers().is_empty());
    // The lease went with the container.
    let mut c = cibox(p.project.path());
    smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", locks.path())
        .args(["gpu", "exec", "--count", "2", "--wait", "0s", "--", "true"]);
    run(&mut c).ok();
}

#[test]
fn bad_run_input_is_refused_before_anything_starts() {
    let p = two_passing_batches();
    p.run(&["batch", "run", "unti"])
        .fails_with(2, "unknown batch `unti`; did you mean `unit`?");
    p.run(&["batch", "run", "--layer", "9"])
        .fails_with(2, "unknown layer `9`");
    run(cibox(p.project.path()).args(["batch", "run", "unit", "--image", "busybox:latest"]))
        .fails_with(3, "is a tag");
    let file = p.project.write("plain", "x");
    let f = file.display().to_string();
    p.run(&["batch", "run", "unit", "--source", &f])
        .fails_with(2, "not a directory");
    p.run(&["batch", "run", "unit", "--reports", &format!("{f}/r")])
        .fails_with(2, "reports dir");
    // Found before the first batch runs, not after it.
    p.project.write("reports/second/foreign.txt", "not ours");
    p.run(&["batch", "run", "unit", "second"])
        .fails_with(2, "holds files cibox did not write");
    assert!(!p.reports().join("unit").exists(), "the first batch ran");
    assert!(p.containers().is_empty());
}

#[test]
fn a_source_outside_git_is_allowed_and_recorded() {
    let p = busybox_project(&batch("unit", 0, "1m", &[JUNIT_OK], ""), "");
    let plain = tempfile::tempdir().unwrap();
    std::fs::write(plain.path().join("f"), "x").unwrap();
    p.run(&[
        "batch",
        "run",
        "unit",
        "--source",
        plain.path().to_str().unwrap(),
    ])
    .ok();
    assert!(p.result("unit")["source"]["sha"].is_null());
}

#[test]
fn parallel_batches_run_at_once_and_prefix_their_output() {
    let step = |n: &str| {
        format!(
            "cut -d' ' -f1 /proc/uptime > $CIBOX_REPORTS/start; sleep 1; cut -d' ' -f1 /proc/uptime > $CIBOX_REPORTS/end; echo hello from {n}; {JUNIT_OK}"
        )
    };
    let p = busybox_project(
        &(batch("a", 0, "1m", &[&step("a")], "") + &batch("b", 0, "1m", &[&step("b")], "")),
        "",
    );
    let r = p.run(&["batch", "run", "a", "b", "--parallel"]);
    r.ok();
    assert!(
        r.stdout.contains("[a] hello from a") && r.stdout.contains("[b] hello from b"),
        "{}",
        r.stdout
    );
    // Uptime (one kernel, one clock for both containers), in seconds.
    let t = |b: &str, f: &str| -> f64 {
        std::fs::read_to_string(p.reports().join(b).join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    assert!(
        t("a", "start") < t("b", "end") && t("b", "start") < t("a", "end"),
        "the batches did not overlap"
    );
    assert!(p.containers().is_empty());
}

#[test]
fn qualify_writes_a_record_only_when_every_batch_passed() {
    let p = busybox_project(
        &(batch("good", 0, "1m", &[JUNIT_OK], "") + &batch("bad", 0, "1m", &["exit 1"], "")),
        "",
    );
    let manifest = std::fs::read_to_string(p.project.path().join("cibox.yaml")).unwrap();
    let out = p.project.path().join("q");
    let qualify = |layer: &str| {
        p.project.write(
            "cibox.yaml",
            format!("{manifest}layers:\n  qualify: {{batches: [{layer}]}}\n"),
        );
        run(cibox(p.project.path())
            .args([
                "image",
                "qualify",
                &p.image.0,
                "--scope",
                &p.scope(),
                "--reports",
            ])
            .arg(&out))
    };
    let r = qualify("good");
    r.ok();
    let q: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("qualification.json")).unwrap())
            .unwrap();
    assert_eq!(q["image"], p.image.0.as_str());
    assert_eq!(q["batches"][0]["status"], "passed");
    assert!(q["lockset"].as_str().unwrap().starts_with("sha256:"));
    assert!(!q["id_semantics"].is_null());
    let r = qualify("good, bad");
    assert_eq!(r.code, 1);
    assert!(
        !out.join("qualification.json").exists(),
        "a failed qualification left a record"
    );
    run(cibox(p.project.path()).args(["image", "qualify", "latest"])).fails_with(3, "is a tag");
}

#[test]
fn github_actions_gets_summary_outputs_and_annotations() {
    let junit = "echo '<testsuite><testcase classname=\"m\" name=\"t1\" file=\"tests/test_m.py\" line=\"7\"><failure message=\"boom: 100%\"/></testcase></testsuite>' > $CIBOX_REPORTS/j.xml";
    let p = busybox_project(
        &(batch("ok", 0, "1m", &[JUNIT_OK], "") + &batch("red", 0, "1m", &[junit], "")),
        "",
    );
    let gh = tempfile::tempdir().unwrap();
    let (out, summary) = (gh.path().join("output"), gh.path().join("summary"));
    let r = run(p
        .batch_cmd(&["batch", "run", "ok", "red"])
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_OUTPUT", &out)
        .env("GITHUB_STEP_SUMMARY", &summary));
    assert_eq!(r.code, 1);
    let outputs = std::fs::read_to_string(&out).unwrap();
    assert!(
        outputs.contains("status=failed\n") && outputs.contains("failed_batches=red\n"),
        "{outputs}"
    );
    let s = std::fs::read_to_string(&summary).unwrap();
    assert!(
        s.contains("| red | failed |") && s.contains("cibox reproduce"),
        "{s}"
    );
    assert!(
        r.stdout.contains("::group::batch ok") && r.stdout.contains("::endgroup::"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("::error title=red%3A m%3A%3At1,file=tests/test_m.py,line=7::boom: 100%25"),
        "{}",
        r.stdout
    );
}

#[test]
fn gpus_of_a_running_cibox_container_are_never_leased() {
    let p = busybox_project(&batch("g", 2, "1m", &[JUNIT_OK], ""), "");
    let smi = FakeSmi::with_gpus(2);
    let locks = tempfile::tempdir().unwrap();
    // A container left running by a cibox that died: its lock died with it, its label
    // still names GPU 0, and the dead run's record is in the lock dir's runs/.
    let name = format!("cibox-bt-orphan-{}", nonce());
    let run_id = "0123456789abcdef";
    std::fs::create_dir_all(locks.path().join("runs")).unwrap();
    std::fs::write(
        locks.path().join(format!("runs/{run_id}.lock")),
        r#"{"project":"bt","scope":"orphans"}"#,
    )
    .unwrap();
    let out = std::process::Command::new("docker")
        .args([
            "run",
            "-d",
            "--name",
            &name,
            "--label",
            "org.cibox.owner=cibox",
            "--label",
            &format!("org.cibox.run={run_id}"),
            "--label",
        ])
        .arg(format!("org.cibox.gpus={}", uuid(0)))
        .args([&p.image.0, "sleep", "600"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut c = p.batch_cmd(&["batch", "run", "g", "--wait", "0s"]);
    smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", locks.path());
    let r = run(&mut c);
    // `gpu exec` and `gpu status` see it too; GPU 1 stays free.
    let cibox_on_fixture = |args: &[&str]| {
        let mut c = cibox(p.project.path());
        smi.apply(&mut c);
        c.env("CIBOX_GPU_LOCK_DIR", locks.path()).args(args);
        run(&mut c)
    };
    let exec = cibox_on_fixture(&[
        "gpu",
        "exec",
        "--devices",
        "0",
        "--wait",
        "0s",
        "--",
        "true",
    ]);
    let exec_other = cibox_on_fixture(&[
        "gpu",
        "exec",
        "--devices",
        "1",
        "--wait",
        "0s",
        "--",
        "true",
    ]);
    let status = cibox_on_fixture(&["gpu", "status"]);
    std::process::Command::new("docker")
        .args(["rm", "-f", &name])
        .output()
        .unwrap();
    exec.fails_with(4, &format!("GPU 0 used by running cibox container {name}"));
    exec_other.ok();
    assert!(status.stdout.contains(&name), "{}", status.stdout);
    assert_eq!(r.code, 4, "{}", r.stderr);
    let v = p.result("g");
    assert_eq!(v["status"], "capacity");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(&format!("GPU 0 used by running cibox container {name}")),
        "{v}"
    );
    assert!(p.containers().is_empty());
}

#[test]
fn reproduce_replays_a_recorded_failure_side_by_side() {
    let junit = "echo '<testsuite><testcase classname=\"m\" name=\"flaky\"><failure message=\"x\"/></testcase></testsuite>' > $CIBOX_REPORTS/j.xml";
    let p = busybox_project(
        &batch("red", 0, "1m", &[junit], "    fast_env: {QUICK: \"1\"}\n"),
        "",
    );
    let d = p.project.path();
    std::fs::remove_dir_all(d.join(".git")).unwrap();
    std::fs::write(d.join(".gitignore"), "reports/\ncibox-reproduce/\n").unwrap();
    git(d, &["init", "-q"]);
    git(d, &["add", "-A"]);
    git(d, &["commit", "-qm", "recorded"]);
    let sha = git(d, &["rev-parse", "HEAD"]);
    let r = p.run(&["batch", "run", "red", "--fast"]);
    assert_eq!(r.code, 1);
    let record = p.reports().join("red/result.json");
    let rec = p.result("red");
    assert_eq!(rec["source"]["sha"], sha.as_str());
    assert_eq!(rec["fast"], true);
    // Later commits do not matter: the replay uses the recorded one.
    std::fs::write(d.join("later.txt"), "x").unwrap();
    git(d, &["add", "-A"]);
    git(d, &["commit", "-qm", "later"]);
    let dry = run(cibox(d).args(["reproduce", "--dry-run"]).arg(&record));
    dry.ok();
    assert!(
        dry.stdout.contains(&format!("source:   {sha}")) && dry.stdout.contains("fast:     true"),
        "{}",
        dry.stdout
    );
    let r = run(cibox(d).arg("reproduce").arg(&record));
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    let rows = r.rows();
    assert!(
        rows.contains(&"status failed failed".to_string()),
        "{}",
        r.stdout
    );
    assert!(
        rows.contains(&"m::flaky failed failed".to_string()),
        "{}",
        r.stdout
    );
    let worktrees = git(d, &["worktree", "list"]);
    assert_eq!(
        worktrees.lines().count(),
        1,
        "worktree left behind: {worktrees}"
    );
    assert!(p.containers().is_empty());
}

#[test]
fn reproduce_replays_a_changed_test_file_from_changed_run() {
    // The batch `changed run` made is in no manifest: the record names its file, and
    // the replay makes it again from that commit's `changed.run`.
    let changed = "changed:\n  patterns: [\"tests/test_*.py\"]\n  run:\n    command: 'grep -q flaky \"$CIBOX_TEST_FILE\" && exit 1; true'\n    timeout: 1m\n    verdict: exit-code\n";
    let p = busybox_project(
        &format!("{}{changed}", batch("unit", 0, "1m", &[JUNIT_OK], "")),
        "",
    );
    let d = p.project.path();
    p.project.write("tests/test_a.py", "flaky\n");
    std::fs::remove_dir_all(d.join(".git")).unwrap();
    std::fs::write(d.join(".gitignore"), "reports/\ncibox-reproduce/\n").unwrap();
    git(d, &["init", "-q"]);
    git(d, &["add", "-A"]);
    git(d, &["commit", "-qm", "recorded"]);
    let matrix = serde_json::json!([{"test_file": "tests/test_a.py", "num_gpus": 0}]);
    let r = run(p
        .batch_cmd(&["changed", "run", "--matrix-env", "CIBOX_MATRIX"])
        .env("CIBOX_MATRIX", matrix.to_string()));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let rec = p.result("changed-1-test_a");
    assert_eq!(rec["changed_file"], "tests/test_a.py", "{rec}");
    let record = p.reports().join("changed-1-test_a/result.json");
    // A record is data from elsewhere: names that are not what cibox writes, or a file
    // the patterns do not match, replay nothing.
    let outside = data_dir();
    for (field, value, want) in [
        (
            "batch",
            serde_json::json!(outside.path().join("pwn")),
            "`batch` is not one cibox writes (a batch name)",
        ),
        (
            "run",
            serde_json::json!("../../x"),
            "`run` is not one cibox writes",
        ),
        (
            "changed_file",
            serde_json::json!("tests/../cibox.yaml"),
            "`changed_file` is not one cibox writes",
        ),
        (
            "changed_file",
            serde_json::json!("cibox.yaml"),
            "`cibox.yaml` is not a test file `changed.patterns` matches",
        ),
    ] {
        let mut forged = rec.clone();
        forged[field] = value;
        let path = d.join("forged.json");
        std::fs::write(&path, forged.to_string()).unwrap();
        run(cibox(d).arg("reproduce").arg(&path)).fails_with(2, want);
        assert!(!outside.path().join("pwn").exists());
    }
    let r = run(cibox(d).arg("reproduce").arg(&record));
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.rows().contains(&"status failed failed".to_string()),
        "{}",
        r.stdout
    );
    assert!(p.containers().is_empty());
}

#[test]
fn reproduce_refuses_an_unknown_commit_or_a_missing_image() {
    let p = busybox_project(&batch("b", 0, "1m", &[JUNIT_OK], ""), "");
    let d = p.project.path();
    std::fs::remove_dir_all(d.join(".git")).unwrap();
    git(d, &["init", "-q"]);
    git(d, &["add", "cibox.yaml"]);
    git(d, &["commit", "-qm", "c"]);
    p.run(&["batch", "run", "b"]).ok();
    let record = p.reports().join("b/result.json");
    let mut v = p.result("b");
    v["source"]["sha"] = "0123456789abcdef0123456789abcdef01234567".into();
    std::fs::write(&record, v.to_string()).unwrap();
    run(cibox(d).arg("reproduce").arg(&record)).fails_with(2, "is not in");
    v["source"]["sha"] = git(d, &["rev-parse", "HEAD"]).into();
    v["image"] = format!("sha256:{}", "0".repeat(64)).into();
    std::fs::write(&record, v.to_string()).unwrap();
    let r = run(cibox(d).arg("reproduce").arg(&record));
    r.fails_with(3, "is not present in the local engine");
    assert!(r.stderr.contains("cibox image load --from"), "{}", r.stderr);
    std::fs::write(&record, "{\"not\": \"a record\"}").unwrap();
    run(cibox(d).arg("reproduce").arg(&record)).fails_with(2, "not a cibox run record");
    std::fs::write(&record, "this is not JSON").unwrap();
    run(cibox(d).arg("reproduce").arg(&record)).fails_with(2, "not a cibox run record");
    v["image"] = p.image.0.clone().into();
    v["schema"] = 7.into();
    std::fs::write(&record, v.to_string()).unwrap();
    run(cibox(d).arg("reproduce").arg(&record))
        .fails_with(2, "schema 7 is not one this cibox reads");
    v["schema"] = 1.into();
    v["batch"] = "vanished".into();
    std::fs::write(&record, v.to_string()).unwrap();
    run(cibox(d).arg("reproduce").arg(&record)).fails_with(2, "batch vanished is not in");
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

#[test]
fn a_batch_gets_the_host_settings_real_gpu_tests_need() {
    // Model weights in a host folder, read-only; NCCL's host IPC, memlock and SYS_NICE;
    // root in the container, still without other capabilities.
    let weights = data_dir();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(weights.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(weights.path().join("hello.txt"), "weights").unwrap();
    std::fs::set_permissions(
        weights.path().join("hello.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let host_ipc = std::fs::read_link("/proc/self/ns/ipc")
        .unwrap()
        .display()
        .to_string();
    let checks = [
        "test \"$(cat /models/hello.txt)\" = weights",
        "! touch /models/x 2>/dev/null",
        "test \"$(id -u)\" = 0",
        // IPC_LOCK (bit 14) and SYS_NICE (bit 23), nothing else.
        "grep -q '^CapEff:[[:space:]]*0000000000804000$' /proc/self/status",
        "grep -q '^NoNewPrivs:[[:space:]]*1$' /proc/self/status",
        // (`unlimited`, what NCCL wants, needs an engine allowed to raise its own
        // limit; this one's hard memlock limit is 8 MiB.)
        "test \"$(ulimit -l)\" = 4096",
        // Soft equal to hard: this engine's exec sometimes starts a process with the
        // soft nofile limit raised to the hard one (seen 2 runs in 12).
        "n=$(ulimit -n); echo \"nofile $n\"; test \"$n\" = 2048",
        "i=$(readlink /proc/self/ns/ipc); echo \"ipc $i host $HOST_IPC\"; test \"$i\" = \"$HOST_IPC\"",
        JUNIT_OK,
    ];
    let container = format!(
        "    container:\n      mounts: [\"{}:/models\"]\n      ipc: host\n      ulimits: {{memlock: 4194304, nofile: {{soft: 2048, hard: 2048}}}}\n      cap_add: [IPC_LOCK, SYS_NICE]\n      user: root\n      pass_env: [HOST_IPC]\n",
        weights.path().display()
    );
    let p = busybox_project(&batch("nccl", 0, "1m", &checks, &container), "");
    let r = run(p
        .batch_cmd(&["batch", "run", "nccl"])
        .env("HOST_IPC", &host_ipc));
    r.ok();
    let v = p.result("nccl");
    let loose = &v["loosened"];
    assert_eq!(loose["ipc"], "host", "{v}");
    assert_eq!(loose["user"], "root", "{v}");
    assert_eq!(
        loose["cap_add"],
        serde_json::json!(["IPC_LOCK", "SYS_NICE"])
    );
    assert_eq!(loose["ulimits"]["memlock"]["soft"], 4194304);
    assert_eq!(loose["mounts"][0]["target"], "/models");
}

#[test]
fn a_mount_that_is_missing_or_leads_home_starts_nothing() {
    let dir = data_dir();
    let missing = dir.path().join("no-such-folder");
    let home_link = dir.path().join("models");
    std::os::unix::fs::symlink("/root", &home_link).unwrap();
    for (source, want) in [
        (missing.clone(), "No such file or directory".to_string()),
        (
            home_link.clone(),
            "(resolves to /root) is in a home folder".to_string(),
        ),
    ] {
        let extra = format!("  mounts: [\"{}:/models\"]\n", source.display());
        let p = busybox_project(&batch("m", 0, "1m", &[JUNIT_OK], ""), &extra);
        let r = p.run(&["batch", "run", "m"]);
        r.fails_with(2, "cibox.yaml:9:12: batches.m.container.mounts: source");
        assert!(r.stderr.contains(&want), "{}", r.stderr);
        assert!(p.containers().is_empty(), "no container was made");
        assert!(!p.reports().join("m").exists(), "no report was made");
    }
}

#[test]
fn a_mount_that_could_be_swapped_or_shows_the_run_starts_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let p = busybox_project(&batch("m", 0, "1m", &[JUNIT_OK], ""), "");
    let d = p.project.path();
    // A folder anyone may write (not sticky): the models inside could be swapped for a
    // link to anywhere between the check and the mount.
    let open = data_dir();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::create_dir(open.path().join("models")).unwrap();
    // A checkout outside /tmp (mounts from /tmp are refused anyway).
    let data = data_dir();
    let checkout = data.path().join("checkout");
    let inner = checkout.join("sub");
    std::fs::create_dir_all(&inner).unwrap();
    for (source, checkout, want) in [
        (
            open.path().join("models"),
            d,
            "(mode 777), which others may write",
        ),
        (
            checkout.clone(),
            checkout.as_path(),
            "is the checkout under test",
        ),
        (
            data.path().to_path_buf(),
            checkout.as_path(),
            "holds the checkout under test",
        ),
        (
            inner.clone(),
            checkout.as_path(),
            "is inside the checkout under test",
        ),
    ] {
        std::fs::write(
            d.join("cibox.yaml"),
            std::fs::read_to_string(d.join("cibox.yaml"))
                .unwrap()
                .lines()
                .filter(|l| !l.starts_with("  mounts:"))
                .map(|l| {
                    if l == "container:" {
                        format!("container:\n  mounts: [\"{}:/models\"]", source.display())
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n"),
        )
        .unwrap();
        let r = p.run(&[
            "batch",
            "run",
            "m",
            "--source",
            &checkout.display().to_string(),
        ]);
        r.fails_with(2, "batches.m.container.mounts: source");
        assert!(r.stderr.contains(want), "{want}: {}", r.stderr);
        assert!(p.containers().is_empty(), "no container was made");
        assert!(!p.reports().join("m").exists(), "no report was made");
    }
}

/// Gives `uid` rwx on `dir` through a POSIX access ACL (what `setfacl -m u:UID:rwx`
/// writes), leaving the owner root and the mode's group bits as the mask.
fn grant_acl_write(dir: &std::path::Path, uid: u32) {
    // Version 2, then (tag, perm, id): user_obj, user, group_obj, mask, other.
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, u32::MAX),
        (0x02, 7, uid),
        (0x04, 5, u32::MAX),
        (0x10, 7, u32::MAX),
        (0x20, 5, u32::MAX),
    ] {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let rc = unsafe {
        nix::libc::setxattr(
            path.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            acl.as_ptr().cast(),
            acl.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setting an ACL on {} (the filesystem must support POSIX ACLs): {}",
        dir.display(),
        std::io::Error::last_os_error()
    );
}

#[test]
fn a_mount_reached_through_a_folder_others_may_write_by_acl_or_owned_by_the_runner_starts_nothing()
{
    let p = busybox_project(&batch("m", 0, "1m", &[JUNIT_OK], ""), "");
    // Root's folder, mode 775 root:root, but an ACL lets uid 65534 write it: they could
    // swap `models` for a link to /etc between the check and the mount.
    let acl = data_dir();
    std::fs::create_dir(acl.path().join("models")).unwrap();
    grant_acl_write(acl.path(), 65534);
    // A GitHub runner's folder, found by its `.runner` file, whatever its work folder
    // is called.
    let runner = data_dir();
    std::fs::write(runner.path().join(".runner"), "{}").unwrap();
    std::fs::write(runner.path().join(".credentials"), "secret").unwrap();
    let workspace = runner.path().join("work/repo");
    std::fs::create_dir_all(&workspace).unwrap();
    for (source, want) in [
        (acl.path().join("models"), "which others may write"),
        (
            runner.path().to_path_buf(),
            "a folder of the CI runner (its credentials",
        ),
        (
            runner.path().join("work"),
            "a folder of the CI runner (its credentials",
        ),
    ] {
        let extra = format!("  mounts: [\"{}:/models\"]\n", source.display());
        let manifest = std::fs::read_to_string(p.project.path().join("cibox.yaml"))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with("  mounts:"))
            .map(|l| {
                if l == "container:" {
                    format!("container:\n{}", extra.trim_end())
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        p.project.write("cibox.yaml", manifest);
        let r = run(p
            .batch_cmd(&["batch", "run", "m"])
            .env("RUNNER_WORKSPACE", &workspace));
        r.fails_with(2, "batches.m.container.mounts: source");
        assert!(r.stderr.contains(want), "{want}: {}", r.stderr);
        assert!(p.containers().is_empty(), "no container was made");
    }
}

#[test]
fn a_mount_is_what_was_checked_and_read_only_all_the_way_down() {
    // A mount named through a link is mounted as the folder the check resolved; a mount
    // below it is read-only too, or, on an engine that cannot do that, refused.
    let data = data_dir();
    let weights = data.path().join("weights");
    let below = weights.join("nfs");
    std::fs::create_dir_all(&below).unwrap();
    std::fs::write(weights.join("w.txt"), "w").unwrap();
    let link = data.path().join("current");
    std::os::unix::fs::symlink(&weights, &link).unwrap();
    let extra = format!("  mounts: [\"{}:/weights\"]\n", link.display());
    let p = busybox_project(
        &batch(
            "m",
            0,
            "1m",
            &[
                "test \"$(cat /weights/w.txt)\" = w",
                "! touch /weights/x 2>/dev/null",
                "! touch /weights/nfs/x 2>/dev/null",
                JUNIT_OK,
            ],
            "",
        ),
        &extra,
    );
    p.run(&["batch", "run", "m"]).ok();
    let v = p.result("m");
    assert_eq!(
        v["loosened"]["mounts"][0]["resolved"],
        weights.canonicalize().unwrap().display().to_string(),
        "{v}"
    );
    let status = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "cibox-test",
            &below.display().to_string(),
        ])
        .status()
        .unwrap();
    assert!(
        status.success(),
        "mount -t tmpfs needs root (CI runs as root)"
    );
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(below.clone());
    let api = Command::new("docker")
        .args(["version", "--format", "{{.Server.APIVersion}}"])
        .output()
        .unwrap();
    let api = String::from_utf8_lossy(&api.stdout).trim().to_string();
    let (major, minor) = api.split_once('.').unwrap();
    let recursive = (major.parse::<u32>().unwrap(), minor.parse::<u32>().unwrap()) >= (1, 44);
    let r = p.run(&["batch", "run", "m"]);
    if recursive {
        // The tmpfs below is writable on the host, read-only in the batch.
        r.ok();
    } else {
        r.fails_with(2, "batches.m.container.mounts: source");
        assert!(
            r.stderr.contains(&format!(
                "holds another mount, {}",
                below.canonicalize().unwrap().display()
            )) && r.stderr.contains(&format!("this engine (API {api})")),
            "{}",
            r.stderr
        );
        assert!(p.containers().is_empty(), "no container was made");
    }
}

#[test]
fn changed_test_files_run_in_containers_with_their_gpu_counts() {
    // The changed-tests job: each file a batch of its own, named in the container by
    // $CIBOX_TEST_FILE, never pasted into a shell.
    let command =
        format!("test -f \"$CIBOX_TEST_FILE\" && echo \"ran $CIBOX_TEST_FILE\" && {JUNIT_OK}");
    let changed = format!(
        "changed:\n  patterns: [\"tests/**/test_*.py\"]\n  run:\n    command: {}\n    timeout: 1m\n",
        serde_json::to_string(&command).unwrap()
    );
    let p = busybox_project(
        &format!("{}{changed}", batch("unit", 0, "1m", &[JUNIT_OK], "")),
        "",
    );
    let odd = "tests/test_$(touch pwned) `id`.py";
    p.project.write("tests/test_a.py", "NUM_GPUS = 0\n");
    p.project.write(odd, "NUM_GPUS = 0\n");
    std::os::unix::fs::symlink("/etc/hostname", p.project.path().join("tests/test_link.py"))
        .unwrap();
    let matrix = serde_json::json!({"include": [
        {"test_file": "tests/test_a.py", "num_gpus": 0},
        {"test_file": odd, "num_gpus": 0},
    ]})
    .to_string();
    let r = run(p
        .batch_cmd(&["changed", "run", "--matrix-env", "CIBOX_MATRIX"])
        .env("CIBOX_MATRIX", &matrix));
    r.ok();
    assert!(r.stdout.contains("ran tests/test_a.py"), "{}", r.stdout);
    assert!(r.stdout.contains(&format!("ran {odd}")), "{}", r.stdout);
    assert!(!p.project.path().join("pwned").exists());
    let v = p.result("changed-2-test___touch_pwned___id_");
    assert_eq!(v["status"], "passed", "{v}");
    assert_eq!(v["env"]["CIBOX_TEST_FILE"], odd);
    assert_eq!(v["gpu_count"], 0);
    // Bad input starts nothing: a file the patterns do not match, one written another
    // way, twice, or missing, a missing variable.
    for (matrix, want) in [
        (
            serde_json::json!([{"test_file": "tests/./test_a.py", "num_gpus": 0}]),
            "`tests/./test_a.py` is not a test file `changed.patterns` matches",
        ),
        (
            serde_json::json!([{"test_file": "tests//test_a.py", "num_gpus": 0}]),
            "`tests//test_a.py` is not a test file",
        ),
        (
            serde_json::json!([
                {"test_file": "tests/test_a.py", "num_gpus": 0},
                {"test_file": "tests/test_a.py", "num_gpus": 1},
            ]),
            "`tests/test_a.py` is listed twice",
        ),
        (
            serde_json::json!([{"test_file": "tests/test_gone.py", "num_gpus": 0}]),
            "test file `tests/test_gone.py` is not a file in",
        ),
        (
            serde_json::json!([{"test_file": "tests/test_link.py", "num_gpus": 0}]),
            "test file `tests/test_link.py` is a link in",
        ),
    ] {
        run(p
            .batch_cmd(&["changed", "run", "--matrix-env", "CIBOX_MATRIX"])
            .env("CIBOX_MATRIX", matrix.to_string()))
        .fails_with(2, want);
    }
    let outside = serde_json::json!([{"test_file": "../etc/passwd", "num_gpus": 0}]).to_string();
    run(p
        .batch_cmd(&["changed", "run", "--matrix-env", "CIBOX_MATRIX"])
        .env("CIBOX_MATRIX", &outside))
    .fails_with(
        2,
        "`../etc/passwd` is not a test file `changed.patterns` matches",
    );
    run(p
        .batch_cmd(&["changed", "run", "--matrix-env", "NO_SUCH_VAR"])
        .env_remove("NO_SUCH_VAR"))
    .fails_with(2, "--matrix-env NO_SUCH_VAR: the variable is not set");
    assert!(p.containers().is_empty());
}

#[test]
fn script_tests_are_judged_by_exit_code_one_case_per_step() {
    let steps = [
        "echo one",
        "sleep 1; echo two",
        "echo three; exit 3",
        "echo never",
    ];
    let p = busybox_project(
        &format!(
            "{}{}",
            batch("scripts", 0, "1m", &steps, "    verdict: exit-code\n"),
            batch("clean", 0, "1m", &["echo fine"], "    verdict: exit-code\n"),
        ),
        "",
    );
    let r = p.run(&["batch", "run", "scripts", "clean"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let v = p.result("scripts");
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["tests"]["total"], 4, "{v}");
    assert_eq!(v["tests"]["passed"], 2, "{v}");
    assert_eq!(v["tests"]["failed"], 1, "{v}");
    assert_eq!(v["tests"]["skipped"], 1, "{v}");
    assert_eq!(
        v["failed_tests"],
        serde_json::json!(["scripts::step 3: echo three; exit 3"])
    );
    // The merged junit.xml carries the steps, the failing one with its output tail.
    let junit = std::fs::read_to_string(p.reports().join("junit.xml")).unwrap();
    assert!(junit.contains("step 2: sleep 1; echo two"), "{junit}");
    assert!(junit.contains("three"), "{junit}");
    // Without a JUnit file and without allow_empty, a passing script batch passes.
    let clean = p.result("clean");
    assert_eq!(clean["status"], "passed", "{clean}");
    assert_eq!(clean["tests"]["total"], 1, "{clean}");
}

#[test]
fn a_step_is_judged_by_its_own_status_and_its_output_need_not_end_a_line() {
    // Output without a final newline does not hide the next step's announcement; a
    // failure on the left of `&&` fails its step though `set -e` overlooks it.
    let p = busybox_project(
        &format!(
            "{}{}",
            batch(
                "ok",
                0,
                "1m",
                &[
                    "printf 'warming cache... ok' >&2",
                    "printf 'partial'",
                    "echo second"
                ],
                "    verdict: exit-code\n",
            ),
            batch(
                "and",
                0,
                "1m",
                &["sh -c 'exit 3' && echo 'unit tests ok'", "echo lint ok"],
                "    verdict: exit-code\n",
            ),
        ),
        "",
    );
    let r = p.run(&["batch", "run", "ok", "and"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let ok = p.result("ok");
    assert_eq!(ok["status"], "passed", "{ok}");
    assert_eq!(ok["tests"]["passed"], 3, "{ok}");
    let and = p.result("and");
    assert_eq!(and["status"], "failed", "{and}");
    assert_eq!(and["container_exit_code"], 3, "{and}");
    assert_eq!(
        and["failed_tests"],
        serde_json::json!(["and::step 1: sh -c 'exit 3' && echo 'unit tests ok'"])
    );
}

#[test]
fn a_script_batch_that_ends_early_with_success_fails_the_steps_it_skipped() {
    // `exec` replaces the container's script: the steps after it never run, and the
    // batch's exit status (0) does not make them pass.
    let p = busybox_project(
        &batch(
            "early",
            0,
            "1m",
            &["echo one", "exec sh -c true", "echo never"],
            "    verdict: exit-code\n",
        ),
        "",
    );
    let r = p.run(&["batch", "run", "early"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let v = p.result("early");
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["tests"]["passed"], 2, "{v}");
    assert_eq!(
        v["failed_tests"],
        serde_json::json!(["early::step 3: echo never"])
    );
    let junit = std::fs::read_to_string(p.reports().join("junit.xml")).unwrap();
    assert!(
        junit.contains("did not run: the batch exited 0 before this step"),
        "{junit}"
    );
}

#[test]
fn batches_run_in_their_named_images_each_verified_by_its_own_locks() {
    let p = busybox_project(
        &format!(
            "{}{}",
            batch("a", 0, "1m", &["! test -e /which-second", JUNIT_OK], ""),
            // Given its image below, once the manifest has it.
            batch("b", 0, "1m", &["test -e /which-second", JUNIT_OK], ""),
        ),
        "",
    );
    // A second image on top of the first, with lock files of its own.
    p.project.write(
        "image2/Dockerfile",
        format!("FROM {}\nCOPY marker /which-second\n", p.image.0),
    );
    p.project.write("image2/marker", nonce());
    let manifest = std::fs::read_to_string(p.project.path().join("cibox.yaml")).unwrap();
    let named = manifest
        .replacen("image:\n", "images:\n  default:\n", 1)
        .replacen(
            "container:\n",
            "  second:\n    locks: [\"image2/*\"]\n    dockerfile: image2/Dockerfile\ncontainer:\n",
            1,
        );
    let named = named
        .replace(
            "\n  locks: [\"image/Dockerfile\", \"image/nonce\"]",
            "\n    locks: [\"image/Dockerfile\", \"image/nonce\"]",
        )
        .replace(
            "\n  dockerfile: image/Dockerfile",
            "\n    dockerfile: image/Dockerfile",
        )
        .replace("\n  b:\n", "\n  b:\n    image: second\n");
    p.project.write("cibox.yaml", &named);
    let r = {
        let _store = image_store_lock(false);
        p.project.cibox(&["image", "build", "--name", "second"])
    };
    r.ok();
    let second = ImageGuard(r.stdout.trim().to_string());
    let run_both = |extra: &[&str]| {
        let mut c = cibox(p.project.path());
        c.args(["batch", "run", "a", "b", "--source"])
            .arg(p.project.path())
            .arg("--reports")
            .arg(p.reports())
            .args(["--scope", &p.scope()])
            .args(extra)
            .env("CIBOX_IMAGE_DEFAULT", &p.image.0)
            .env("CIBOX_IMAGE_SECOND", &second.0);
        run(&mut c)
    };
    run_both(&[]).ok();
    let (a, b) = (p.result("a"), p.result("b"));
    assert_eq!(a["image"], p.image.0.as_str());
    assert_eq!(b["image"], second.0.as_str());
    assert_ne!(a["lockset"], b["lockset"], "each image has its own lockset");
    // One --image for a run of two images is ambiguous: refused, nothing started.
    run_both(&["--image", &second.0]).fails_with(2, "uses the images default, second");
    // An image built from other locks than its own is refused before anything runs.
    p.project.write("image2/marker", "changed");
    let r = run_both(&[]);
    r.fails_with(3, "was built from different lock files");
    assert!(p.containers().is_empty());
}
