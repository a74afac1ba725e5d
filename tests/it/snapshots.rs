//! Whole outputs, snapshotted (as zizmor's `tests/integration/audit/` does): what each
//! `workflow lint` rule says of a workflow that breaks it, `workflow render` of a GitHub
//! workflow, `gpu status` and `doctor` over the fake nvidia-smi. What changes from run
//! to run (temporary folders, versions, the engine's details) is redacted first.

use std::path::{Path, PathBuf};

use regex::Regex;

use crate::common::*;

fn corpus(folder: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(folder)
}

/// Each rule, and the file (of `tests/corpus/`) that shows it: the corpus's own where
/// one breaks it, else one of `rules/`.
const RULES: [(&str, &str); 13] = [
    ("env-file-injection", "workflows/tp-env-file.yml"),
    ("no-timeout", "workflows/tp-pull-request-self-hosted.yml"),
    ("pr-head-checkout", "workflows/tp-checkout-forms.yml"),
    ("runner-secret-file", "rules/runner-secret-file.yml"),
    ("script-injection", "workflows/tp-script-injection.yml"),
    ("secrets-exposed", "workflows/tp-pull-request-target.yml"),
    ("unchecked-call", "workflows/tp-composite-action.yml"),
    ("unparsable", "workflows/reusable-broken.yml"),
    ("unpinned-image", "workflows/tp-unpinned-images.yml"),
    (
        "untrusted-artifact",
        "workflows/tp-workflow-run-secrets.yml",
    ),
    ("untrusted-self-hosted", "workflows/tp-base-repo-guard.yml"),
    ("wait-past-timeout", "rules/wait-past-timeout.yml"),
    ("write-permissions", "workflows/tp-pwn-request.yml"),
];

/// A command's whole output: its exit code, stdout, and stderr when it says anything.
fn whole(r: &Run) -> String {
    let mut out = format!("exit {}\n--- stdout\n{}", r.code, r.stdout);
    if !r.stderr.is_empty() {
        out.push_str(&format!("--- stderr\n{}", r.stderr));
    }
    out
}

/// `text` with each of `paths` replaced by its name, and the rest that changes from
/// run to run by a placeholder.
fn redact(text: &str, paths: &[(&Path, &str)]) -> String {
    let mut text = text.to_string();
    for (path, name) in paths {
        text = text.replace(&path.display().to_string(), name);
    }
    let rules = [
        (r"cibox \d+\.\d+\.\d+\S*", "cibox [VERSION]"),
        (r"(?m)^(engine +ok +)[^\n]*", "${1}[ENGINE]"),
        (r"(?m)^(storage +ok +)[^\n]*", "${1}[STORAGE]"),
        (r"(?m)^(gpu runtime +)\S+ +[^\n]*", "${1}[RUNTIME]"),
        (
            r"(?m)^(gpu exec confinement +)\S+ +[^\n]*",
            "${1}[CONFINEMENT]",
        ),
        (r"(?m)^(not )?ready for GPU batches.*$", "[READY]"),
    ];
    for (re, with) in rules {
        text = Regex::new(re)
            .unwrap()
            .replace_all(&text, with)
            .into_owned();
    }
    text
}

#[test]
fn each_lint_rule_says_what_it_found_in_its_workflow() {
    for (rule, file) in RULES {
        let dir = corpus(file.split('/').next().unwrap());
        let name = Path::new(file).file_name().unwrap().to_str().unwrap();
        let r = run(cibox(&dir).args(["workflow", "lint", name]));
        assert!(
            r.stdout.contains(&format!("[{rule}]")),
            "{file} shows no {rule} finding:\n{}",
            whole(&r)
        );
        // A file lint reads above the current folder is named by its whole path.
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = redact(&whole(&r), &[(repo, "[REPO]")]);
        insta::assert_snapshot!(format!("lint_{rule}"), text);
    }
}

#[test]
fn every_lint_rule_has_its_snapshot() {
    let dir = corpus("rules");
    let r = run(cibox(&dir).args(["workflow", "lint", "--format", "sarif", "."]));
    let sarif: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    let rules: Vec<&str> = sarif["runs"][0]["tool"]["driver"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    let snapshotted: Vec<&str> = RULES.iter().map(|(r, _)| *r).collect();
    let mut sorted = rules.clone();
    sorted.sort();
    assert_eq!(sorted, snapshotted, "a rule without a snapshot here");
}

#[test]
fn lint_as_json_and_sarif() {
    let dir = corpus("workflows");
    for (format, file) in [("json", "tp-env-file.yml"), ("sarif", "tp-env-file.yml")] {
        let r = run(cibox(&dir).args(["workflow", "lint", "--format", format, file]));
        let version = format!("\"version\": \"{}\"", env!("CARGO_PKG_VERSION"));
        let text = redact(&whole(&r), &[]).replace(&version, "\"version\": \"[VERSION]\"");
        insta::assert_snapshot!(format!("lint_format_{format}"), text);
    }
}

#[test]
fn render_prints_a_github_workflow() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/demo");
    for output in ["layer1-cpu.yml", "layer3-full.yml"] {
        let r = run(cibox(&dir).args(["workflow", "render", "--print", output]));
        assert_eq!(r.code, 0, "{}", whole(&r));
        insta::assert_snapshot!(format!("render_github_{output}"), redact(&whole(&r), &[]));
    }
}

#[test]
fn gpu_status_of_idle_busy_and_leased_gpus() {
    let h = GpuHost::new(4);
    h.smi.set(
        "gpus.csv",
        &format!(
            "0, {}, 0, 81559, 0\n1, {}, 4096, 81559, 0\n2, {}, 0, 81559, 55\n3, {}, 10, 81559, 0\n",
            uuid(0),
            uuid(1),
            uuid(2),
            uuid(3)
        ),
    );
    h.smi.set("apps.csv", &format!("{}, 4242, 10\n", uuid(3)));
    let doubles = FakeSmi::program();
    let paths = [
        (h.locks.path(), "[LOCKS]"),
        (doubles.parent().unwrap(), "[DOUBLES]"),
    ];
    let r = h.run(&["gpu", "status"]);
    insta::assert_snapshot!("gpu_status_text", redact(&whole(&r), &paths));
    let r = h.run(&["gpu", "status", "--json"]);
    insta::assert_snapshot!("gpu_status_json", redact(&whole(&r), &paths));
}

#[test]
fn doctor_over_the_fake_nvidia_smi() {
    require_engine();
    let smi = FakeSmi::idle();
    let locks = tempfile::tempdir().unwrap();
    let p = Project::new(&manifest_with_locks(&["cibox.yaml"]));
    let mut c = cibox(p.path());
    smi.apply(&mut c);
    c.env("CIBOX_GPU_LOCK_DIR", locks.path()).arg("doctor");
    let r = run(&mut c);
    assert!([0, 5].contains(&r.code), "{}", whole(&r));
    let doubles = FakeSmi::program();
    let paths = [
        (locks.path(), "[LOCKS]"),
        (p.path(), "[PROJECT]"),
        (doubles.parent().unwrap(), "[DOUBLES]"),
    ];
    // Whether this engine has a GPU runtime is the host's: the exit code and the
    // verdict follow it, and are checked by `doctor::doctor_reports_each_check`.
    let text = redact(&r.stdout, &paths);
    insta::assert_snapshot!("doctor_text", text);
}
