//! Issue 46, item 1: test lists a project's code declares (`collect:`), read at run time
//! in a disposable container of the family's image (never on the host), bounded in time
//! and output, becoming batches as `each:` entries do; and hostile lists refused with
//! one line, nothing left behind.

use std::path::Path;

use crate::common::*;

/// A family (`suite`, in a test of its own `other`) whose list `collector` prints.
fn collecting(collector: &str, extra: &str) -> String {
    format!(
        "  suite:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"test -f \\\"$CIBOX_TEST_FILE\\\"\"]\n    collect:\n      run: {collector:?}\n{extra}"
    )
}

/// The containers a collector of family `family` left (none, once cibox returned).
fn collectors_left(family: &str) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            &format!("label=org.cibox.collect={family}"),
            "--format",
            "{{.Names}}",
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Every path under `dir` (relative), to see that nothing was left there.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                todo.push(p.clone());
            }
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
        }
    }
    out.sort();
    out
}

#[test]
fn a_collected_list_becomes_batches_that_run_and_split_by_est_time() {
    let p = busybox_project(
        &collecting(
            "printf '%s\\n' '{\"file\": \"t/a.sh\", \"est_time\": 600}' '{\"file\": \"t/b.sh\", \"est_time\": 0, \"suite\": \"x\"}' '{\"file\": \"t/c.sh\", \"est_time\": 300, \"name\": \"c-own\"}' '{\"file\": \"t/d.sh\", \"est_time\": 290}'",
            "",
        )
        .replacen("  suite:", "  listed:", 1),
        "layers:\n  l: {batches: [listed]}\n",
    );
    for f in ["t/a.sh", "t/b.sh", "t/c.sh", "t/d.sh"] {
        p.project.write(f, "true\n");
    }
    let list = |args: &[&str]| {
        let r = run(p
            .batch_cmd_bare(&[&["--json", "batch", "list"][..], args].concat())
            .env("CIBOX_IMAGE", &p.image.0));
        r.ok();
        serde_json::from_str::<serde_json::Value>(r.stdout.trim()).unwrap()
    };
    let v = list(&["--layer", "l"]);
    let names: Vec<&str> = v["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["listed-a", "listed-b", "c-own", "listed-d"], "{v}");
    assert_eq!(v["batches"][1]["expected_s"], 0.0, "{v}");
    // Split by est_time as `each:` entries are: 600 alone, 300 + 290 + 0 together.
    let v = list(&["--layer", "l", "--partition", "1/2"]);
    let parts: Vec<f64> = v["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["serial_s"].as_f64().unwrap())
        .collect();
    assert_eq!(parts, [600.0, 590.0], "{v}");
    // Run through the engine, each entry a batch of its own.
    let r = run(&mut p.batch_cmd(&["--json", "layer", "run", "l"]));
    r.ok();
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["batches"].as_array().unwrap().len(), 4, "{v}");
    assert!(collectors_left("listed").is_empty());
}

#[test]
fn hostile_lists_are_refused_with_one_line_and_nothing_left_behind() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "yes '{}' | head -n 1000000",
            "",
            "the collector's output, printed 1000000 entries; a manifest holds at most 10000 batches",
        ),
        (
            "echo '['; yes '{\"file\": \"a.sh\"},' | head -n 20000; echo '{}]'",
            "",
            "more than 10000 entries; a manifest holds at most 10000 batches",
        ),
        (
            "printf '{\"file\": \"a.sh\", \"name\": \"a\\\\nb\"}\\n'",
            "",
            "line 1: name `a\\nb` is not plain text of one line",
        ),
        (
            "echo '{\"file\": \"a.sh\", \"name\": \"../b\"}'",
            "",
            "line 1: name `../b` is not a batch name",
        ),
        (
            "echo '{\"file\": \"../../etc/passwd\"}'",
            "",
            "line 1: file `../../etc/passwd` is not a path relative to the source",
        ),
        (
            "sleep 600",
            "      timeout: 2s\n",
            "the collector ran past its timeout, 2s: killed",
        ),
        (
            "yes '{\"file\": \"a.sh\"}'",
            "",
            "the collector printed more than 4 MiB, the most a list may take: killed",
        ),
        ("echo '{nope'", "", "line 1: not JSON"),
        (
            "echo '{\"file\": \"a.sh\", \"est_time\": -5}'",
            "",
            "line 1: est_time must be a number of seconds from 0 to 30 days (2592000), got -5",
        ),
        (
            "echo '{\"file\": \"a.sh\", \"est_time\": \"soon\"}'",
            "",
            "got \"soon\"",
        ),
        (
            "echo '{\"file\": \"a.sh\", \"gpus\": 2000}'",
            "",
            "line 1: gpus must be a whole number from 0 to 1024 (the most an entry may ask), got 2000",
        ),
        (
            "echo 'Traceback: boom' >&2; exit 3",
            "",
            "the collector exited with 3; its last words: `Traceback: boom`",
        ),
        (
            "echo '{\"file\": \"a.sh\", \"suite\": \"other\"}'",
            "      suite: mine\n",
            "the collector printed no entry of suite `mine`",
        ),
    ];
    let p = busybox_project(&collecting("true", ""), "");
    p.project.write("a.sh", "true\n");
    let manifest = std::fs::read_to_string(p.project.path().join("cibox.yaml")).unwrap();
    for (collector, extra, want) in cases {
        p.project.write(
            "cibox.yaml",
            manifest.replace(&collecting("true", ""), &collecting(collector, extra)),
        );
        let before = files(p.project.path());
        let r = run(p
            .batch_cmd_bare(&["batch", "list"])
            .env("CIBOX_IMAGE", &p.image.0));
        r.fails_with(2, want);
        r.fails_with(2, "cibox.yaml:");
        r.fails_with(2, "batches.suite.collect: ");
        assert_eq!(
            r.stderr.trim().lines().count(),
            1,
            "{collector}: {}",
            r.stderr
        );
        assert_eq!(files(p.project.path()), before, "{collector}");
        assert!(collectors_left("suite").is_empty(), "{collector}");
    }
    // The host policy's pool bounds an entry's GPUs.
    let p = p.with_policy("version: 1\ngpu: {pool: [0, 1]}\n");
    p.project.write(
        "cibox.yaml",
        manifest.replace(
            &collecting("true", ""),
            &collecting("echo '{\"file\": \"a.sh\", \"gpus\": 8}'", ""),
        ),
    );
    run(p
        .batch_cmd_bare(&["batch", "list"])
        .env("CIBOX_IMAGE", &p.image.0))
    .fails_with(
        2,
        "gpus must be a whole number from 0 to 2 (the GPU pool, 2 GPUs), got 8",
    );
    // Written out and printed by code at once: refused when read.
    p.project.write(
        "cibox.yaml",
        manifest.replace(
            &collecting("true", ""),
            &collecting("true", "    each: [{file: a.sh}]\n"),
        ),
    );
    run(&mut p.batch_cmd_bare(&["batch", "list"]))
        .fails_with(2, "not both");
}

#[test]
fn a_collector_cannot_reach_the_network_or_change_the_source() {
    let p = busybox_project(
        &collecting(
            "touch /src/x 2>/dev/null && exit 7; touch /x 2>/dev/null && exit 8; wget -q -T 2 -O- http://127.0.0.1:5000/v2/ >/dev/null 2>&1 && exit 9; [ \"$(id -u)\" != 0 ] || exit 10; echo '{\"file\": \"a.sh\"}'",
            "",
        ),
        "",
    );
    p.project.write("a.sh", "true\n");
    run(p
        .batch_cmd_bare(&["batch", "list"])
        .env("CIBOX_IMAGE", &p.image.0))
    .ok();
    assert!(!p.project.path().join("x").exists());
}
