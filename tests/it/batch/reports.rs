//! What a run writes: reports a batch cannot subvert with planted symlinks, the
//! qualification record, and GitHub Actions' summary, outputs and annotations.

use super::batch;
use crate::common::*;

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

#[test]
fn a_batch_says_when_it_left_its_reports_empty_and_anything_there_is_copied() {
    // The script's last line says so only of a `/reports` that holds nothing at all: a
    // hidden file or an empty folder is there, and copied.
    let p = busybox_project(
        &(batch("none", 0, "1m", &["true"], "    allow_empty: true\n")
            + &batch(
                "hidden",
                0,
                "1m",
                &["echo x > $CIBOX_REPORTS/.hidden"],
                "    allow_empty: true\n",
            )
            + &batch(
                "folder",
                0,
                "1m",
                &["mkdir $CIBOX_REPORTS/sub"],
                "    allow_empty: true\n",
            )),
        "",
    );
    p.run(&["batch", "run", "none", "hidden", "folder"]).ok();
    let log = |b: &str| std::fs::read_to_string(p.reports().join(b).join("log.txt")).unwrap();
    assert!(
        log("none").ends_with("cibox reports: none\n"),
        "{}",
        log("none")
    );
    for b in ["hidden", "folder"] {
        assert!(!log(b).contains("cibox reports: none"), "{b}: {}", log(b));
    }
    assert_eq!(
        std::fs::read_to_string(p.reports().join("hidden/.hidden")).unwrap(),
        "x\n"
    );
    assert!(p.reports().join("folder/sub").is_dir());
    assert_eq!(p.result("none")["status"], "passed");
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
    // Under --json, the outcome says so.
    let r = run(cibox(p.project.path())
        .args([
            "--json",
            "image",
            "qualify",
            &p.image.0,
            "--scope",
            &p.scope(),
            "--reports",
        ])
        .arg(&out));
    assert_eq!(r.code, 1, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        (v["qualified"].as_bool(), v["status"].as_str()),
        (Some(false), Some("failed")),
        "{v}"
    );
    assert_eq!(v["batches"].as_array().unwrap().len(), 2, "{v}");
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
    // The timeline, which GitHub draws.
    assert!(
        s.contains("```mermaid\n%%{init: ")
            && s.contains("}%%\ngantt\n")
            && s.contains("section CPU\n")
            && s.contains("red failed :crit, "),
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
fn refused_input_makes_no_reports_folder() {
    // Nothing may be made when input is refused: a `changed run` test file that is not
    // in the source, or a batch asking what no host policy grants, is refused (exit 2)
    // before a reports folder exists. No engine is asked, so none is needed.
    let p = Project::new(
        "version: 1\nproject: t\nimage:\n  locks: [\"cibox.yaml\"]\nchanged:\n  patterns: [\"tests/test_*.py\"]\n  run:\n    command: pytest \"$CIBOX_TEST_FILE\"\n    timeout: 1m\nbatches:\n  unit: {gpus: 0, timeout: 1m, run: [\"true\"]}\n  root: {gpus: 0, timeout: 1m, run: [\"true\"], container: {user: root}}\n",
    );
    let reports = p.path().join("out/reports");
    let image = format!("sha256:{}", "a".repeat(64));
    let matrix = serde_json::json!([{"test_file": "tests/test_gone.py", "num_gpus": 0}]);
    let common = [
        "--image",
        &image,
        "--reports",
        reports.to_str().unwrap(),
        "--scope",
        "refused",
    ];
    run(cibox(p.path())
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .env("CIBOX_MATRIX", matrix.to_string())
        .args(["changed", "run", "--matrix-env", "CIBOX_MATRIX"])
        .args(common))
    .fails_with(2, "test file `tests/test_gone.py` is not a file in");
    assert!(
        !p.path().join("out").exists(),
        "a refused changed run made its reports folder"
    );
    run(cibox(p.path())
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args(["batch", "run", "root"])
        .args(common))
    .fails_with(2, "root");
    assert!(
        !p.path().join("out").exists(),
        "a refused batch run made its reports folder"
    );
}

#[test]
fn json_run_outcome_on_stdout_with_the_output_on_stderr() {
    let p = busybox_project(
        &(batch("good", 0, "1m", &["echo printed-by-good", JUNIT_OK], "")
            + &batch("bad", 0, "1m", &["echo printed-by-bad; exit 3"], "")),
        "",
    );
    let r = p.run(&["--json", "batch", "run", "good", "bad"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}):\n{}", r.stdout));
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["exit_code"], 1, "{v}");
    assert_eq!(v["run"].as_str().unwrap().len(), 16, "{v}");
    let batches = v["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 2, "{v}");
    assert_eq!(batches[0]["batch"], "good");
    assert_eq!(batches[0]["status"], "passed");
    assert_eq!(batches[1]["status"], "failed");
    assert_eq!(batches[1]["container_exit_code"], 3);
    let result = batches[1]["result"].as_str().unwrap();
    assert!(std::path::Path::new(result).is_file(), "{result}");
    assert!(
        v["summary"].as_str().unwrap().ends_with("summary.md"),
        "{v}"
    );
    // The batches' output went to stderr, out of the JSON's way.
    assert!(r.stderr.contains("printed-by-good"), "{}", r.stderr);
    assert!(!r.stdout.contains("printed-by"), "{}", r.stdout);
    // An error is JSON too (and still its one line on stderr).
    let r = p.run(&["--json", "batch", "run", "nosuch"]);
    r.fails_with(2, "unknown batch `nosuch`");
    let e: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(e["error"]["exit_code"], 2, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown batch `nosuch`"),
        "{e}"
    );
}

fn must_be_root() {
    assert!(
        nix::unistd::getuid().is_root(),
        "this test plants files as another user and must run as root (CI does)"
    );
}

/// A file only root may read or write, with `text` in it.
fn root_only(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let f = dir.join("root-only");
    std::fs::write(&f, text).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    f
}

#[test]
fn a_reports_folder_another_user_made_is_refused_and_nothing_written_through_its_links() {
    must_be_root();
    let p = busybox_project(&batch("unit", 0, "1m", &[JUNIT_OK], ""), "");
    let victim_dir = tempfile::tempdir().unwrap();
    let victim = root_only(victim_dir.path(), "keep");
    // Another user made the reports folder first and planted links where cibox writes.
    let reports = p.project.path().join("theirs");
    std::fs::create_dir(&reports).unwrap();
    for name in ["summary.md", "junit.xml", "timeline.svg"] {
        std::os::unix::fs::symlink(&victim, reports.join(name)).unwrap();
    }
    nix::unistd::chown(&reports, Some(65534.into()), Some(65534.into())).unwrap();
    let r = p.run(&[
        "batch",
        "run",
        "unit",
        "--reports",
        reports.to_str().unwrap(),
    ]);
    r.fails_with(2, "owned by uid 65534");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(p.containers().is_empty(), "a container was started");
    // A link to a folder of root's, planted by that user, is refused the same way.
    let link = p.project.path().join("link");
    std::os::unix::fs::symlink(victim_dir.path(), &link).unwrap();
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &link,
        Some(65534.into()),
        Some(65534.into()),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let r = p.run(&["batch", "run", "unit", "--reports", link.to_str().unwrap()]);
    r.fails_with(2, "owned by uid 65534");
    assert!(!victim_dir.path().join("summary.md").exists());
}

#[test]
fn a_batch_folder_swapped_for_a_link_while_it_runs_is_not_written_through() {
    let p = busybox_project(&batch("unit", 0, "1m", &["sleep 3", JUNIT_OK], ""), "");
    let elsewhere = tempfile::tempdir().unwrap();
    let mut child = p.spawn(&["batch", "run", "unit"]);
    let dir = p.reports().join("unit");
    assert!(
        wait_until(60, || dir.join("log.txt").exists()),
        "the batch never started"
    );
    std::fs::rename(&dir, p.reports().join("unit.moved")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), &dir).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(
        std::fs::read_dir(elsewhere.path())
            .unwrap()
            .next()
            .is_none(),
        "cibox wrote through the link: {:?}",
        std::fs::read_dir(elsewhere.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>()
    );
    // What it wrote went on into the folder it made.
    let moved = p.reports().join("unit.moved");
    assert!(moved.join("result.json").exists());
    assert!(moved.join("junit.xml").exists());
}

#[test]
fn the_write_check_never_follows_a_link_at_its_name() {
    let p = busybox_project(&batch("unit", 0, "1m", &[JUNIT_OK], ""), "");
    let victim_dir = tempfile::tempdir().unwrap();
    let victim = root_only(victim_dir.path(), "keep");
    // The reports folder does not exist yet: the check writes in the folder above it,
    // where a link waits under the name this cibox's pid would give the check's file.
    let above = p.project.path().join("above");
    std::fs::create_dir(&above).unwrap();
    let reports = above.join("reports");
    let cmd = p.batch_cmd(&[
        "batch",
        "run",
        "unit",
        "--reports",
        reports.to_str().unwrap(),
    ]);
    let argv: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut sh = std::process::Command::new("sh");
    sh.arg("-c")
        .arg(format!(
            "ln -s {} {}/.cibox-write-check-$$ && exec \"$@\"",
            victim.display(),
            above.display()
        ))
        .arg("sh")
        .args(&argv)
        .current_dir(p.project.path());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    run(&mut sh).ok();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
}

#[test]
fn the_summary_names_the_batch_folders_earlier_runs_left() {
    let p = busybox_project(
        &format!(
            "{}{}",
            batch("unit", 0, "1m", &[JUNIT_OK], ""),
            batch("second", 0, "1m", &[JUNIT_OK], "")
        ),
        "",
    );
    p.run(&["batch", "run", "unit", "second"]).ok();
    p.run(&["batch", "run", "unit"]).ok();
    let summary = std::fs::read_to_string(p.reports().join("summary.md")).unwrap();
    assert!(
        summary.contains("Also in this folder, from earlier runs (not in this summary): `second`."),
        "{summary}"
    );
    // They stay: a folder may gather several runs on purpose.
    assert!(p.reports().join("second/result.json").exists());
}
