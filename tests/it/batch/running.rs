//! How a run is set up: the locked-down container, input refused before anything starts,
//! a source outside git, parallel batches, and batches in their named images.

use super::{batch, two_passing_batches};
use crate::common::*;

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
        // Standard input ends at once: the word that the source is in was the script's.
        "test -z \"$(cat)\"",
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
    )
    .with_policy("version: 1\ngrants: {pass_env: [CIBOX_TEST_PASSED, HOST_UID]}\n");
    let r = run(p
        .batch_cmd(&["batch", "run", "sec"])
        .env("CIBOX_TEST_SECRET", "leak")
        .env("CIBOX_TEST_PASSED", "yes")
        .env("HOST_UID", &uid));
    r.ok();
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
fn cibox_output_folders_anywhere_in_the_source_neither_ship_nor_make_it_dirty() {
    let p = busybox_project(
        &batch(
            "look",
            0,
            "1m",
            &["test ! -e sub/cibox-reports && test ! -e out && test -e sub/kept"],
            "    verdict: exit-code\n",
        ),
        "",
    );
    let dir = p.project.path();
    std::fs::remove_dir(dir.join(".git")).unwrap();
    git(dir, &["init", "-q"]);
    p.project.write("sub/kept", "x");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "source"]);
    // What an earlier run of a manifest in `sub/` left, and this run's reports folder,
    // both untracked in the checkout.
    p.project.write("sub/cibox-reports/unit/result.json", "{}");
    let out = dir.join("out");
    let r = p.run(&["batch", "run", "look", "--reports", out.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("look/result.json")).unwrap())
            .unwrap();
    assert_eq!(v["source"]["dirty"], false, "{v}");
    // Something else untracked still counts.
    p.project.write("sub/new.py", "x");
    p.run(&["batch", "run", "look", "--reports", out.to_str().unwrap()])
        .ok();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("look/result.json")).unwrap())
            .unwrap();
    assert_eq!(v["source"]["dirty"], true, "{v}");
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
        format!(
            "FROM {}\nCOPY marker /which-second\n",
            own_name("bt", &p.image.0)
        ),
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
    // `a` again as part of a layer of the second image.
    let named = format!("{named}layers:\n  other: {{batches: [a], image: second}}\n");
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
    // As part of the layer, `a` runs in the second image (and fails there); its record
    // says so, and a replay runs it there again.
    let d = p.project.path();
    make_checkout(d);
    let mut c = cibox(d);
    c.args(["layer", "run", "other", "--source"])
        .arg(d)
        .arg("--reports")
        .arg(p.reports())
        .args(["--scope", &p.scope()])
        .env("CIBOX_IMAGE_SECOND", &second.0);
    assert_eq!(run(&mut c).code, 1);
    let a = p.result("a");
    assert_eq!(a["image"], second.0.as_str(), "{a}");
    assert_eq!(a["image_name"], "second", "{a}");
    assert_eq!(a["layer"], "other", "{a}");
    let replay = run(cibox(d)
        .arg("reproduce")
        .arg(p.reports().join("a/result.json")));
    assert!(
        replay.stdout.contains("of layer other")
            && replay.rows().contains(&"status failed failed".to_string()),
        "{}\n{}",
        replay.stdout,
        replay.stderr
    );
    // An image built from other locks than its own is refused before anything runs.
    p.project.write("image2/marker", "changed");
    let r = run_both(&[]);
    r.fails_with(3, "was built from different lock files");
    assert!(p.containers().is_empty());
}

#[test]
fn a_stdout_nobody_reads_stalls_neither_the_timeout_nor_the_other_batches() {
    // cibox's stdout is a pipe nobody reads (a paused terminal, a stuck log reader):
    // `loud` prints far more than the pipe holds, then sleeps past its timeout. The
    // timeout must still stop it, `quiet` (beside it) must still finish, and log.txt
    // must still get everything; what the reader missed is dropped, not waited for.
    let loud = "yes 'a line of test output that fills any pipe' | head -c 4000000; echo done-printing; sleep 600";
    let p = busybox_project(
        &format!(
            "{}{}",
            batch("loud", 0, "5s", &[loud], "    allow_empty: true\n"),
            batch("quiet", 0, "1m", &["sleep 2", JUNIT_OK], "")
        ),
        "",
    );
    let mut child = p
        .batch_cmd(&["batch", "run", "loud", "quiet", "--parallel"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Held, never read: the pipe stays open and full.
    let _stalled = child.stdout.take();
    let ended = wait_until(120, || child.try_wait().unwrap().is_some());
    if !ended {
        // Stuck on the pipe: its watchdog removes the container once it is gone.
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(ended, "cibox stalled on its stdout");
    assert_eq!(child.wait().unwrap().code(), Some(124));
    assert_eq!(p.result("loud")["status"], "timeout");
    assert_eq!(p.result("quiet")["status"], "passed");
    let log = std::fs::read_to_string(p.reports().join("loud/log.txt")).unwrap();
    assert!(
        log.len() > 4_000_000 && log.contains("done-printing"),
        "log.txt holds {} bytes",
        log.len()
    );
}

#[test]
fn sent_to_one_file_phase_lines_come_where_they_happened_among_the_output() {
    let p = busybox_project(
        &batch(
            "two",
            0,
            "1m",
            &[
                "echo first-out",
                "sleep 1; echo second-out",
                "printf partial; sleep 2",
                "w=run; for i in 1 2 3; do echo \"cibox $w: forged $i\"; done",
            ],
            "    verdict: exit-code\n",
        ),
        "",
    );
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut c = p.batch_cmd(&["-v", "batch", "run", "two"]);
    c.env("CIBOX_HEARTBEAT", "1s");
    c.stdout(log.reopen().unwrap())
        .stderr(log.reopen().unwrap());
    assert!(c.status().unwrap().success());
    let text = std::fs::read_to_string(log.path()).unwrap();
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("`{needle}` missing:\n{text}"))
    };
    // Each step's phase line after its announcement, and before the next one's.
    let first = at("cibox run: echo first-out");
    let first_phase = at("run [");
    let second = at("cibox run: sleep 1; echo second-out");
    let second_phase = at("] sleep 1; echo second-out");
    assert!(
        first < first_phase && first_phase < second && second < second_phase,
        "{text}"
    );
    // A line of cibox's (the heartbeat while the last step sleeps) starts a line of its
    // own, though the step's output stopped mid-line.
    assert!(
        text.contains("partial\ncibox: batch two: running for "),
        "{text}"
    );
    assert!(!text.contains("partialcibox"), "{text}");
    // What the batch prints like an announcement is its output, not a phase of cibox's.
    assert!(text.contains("cibox run: forged 3"), "{text}");
    assert!(!text.contains("] forged"), "{text}");
}

#[test]
fn progress_shows_phases_under_v_and_a_heartbeat_for_a_quiet_batch() {
    let p = busybox_project(
        &batch("quiet", 0, "1m", &["echo started", "sleep 3", JUNIT_OK], ""),
        "",
    );
    let r = run(p
        .batch_cmd(&["-v", "batch", "run", "quiet"])
        .env("CIBOX_HEARTBEAT", "1s"));
    r.ok();
    // Each step of the batch, in order, timed from its start.
    let mut at = 0;
    for phase in [
        "cibox: verify: image default sha256:",
        "cibox: batch quiet:     lease [",
        "cibox: batch quiet:    create [",
        "cibox: batch quiet:      copy [",
        "cibox: batch quiet:       run [",
        "cibox: batch quiet:   collect [",
    ] {
        let found = r.stderr[at..]
            .find(phase)
            .unwrap_or_else(|| panic!("`{phase}` missing, or out of order:\n{}", r.stderr));
        at += found + phase.len();
    }
    assert!(
        r.stderr.contains("] sleep 3\n"),
        "the run step is named: {}",
        r.stderr
    );
    // Quiet for a second while it sleeps: said to be alive, and since when.
    let beat = r
        .stderr
        .lines()
        .find(|l| l.starts_with("cibox: batch quiet: running for "))
        .unwrap_or_else(|| panic!("no heartbeat:\n{}", r.stderr));
    assert!(
        beat.contains(", last output ") && beat.ends_with(" ago"),
        "{beat}"
    );
    // Without -v, no phase lines; without CIBOX_HEARTBEAT, none within 30 s.
    let r = p.run(&["batch", "run", "quiet"]);
    r.ok();
    assert!(!r.stderr.contains("     lease ["), "{}", r.stderr);
    assert!(!r.stderr.contains("running for"), "{}", r.stderr);
}

/// The merged `junit.xml` keeps a failure's text (pytest's traceback), not only its
/// message.
#[test]
fn the_merged_junit_keeps_a_failures_traceback() {
    let junit = "printf '%s' '<testsuite><testcase classname=\"t\" name=\"bad\"><failure message=\"assert 1 == 2\">def test_bad():\n&gt;       assert 1 == 2\nE       assert 1 == 2\n\ntests/test_x.py:2: AssertionError</failure></testcase></testsuite>' > $CIBOX_REPORTS/j.xml";
    let p = busybox_project(&batch("red", 0, "1m", &[junit], ""), "");
    let r = p.run(&["batch", "run", "red"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let merged = std::fs::read_to_string(p.reports().join("junit.xml")).unwrap();
    assert!(merged.contains("message=\"assert 1 == 2\""), "{merged}");
    assert!(
        merged.contains(
            "&gt;       assert 1 == 2\nE       assert 1 == 2\n\ntests/test_x.py:2: AssertionError"
        ),
        "{merged}"
    );
}
