//! How a batch is judged: a passing batch's record and reports, failing steps and test
//! cases, batches without tests, and script batches judged by exit code, step by step.

use super::batch;
use crate::common::*;

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
    assert_eq!(v["gpu_wait_s"], 0.0, "a CPU batch waits for no GPU");
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
    // The closing lines name it, as nextest's do.
    let closing: Vec<&str> = r
        .stderr
        .lines()
        .skip_while(|l| !l.starts_with("cibox: summary ["))
        .collect();
    assert!(
        closing[0].contains("1 batch run: 1 failed; 2 tests: 0 passed, 1 failed"),
        "{}",
        r.stderr
    );
    assert!(
        closing
            .iter()
            .any(|l| l.contains("FAIL [") && l.ends_with("tf m::t1")),
        "{}",
        r.stderr
    );
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
fn output_keeps_its_order_and_a_failing_step_keeps_only_its_own() {
    // Announcements (cibox's), stdout and stderr of the steps, in the order printed:
    // one stream, so a step's output never lands after the next step's announcement.
    let steps = [
        "echo one-out; echo one-err >&2; echo one-more",
        "echo two-out; echo two-err >&2; exit 4",
    ];
    let p = busybox_project(
        &batch("ordered", 0, "1m", &steps, "    verdict: exit-code\n"),
        "",
    );
    for _ in 0..3 {
        let r = p.run(&["batch", "run", "ordered"]);
        assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
        let log = std::fs::read_to_string(p.reports().join("ordered/log.txt")).unwrap();
        let at = |needle: &str| {
            log.find(needle)
                .unwrap_or_else(|| panic!("`{needle}` missing from log.txt:\n{log}"))
        };
        let order = [
            "cibox run: echo one-out",
            "one-out",
            "one-err",
            "one-more",
            "cibox run: echo two-out",
            "two-out",
            "two-err",
        ];
        for pair in order.windows(2) {
            assert!(
                at(pair[0]) < at(pair[1]),
                "`{}` came after `{}`:\n{log}",
                pair[0],
                pair[1]
            );
        }
        // The terminal shows the same order.
        let shown =
            r.stdout.find("one-more").unwrap() < r.stdout.find("cibox run: echo two").unwrap();
        assert!(shown, "{}", r.stdout);
        let junit = std::fs::read_to_string(p.reports().join("junit.xml")).unwrap();
        let failing = junit
            .split("<testcase")
            .find(|c| c.contains("step 2"))
            .unwrap();
        assert!(
            failing.contains("two-out") && failing.contains("two-err"),
            "{failing}"
        );
        assert!(
            !failing.contains("one-"),
            "step 1's output in step 2's failure: {failing}"
        );
    }
}

#[test]
fn a_script_batch_that_never_began_counts_no_test() {
    // The project's source holds busybox (2 MB): it cannot be copied into a 1 MB /work.
    let p = busybox_project(
        &batch(
            "tiny",
            0,
            "1m",
            &["echo one", "echo two"],
            "    verdict: exit-code\n    container: {disk: 1m}\n",
        ),
        "",
    );
    let r = p.run(&["batch", "run", "tiny"]);
    assert_eq!(r.code, 5, "{}{}", r.stdout, r.stderr);
    let v = p.result("tiny");
    assert_eq!(v["status"], "infra_error", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("could not copy the source"),
        "{v}"
    );
    // Its steps never began: they are no skipped tests.
    assert_eq!(v["tests"]["total"], 0, "{v}");
    // The terminal says so rather than counting tests it never had.
    assert!(r.stderr.contains("(never ran)"), "{}", r.stderr);
    assert!(!r.stderr.contains("(0 tests:"), "{}", r.stderr);
}

#[test]
fn a_verdict_s_colour_reaches_the_terminal_not_as_escaped_text() {
    // tmux, or CLICOLOR_FORCE: the status word is painted, and the paint is not quoted
    // as if it were a value from the batch (`\u{1b}[1;32mpassed\u{1b}[0m`).
    let p = busybox_project(&batch("ok", 0, "1m", &[JUNIT_OK], ""), "");
    let r = run(p
        .batch_cmd(&["batch", "run", "ok"])
        .env("CLICOLOR_FORCE", "1"));
    r.ok();
    assert!(
        r.stderr
            .contains("cibox: batch ok: \u{1b}[1m\u{1b}[32mpassed\u{1b}[0m (1 test: 1 passed,"),
        "{:?}",
        r.stderr
    );
    assert!(!r.stderr.contains("\\u{1b}"), "{:?}", r.stderr);
}
