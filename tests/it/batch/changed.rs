//! `reproduce` of recorded batches (changed-run ones included) and its refusals, and
//! changed test files run by `changed run` in containers of their own.

use super::batch;
use crate::common::*;

#[test]
fn reproduce_replays_a_recorded_failure_side_by_side() {
    let junit = "echo '<testsuite><testcase classname=\"m\" name=\"flaky\"><failure message=\"x\"/></testcase></testsuite>' > $CIBOX_REPORTS/j.xml";
    let p = busybox_project(
        &batch("red", 0, "1m", &[junit], "    fast_env: {QUICK: \"1\"}\n"),
        "",
    );
    let d = p.project.path();
    make_checkout(d);
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
    // Same host: what it ran on, side by side, and no warning.
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let kernel = kernel.trim();
    assert!(
        rows.contains(&format!("kernel {kernel} {kernel}")),
        "{}",
        r.stdout
    );
    assert!(!r.stderr.contains("other hardware"), "{}", r.stderr);
    // A record from another host: the replay warns and marks what differs.
    let mut elsewhere = rec.clone();
    elsewhere["hardware"]["kernel"] = "4.19.0-27-amd64".into();
    elsewhere["hardware"]["engine"] = "19.03.15".into();
    let other = d.join("elsewhere.json");
    std::fs::write(&other, elsewhere.to_string()).unwrap();
    let dry = run(cibox(d).args(["reproduce", "--dry-run"]).arg(&other));
    assert!(
        dry.ok().stdout.contains("recorded on: GPU model none; GPU memory none; driver none; CUDA none; kernel 4.19.0-27-amd64; engine 19.03.15"),
        "{}",
        dry.stdout
    );
    let r = run(cibox(d).arg("reproduce").arg(&other));
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    let warning = r
        .stderr
        .lines()
        .find(|l| l.starts_with("cibox: warning: replayed on other hardware than recorded: "))
        .unwrap_or_else(|| panic!("no warning:\n{}", r.stderr));
    assert!(
        warning.contains(&format!(
            "kernel 4.19.0-27-amd64 then, {kernel} now; engine 19.03.15 then, "
        )),
        "{warning}"
    );
    assert!(
        r.rows()
            .contains(&format!("kernel 4.19.0-27-amd64 {kernel} (differs)")),
        "{}",
        r.stdout
    );
    let r = run(cibox(d).args(["reproduce", "--json"]).arg(&other));
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["hardware_differs"][0]["what"], "kernel", "{v}");
    assert_eq!(
        v["hardware_differs"][0]["recorded"], "4.19.0-27-amd64",
        "{v}"
    );
    assert_eq!(v["replayed"]["status"], "failed", "{v}");
    assert_eq!(v["plan"]["commit"], sha.as_str(), "{v}");
    let worktrees = git(d, &["worktree", "list"]);
    assert_eq!(
        worktrees.lines().count(),
        1,
        "worktree left behind: {worktrees}"
    );
    assert!(p.containers().is_empty());
}

/// Issue 48: a dry run of a record whose commit has no manifest (or not the batch)
/// printed a plan, and the replay then failed: it refuses as the replay does.
#[test]
fn reproduce_dry_run_refuses_what_the_replay_would() {
    let p = busybox_project(&batch("green", 0, "1m", &["true"], ""), "");
    let d = p.project.path();
    make_checkout(d);
    p.run(&["batch", "run", "green"]);
    let rec = p.result("green");
    // A commit without the manifest, and one whose manifest lacks the batch.
    git(d, &["rm", "-q", "cibox.yaml"]);
    git(d, &["commit", "-qm", "no manifest"]);
    let bare = git(d, &["rev-parse", "HEAD"]);
    let manifest = git(d, &["show", "HEAD~1:cibox.yaml"]);
    std::fs::write(d.join("cibox.yaml"), manifest.replace("green", "blue")).unwrap();
    git(d, &["add", "-A"]);
    git(d, &["commit", "-qm", "renamed"]);
    let renamed = git(d, &["rev-parse", "HEAD"]);
    for (sha, why) in [
        (&bare, "cibox.yaml is not in commit"),
        (&renamed, "batch green is not in cibox.yaml at"),
    ] {
        let mut forged = rec.clone();
        forged["source"]["sha"] = sha.as_str().into();
        let path = d.join(format!("at-{sha}.json"));
        std::fs::write(&path, forged.to_string()).unwrap();
        let replay = run(cibox(d).arg("reproduce").arg(&path));
        let dry = run(cibox(d).args(["reproduce", "--dry-run"]).arg(&path));
        assert_ne!(replay.code, 0, "{}", replay.stderr);
        assert_eq!(
            (dry.code, dry.stderr.lines().last()),
            (replay.code, replay.stderr.lines().last()),
            "dry run:\n{}\nreplay:\n{}",
            dry.stderr,
            replay.stderr
        );
        dry.fails_with(replay.code, why);
    }
    let worktrees = git(d, &["worktree", "list"]);
    assert_eq!(worktrees.lines().count(), 1, "left behind: {worktrees}");
}

#[test]
fn reproduce_shows_a_forged_records_text_and_wants_a_full_commit() {
    let junit = "echo '<testsuite><testcase classname=\"m\" name=\"flaky\"><failure message=\"x\"/></testcase></testsuite>' > $CIBOX_REPORTS/j.xml";
    let p = busybox_project(&batch("red", 0, "1m", &[junit], ""), "");
    let d = p.project.path();
    make_checkout(d);
    assert_eq!(p.run(&["batch", "run", "red"]).code, 1);
    let rec = p.result("red");
    // A downloaded record is anyone's: its host, failing tests and GPU names carry a
    // title change (OSC 0), a clipboard write (OSC 52), an 8-bit CSI and an override.
    let evil = "x\u{1b}]0;pwned\u{7}\u{1b}]52;c;Y3VybCBldmls\u{7}\u{9b}2J\u{202e}y";
    let mut forged = rec.clone();
    forged["host"] = evil.into();
    forged["failed_tests"] = serde_json::json!([format!("m::{evil}")]);
    forged["hardware"]["gpus"] = serde_json::json!([{
        "index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "name": evil, "memory_mib": 1, "driver": evil, "cuda": evil,
        "compute_capability": "9.0",
    }]);
    let path = d.join("forged.json");
    std::fs::write(&path, forged.to_string()).unwrap();
    let raw = |text: &str| -> Vec<char> {
        text.chars()
            .filter(|c| *c != '\n' && (c.is_control() || ('\u{202a}'..='\u{202e}').contains(c)))
            .collect()
    };
    for args in [
        &["reproduce", "--dry-run"][..],
        &["reproduce"],
        &["reproduce", "--json"],
    ] {
        let r = run(cibox(d).args(args).arg(&path));
        assert!(
            r.code == 0 || r.code == 1,
            "{args:?}: {}\n{}",
            r.stdout,
            r.stderr
        );
        let found = raw(&format!("{}{}", r.stdout, r.stderr));
        assert!(found.is_empty(), "{args:?}: {found:?} in {:?}", r.stdout);
        if args.contains(&"--json") {
            let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
            assert_eq!(
                v["recorded"]["host"], evil,
                "the JSON says what the record says"
            );
        }
    }
    let r = run(cibox(d).arg("reproduce").arg(&path));
    assert!(
        r.stdout
            .contains("host        x\\u{1b}]0;pwned\\u{7}\\u{1b}]52;c;Y3VybCBldmls\\u{7}"),
        "shown as escapes: {}",
        r.stdout
    );
    // A commit by name (`HEAD`, a branch, an option) replays whatever it names now.
    for sha in [
        "HEAD",
        "main",
        "--upload-pack=touch /tmp/x",
        &"A".repeat(40),
        "0123abc",
    ] {
        let mut forged = rec.clone();
        forged["source"]["sha"] = sha.into();
        std::fs::write(&path, forged.to_string()).unwrap();
        run(cibox(d).arg("reproduce").arg(&path)).fails_with(
            2,
            "`source.sha` is not one cibox writes (a full commit ID: 40 lowercase hex digits, 64 in a SHA-256 repository)",
        );
    }
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
    make_checkout(d);
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
        (
            "layer",
            serde_json::json!("x\n\u{1b}]0;title\u{7}source:   0000 (clean)"),
            "`layer` is not one cibox writes (a layer name)",
        ),
        (
            "image_name",
            serde_json::json!("\u{1b}[8mhidden"),
            "`image_name` is not one cibox writes (an image name)",
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
    // No remote: it says how to add one, not to fetch from an origin that is not there.
    let r = run(cibox(d).arg("reproduce").arg(&record));
    r.fails_with(2, "is not in");
    assert!(
        r.stderr.contains("this repository has no remote")
            && !r.stderr.contains("git fetch origin 0123"),
        "{}",
        r.stderr
    );
    git(
        d,
        &["remote", "add", "upstream", "https://example.invalid/p.git"],
    );
    let r = run(cibox(d).arg("reproduce").arg(&record));
    assert!(
        r.stderr
            .contains("fetch it first: git fetch upstream 0123456789abcdef"),
        "{}",
        r.stderr
    );
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
fn a_test_lists_rows_from_changed_run_each_entry_with_its_own_arguments() {
    // slime's test_qwen3_4B_ckpt.py: one file, entries with their own arguments. What
    // `changed` prints goes to `changed run` as it is, and each entry runs its batch.
    let step = format!("echo \"ran $CIBOX_TEST_FILE with $CIBOX_TEST_ARGS\" && {JUNIT_OK}");
    let family = format!(
        "  ckpt:\n    gpus: 0\n    timeout: 1m\n    run: [{}]\n    each:\n      - {{file: tests/test_ckpt.py, args: --save}}\n      - {{file: tests/test_ckpt.py, name: ckpt-load, args: --load}}\n",
        serde_json::to_string(&step).unwrap()
    );
    let p = busybox_project(&family, "changed:\n  patterns: [\"tests/test_*.py\"]\n");
    let d = p.project.path();
    std::fs::remove_dir(d.join(".git")).unwrap();
    p.project.write("tests/test_ckpt.py", "NUM_GPUS = 0\n");
    git(d, &["init", "-q", "-b", "main"]);
    git(d, &["add", "-A"]);
    git(d, &["commit", "-qm", "base"]);
    let base = git(d, &["rev-parse", "HEAD"]);
    p.project
        .write("tests/test_ckpt.py", "NUM_GPUS = 0\n# changed\n");
    git(d, &["commit", "-qam", "change"]);
    let r = run(cibox(d).args(["changed", "--base", &base]));
    r.ok();
    let matrix = r.stdout.trim().to_string();
    let r = run(p
        .batch_cmd(&["changed", "run", "--matrix-env", "CIBOX_MATRIX"])
        .env("CIBOX_MATRIX", &matrix));
    r.ok();
    assert!(
        r.stdout.contains("ran tests/test_ckpt.py with --save"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("ran tests/test_ckpt.py with --load"),
        "{}",
        r.stdout
    );
    assert_eq!(p.result("ckpt-test_ckpt")["status"], "passed");
    assert_eq!(p.result("ckpt-load")["env"]["CIBOX_TEST_ARGS"], "--load");
}

/// A run whose `cibox.yaml` was never committed: `reproduce` names the uncommitted
/// manifest as the reason (it said only `cannot read manifest <tmp>/src/cibox.yaml`).
#[test]
fn reproduce_of_a_run_whose_manifest_was_not_committed_says_so() {
    let p = busybox_project(
        &batch("ok", 0, "1m", &["true"], "    allow_empty: true\n"),
        "",
    );
    let d = p.project.path();
    make_checkout(d);
    git(d, &["rm", "-q", "--cached", "cibox.yaml"]);
    git(d, &["commit", "-qm", "no manifest"]);
    p.run(&["batch", "run", "ok"]).ok();
    let record = p.reports().join("ok/result.json");
    assert_eq!(p.result("ok")["source"]["dirty"], true);
    let r = run(cibox(d).arg("reproduce").arg(&record));
    r.fails_with(2, "cibox.yaml is not in commit ");
    assert!(
        r.stderr.contains("the run's manifest was not committed (the record says the source had uncommitted changes); commit it"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("cannot read manifest"), "{}", r.stderr);
    let worktrees = git(d, &["worktree", "list"]);
    assert_eq!(
        worktrees.lines().count(),
        1,
        "worktree left behind: {worktrees}"
    );
}
