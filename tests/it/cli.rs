//! The command line and the manifest, end to end through the binary.

use crate::common::*;

const GOOD: &str = r#"version: 1
project: demo
image:
  locks: [flake.lock]
batches:
  cpu:
    description: CPU-only unit tests
    gpus: 0
    timeout: 15m
    run: ["pytest -q tests/cpu"]
  "4a":
    gpus: 1
    timeout: 30m
    run: ["pytest -q tests/fp8"]
layers:
  "1": {batches: [cpu]}
  "3": {batches: all, fast: false}
"#;

#[test]
fn help_lists_every_spec_command() {
    let r = run(cibox(std::env::temp_dir().as_path()).arg("--help"));
    r.ok();
    for cmd in [
        "image",
        "doctor",
        "gpu",
        "batch",
        "layer",
        "cleanup",
        "capacity",
        "changed",
        "workflow",
        "reproduce",
    ] {
        assert!(r.stdout.contains(cmd), "--help lacks {cmd}:\n{}", r.stdout);
    }
    let r = run(cibox(std::env::temp_dir().as_path()).args(["image", "--help"]));
    for cmd in ["lockset", "verify", "load", "build", "qualify", "save"] {
        assert!(r.stdout.contains(cmd), "image --help lacks {cmd}");
    }
}

#[test]
fn bad_flag_is_one_line_exit_2() {
    let p = Project::new(GOOD);
    let r = p.cibox(&["batch", "list", "--frobnicate"]);
    r.fails_with(2, "--frobnicate");
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
}

#[test]
fn errors_are_json_under_json() {
    let p = Project::new(GOOD);
    // A flag that does not parse: `--json` was still asked for.
    let r = p.cibox(&["--json", "batch", "list", "--frobnicate"]);
    r.fails_with(2, "--frobnicate");
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["error"]["exit_code"], 2, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--frobnicate")
    );
    // A bad manifest.
    p.write("cibox.yaml", "version: 1\nproject: demo\nbatchez: {}\n");
    let r = p.cibox(&["batch", "list", "--json"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("batchez"),
        "{v}"
    );
    // Without --json, stdout stays empty.
    assert!(p.cibox(&["batch", "list"]).stdout.is_empty());
}

#[test]
fn batch_list_text_and_json() {
    let p = Project::new(GOOD);
    let r = p.cibox(&["batch", "list"]);
    r.ok();
    let rows = r.rows();
    for row in [
        "BATCH GPUS TIMEOUT DESCRIPTION",
        "cpu 0 15m CPU-only unit tests",
        "4a 1 30m",
        "3 no all (cpu, 4a)",
    ] {
        assert!(
            rows.iter().any(|r| r == row),
            "no row `{row}` in:\n{}",
            r.stdout
        );
    }
    let r = p.cibox(&["batch", "list", "--json"]);
    r.ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["batches"][1]["name"], "4a");
    assert_eq!(v["batches"][1]["gpus"], 1);
    assert_eq!(v["batches"][1]["timeout_s"], 1800);
    assert_eq!(v["layers"][1]["batches"], serde_json::json!(["cpu", "4a"]));
}

#[test]
fn manifest_found_upwards_and_by_env() {
    let p = Project::new(GOOD);
    std::fs::create_dir_all(p.path().join("a/b")).unwrap();
    run(cibox(&p.path().join("a/b")).args(["batch", "list"])).ok();
    let elsewhere = tempfile::tempdir().unwrap();
    run(cibox(elsewhere.path())
        .env("CIBOX_MANIFEST", p.path().join("cibox.yaml"))
        .args(["batch", "list"]))
    .ok();
}

#[test]
fn no_manifest_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(".git")).unwrap();
    run(cibox(dir.path()).args(["batch", "list"])).fails_with(2, "no cibox.yaml");
}

fn bad(manifest: &str, needle: &str) {
    let p = Project::new(manifest);
    let r = p.cibox(&["batch", "list"]);
    r.fails_with(2, needle);
    assert!(r.stdout.is_empty(), "nothing on stdout: {}", r.stdout);
}

#[test]
fn manifest_syntax_error_names_line() {
    bad(&GOOD.replace("layers:", "layers: [oops"), "cibox.yaml:");
    bad(&GOOD.replace("layers:", "layers: [oops"), "YAML syntax");
}

#[test]
fn manifest_unknown_key_suggests() {
    bad(
        &GOOD.replace("    timeout: 30m", "    timout: 30m"),
        "cibox.yaml:13:5: batches.4a.timout: unknown key `timout`; did you mean `timeout`?",
    );
}

#[test]
fn manifest_wrong_type() {
    bad(
        &GOOD.replace("gpus: 1", "gpus: [1]"),
        "batches.4a.gpus: wrong type",
    );
    bad(
        &GOOD.replace("gpus: 1", "gpus: -2"),
        "batches.4a.gpus: must be 0 or more, got -2",
    );
}

#[test]
fn manifest_duplicate_batch() {
    bad(
        &GOOD.replace(
            "layers:",
            "  cpu:\n    gpus: 0\n    timeout: 1m\n    run: [x]\nlayers:",
        ),
        "duplicate key `cpu` (first defined at line 6)",
    );
}

#[test]
fn manifest_semantic_errors() {
    bad(
        &GOOD.replace("[cpu]", "[gpu]"),
        "layers.1.batches.0: batch `gpu` is not defined",
    );
    bad(
        &GOOD.replace("15m", "15"),
        "batches.cpu.timeout: bad duration `15`",
    );
    bad(
        &GOOD.replace("project: demo", "project: My Project"),
        "project: `My Project` is not a valid project name",
    );
    bad(
        &GOOD.replace("version: 1", "version: 2"),
        "version 2 is not supported",
    );
    bad(
        &format!("{GOOD}container: {{memory: 8 gigs}}\n"),
        "container.memory: bad size",
    );
    bad(
        &format!("{GOOD}container: {{network: brige}}\n"),
        "did you mean `bridge`?",
    );
    bad("", "the manifest is empty");
}

#[test]
fn bad_env_override_names_variable() {
    let p = Project::new(GOOD);
    run(cibox(p.path())
        .env("CIBOX_GPU_POOL", "0,zero")
        .args(["batch", "list"]))
    .fails_with(2, "CIBOX_GPU_POOL: `zero` is neither a GPU index");
}
