//! A run shaped by time (issue 36): retries and flaky batches, the stop at the first
//! failure, soft failures, partitions by expected time and the timings that feed them.

use super::*;

/// A step that fails its one test on the first attempt and passes it on any later one.
const FAILS_ONCE: &str = "if [ \"$CIBOX_ATTEMPT\" = 1 ]; then echo '<testsuite><testcase classname=\"t\" name=\"ok\"><failure message=\"boom on attempt 1\"/></testcase></testsuite>' > $CIBOX_REPORTS/junit.xml; else echo '<testsuite><testcase classname=\"t\" name=\"ok\"/></testsuite>' > $CIBOX_REPORTS/junit.xml; fi";

/// A step whose one test always fails.
const FAILS: &str = "echo '<testsuite><testcase classname=\"t\" name=\"bad\"><failure message=\"always\"/></testcase></testsuite>' > $CIBOX_REPORTS/junit.xml";

#[test]
fn a_batch_that_passes_on_its_second_attempt_is_flaky_never_simply_green() {
    let p = busybox_project(
        &batch("shaky", 0, "1m", &[FAILS_ONCE], "    retries: 2\n"),
        "",
    );
    let r = p.run(&["batch", "run", "shaky"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let v = p.result("shaky");
    assert_eq!(v["status"], "passed", "{v}");
    assert_eq!(v["flaky"], true, "{v}");
    assert_eq!(v["attempts"], 2, "{v}");
    assert_eq!(v["earlier_attempts"][0]["status"], "failed", "{v}");
    assert_eq!(v["earlier_attempts"][0]["failed_tests"][0], "t::ok", "{v}");
    // The first attempt's files are set aside, with its own record.
    let first = p.reports().join("shaky/attempt-1");
    let r1: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(first.join("result.json")).unwrap()).unwrap();
    assert_eq!(r1["status"], "failed", "{r1}");
    assert!(first.join("log.txt").is_file());
    assert!(first.join("junit.xml").is_file());
    assert!(p.reports().join("shaky/log.txt").is_file());
    // Said as flaky on the terminal, in the summary and in JUnit (a flaky run of the
    // test, as nextest writes it).
    assert!(r.stderr.contains("attempt 1 of 3 failed"), "{}", r.stderr);
    assert!(
        r.stderr.contains("running it again (attempt 2)"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("batch shaky: flaky (passed on attempt 2; attempt 1 failed)"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("FLAKY"), "{}", r.stderr);
    let summary = std::fs::read_to_string(p.reports().join("summary.md")).unwrap();
    assert!(
        summary.contains("| shaky | flaky, passed on attempt 2 |"),
        "{summary}"
    );
    let junit = std::fs::read_to_string(p.reports().join("junit.xml")).unwrap();
    assert!(junit.contains("<flakyFailure"), "{junit}");
    assert!(junit.contains("boom on attempt 1"), "{junit}");
}

#[test]
fn retries_spent_leave_the_batch_failed_with_its_reruns() {
    let p = busybox_project(&batch("bad", 0, "1m", &[FAILS], "    retries: 1\n"), "");
    let r = p.run(&["batch", "run", "bad"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let v = p.result("bad");
    assert_eq!(
        (v["status"].as_str(), v["attempts"].as_u64()),
        (Some("failed"), Some(2)),
        "{v}"
    );
    assert_eq!(v["flaky"], false, "{v}");
    let junit = std::fs::read_to_string(p.reports().join("junit.xml")).unwrap();
    assert!(junit.contains("<rerunFailure"), "{junit}");
    // `--retries` wins over the manifest, both ways.
    let r = p.run(&["batch", "run", "bad", "--retries", "0"]);
    assert_eq!(r.code, 1);
    assert_eq!(p.result("bad")["attempts"], 1);
    let r = p.run(&["batch", "run", "bad", "--retries", "11"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("--retries 11: give 0 to 10"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_timeout_runs_again_only_when_its_retries_name_timeouts() {
    let p = busybox_project(
        &format!(
            "{}{}",
            batch("slow", 0, "2s", &["sleep 30"], "    retries: 2\n"),
            batch(
                "slow-again",
                0,
                "2s",
                &["sleep 30"],
                "    retries: {count: 1, on: [timeout]}\n"
            )
        ),
        "",
    );
    let r = p.run(&["batch", "run", "slow", "slow-again"]);
    assert_eq!(r.code, 124, "{}{}", r.stdout, r.stderr);
    assert_eq!(p.result("slow")["attempts"], 1);
    let v = p.result("slow-again");
    assert_eq!(
        (v["status"].as_str(), v["attempts"].as_u64()),
        (Some("timeout"), Some(2)),
        "{v}"
    );
}

#[test]
fn a_layer_that_stops_at_its_first_failure_records_the_rest_as_not_run() {
    let p = busybox_project(
        &format!(
            "{}{}{}{}",
            batch("soft", 0, "1m", &[FAILS], "    soft_fail: true\n"),
            batch("first", 0, "1m", &[FAILS], ""),
            batch("second", 0, "1m", &[JUNIT_OK], ""),
            batch("third", 0, "1m", &[JUNIT_OK], "")
        ),
        "layers:\n  l: {batches: [soft, first, second, third], fail_fast: true}\n  all: {batches: [soft, first, second, third]}\n",
    );
    let r = run(p
        .batch_cmd_bare(&["layer", "run", "l"])
        .args(["--image", &p.image.0, "--source"])
        .arg(p.project.path())
        .arg("--reports")
        .arg(p.reports())
        .args(["--scope", &p.scope()]));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    // A soft failure does not stop the layer; the first hard one does.
    assert_eq!(p.result("soft")["status"], "failed");
    assert_eq!(p.result("first")["status"], "failed");
    for b in ["second", "third"] {
        let v = p.result(b);
        assert_eq!(v["status"], "not_run", "{v}");
        assert_eq!(v["exit_code"], 0, "{v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("batch first failed first"),
            "{v}"
        );
    }
    assert!(r.stderr.contains("NOT RUN second, third"), "{}", r.stderr);
    let summary = std::fs::read_to_string(p.reports().join("summary.md")).unwrap();
    assert!(summary.contains("### Not run"), "{summary}");
    let junit = std::fs::read_to_string(p.reports().join("junit.xml")).unwrap();
    assert!(junit.contains("cibox: batch not_run"), "{junit}");
    // The same layer without fail_fast runs them all; `--fail-fast` stops it again.
    let all = |extra: &[&str]| {
        let mut c = p.batch_cmd_bare(&["layer", "run", "all"]);
        c.args(["--image", &p.image.0, "--source"])
            .arg(p.project.path())
            .arg("--reports")
            .arg(p.reports())
            .args(["--scope", &p.scope()])
            .args(extra);
        run(&mut c)
    };
    assert_eq!(all(&[]).code, 1);
    assert_eq!(p.result("third")["status"], "passed");
    assert_eq!(all(&["--fail-fast"]).code, 1);
    assert_eq!(p.result("third")["status"], "not_run");
}

#[test]
fn a_soft_failure_is_shown_and_fails_nothing() {
    let p = busybox_project(
        &format!(
            "{}{}",
            batch("experimental", 0, "1m", &[FAILS], "    soft_fail: true\n"),
            batch("unit", 0, "1m", &[JUNIT_OK], "")
        ),
        "",
    );
    let r = p.run(&["batch", "run", "experimental", "unit", "--json"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let out: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(out["status"], "passed", "{out}");
    let v = p.result("experimental");
    assert_eq!(
        (v["status"].as_str(), v["exit_code"].as_u64()),
        (Some("failed"), Some(1)),
        "{v}"
    );
    assert_eq!(v["soft_fail"], true, "{v}");
    assert!(
        r.stderr.contains("soft_fail: it does not fail the run"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("1 failed (1 soft_fail)"), "{}", r.stderr);
    // Beside a hard failure, the run fails for that one.
    let p2 = busybox_project(
        &format!(
            "{}{}",
            batch("experimental", 0, "1m", &[FAILS], "    soft_fail: true\n"),
            batch("unit", 0, "1m", &[FAILS], "")
        ),
        "",
    );
    assert_eq!(p2.run(&["batch", "run", "experimental", "unit"]).code, 1);
}

/// Six CPU batches of 8, 5, 4, 2, 1 and 1 minutes expected.
fn six_timed_batches() -> BusyboxProject {
    let mut batches = String::new();
    for (name, est) in [
        ("a", "8m"),
        ("b", "5m"),
        ("c", "4m"),
        ("d", "2m"),
        ("e", "1m"),
        ("f", "1m"),
    ] {
        batches.push_str(&batch(
            name,
            0,
            "1m",
            &[JUNIT_OK],
            &format!("    est_time: {est}\n"),
        ));
    }
    busybox_project(&batches, "layers:\n  all: {batches: all}\n")
}

fn listed(p: &BusyboxProject, args: &[&str]) -> serde_json::Value {
    let mut c = p.batch_cmd_bare(&["--json", "batch", "list"]);
    c.args(args);
    let r = run(&mut c);
    assert_eq!(r.code, 0, "{}", r.stderr);
    serde_json::from_str(&r.stdout).unwrap()
}

#[test]
fn partitions_split_by_expected_time_and_every_batch_lands_in_one() {
    let p = six_timed_batches();
    // LPT: a (8m) | b (5m); c (4m) onto the lighter, b's (9m); d (2m) onto a's (10m);
    // e (1m) onto b's (10m); f (1m) onto the first of the two equal: a's (11m).
    let one = listed(&p, &["--layer", "all", "--partition", "1/2"]);
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["batches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&one), ["a", "d", "f"], "{one}");
    assert_eq!(one["parts"][0]["serial_s"], 660.0, "{one}");
    assert_eq!(one["parts"][1]["serial_s"], 600.0, "{one}");
    let two = listed(&p, &["--layer", "all", "--partition", "2/2"]);
    assert_eq!(names(&two), ["b", "c", "e"], "{two}");
    // The table shows the part's expected times and every part.
    let mut c = p.batch_cmd_bare(&["batch", "list", "--layer", "all", "--partition", "2/2"]);
    let text = run(&mut c).stdout;
    assert!(text.contains("EXPECTED"), "{text}");
    assert!(text.contains("5m 00s (est_time)"), "{text}");
    assert!(text.contains("2/2 <"), "{text}");
    // A run of part 2 runs exactly its batches, and records how long they took.
    let r = run(p
        .batch_cmd_bare(&["layer", "run", "all", "--partition", "2/2"])
        .args(["--image", &p.image.0, "--source"])
        .arg(p.project.path())
        .arg("--reports")
        .arg(p.reports())
        .args(["--scope", &p.scope()]));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("partition 2/2: 3 of 6 batches"),
        "{}",
        r.stderr
    );
    for b in ["b", "c", "e"] {
        assert_eq!(p.result(b)["status"], "passed");
    }
    for b in ["a", "d", "f"] {
        assert!(!p.reports().join(b).exists(), "{b} ran");
    }
    let timings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.reports().join("timings.json")).unwrap())
            .unwrap();
    let recorded: Vec<&String> = timings["batches"].as_object().unwrap().keys().collect();
    assert_eq!(recorded, ["b", "c", "e"], "{timings}");
    assert!(timings["batches"]["b"]["seconds"].as_f64().unwrap() < 60.0);
    // Fed back, recorded times (seconds) win over est_time: b, c and e now weigh
    // almost nothing, so a (8m) stands alone.
    let t = p.reports().join("timings.json").display().to_string();
    let again = listed(
        &p,
        &["--layer", "all", "--partition", "1/2", "--timings", &t],
    );
    assert_eq!(names(&again), ["a"], "{again}");
    assert_eq!(again["batches"][0]["expected_from"], "est_time", "{again}");
    let other = listed(
        &p,
        &["--layer", "all", "--partition", "2/2", "--timings", &t],
    );
    assert_eq!(other["batches"][0]["expected_from"], "recorded", "{other}");
}

#[test]
fn an_empty_part_runs_nothing_and_passes_and_bad_splits_are_refused() {
    let p = busybox_project(&batch("only", 0, "1m", &[JUNIT_OK], ""), "");
    let r = p.run(&["batch", "run", "only", "--partition", "3/4"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("no batch falls to this part"),
        "{}",
        r.stderr
    );
    assert!(
        !p.reports().exists(),
        "an empty part makes no reports folder"
    );
    for (bad, why) in [
        ("5/4", "K must be 1 to N"),
        ("1/0", "N must be 1"),
        ("x", "no `/`"),
    ] {
        let r = p.run(&["batch", "run", "only", "--partition", bad]);
        assert_eq!(r.code, 2, "{bad}: {}", r.stderr);
        assert!(r.stderr.contains(why), "{bad}: {}", r.stderr);
    }
}

#[test]
fn a_hostile_timings_file_is_refused_before_anything_starts() {
    let p = busybox_project(&batch("only", 0, "1m", &[JUNIT_OK], ""), "");
    let bad = p.project.write(
        "timings.json",
        "{\"schema\": 1, \"project\": \"bt\", \"run\": \"x\", \"batches\": {\"only\": {\"seconds\": -5, \"gpus\": 0, \"status\": \"passed\"}}}",
    );
    let r = p.run(&["batch", "run", "only", "--timings", bad.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("timings.json: batch only: -5 seconds is no time a batch ran"),
        "{}",
        r.stderr
    );
    assert!(!p.reports().exists());
    let r = p.run(&["batch", "run", "only", "--timings", "/nonexistent/t.json"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("--timings /nonexistent/t.json"),
        "{}",
        r.stderr
    );
}
