//! `workflow lint`: the corpus of real attack patterns, their fixed forms and false
//! alarms (`tests/corpus/workflows`), and how lint treats bad files and missing setup.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::{cibox, run};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/workflows")
}

/// `# expect: RULE JOB LINE` lines of a corpus file (`# expect: nothing` gives none).
fn expected(text: &str) -> BTreeSet<String> {
    let lines: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# expect: "))
        .collect();
    assert!(!lines.is_empty(), "a corpus file without `# expect:`");
    lines
        .into_iter()
        .filter(|l| *l != "nothing")
        .map(str::to_string)
        .collect()
}

#[test]
fn the_corpus_gives_exactly_the_expected_findings() {
    let dir = corpus();
    let r = run(cibox(&dir).args(["--json", "workflow", "lint", "."]));
    // Errors found, and one file (reusable-broken.yml) deliberately not YAML: exit 2.
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    let report: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON report");
    assert_eq!(report["unparsable"], 1, "{}", r.stdout);
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in report["findings"].as_array().unwrap() {
        let path = Path::new(f["file"].as_str().unwrap());
        let mut file = path.file_name().unwrap().to_string_lossy().into_owned();
        if file == "action.yml" {
            let action = path.parent().unwrap().file_name().unwrap();
            file = format!("{}/{file}", action.to_string_lossy());
        }
        found.entry(file).or_default().insert(format!(
            "{} {} {}",
            f["rule"].as_str().unwrap(),
            f["job"].as_str().unwrap_or("-"),
            f["line"]
        ));
    }
    let mut files = 0;
    let mut failures = Vec::new();
    // The local actions the workflows use, under `../.github/actions/NAME/action.yml`:
    // their findings (steps of the calling jobs) are expected in their own files, keyed
    // `NAME/action.yml`.
    let actions = dir.join("../.github/actions");
    let mut action_files: Vec<(String, PathBuf)> = std::fs::read_dir(&actions)
        .unwrap()
        .map(|e| {
            let d = e.unwrap().path();
            let key = format!("{}/action.yml", d.file_name().unwrap().to_string_lossy());
            (key, d.join("action.yml"))
        })
        .collect();
    action_files.sort();
    assert!(
        !action_files.is_empty(),
        "no actions in {}",
        actions.display()
    );
    let mut workflows: Vec<(String, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yml") {
            continue;
        }
        files += 1;
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        workflows.push((name, path));
    }
    for (name, path) in workflows.into_iter().chain(action_files) {
        let want = expected(&std::fs::read_to_string(&path).unwrap());
        let got = found.remove(&name).unwrap_or_default();
        if want != got {
            failures.push(format!(
                "{name}:\n  missing: {:?}\n  unexpected: {:?}",
                want.difference(&got).collect::<Vec<_>>(),
                got.difference(&want).collect::<Vec<_>>()
            ));
        }
    }
    assert!(files >= 10, "corpus not found in {}", dir.display());
    assert_eq!(report["files"], files);
    assert!(
        found.is_empty(),
        "findings in files without expectations: {found:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn findings_name_file_line_job_and_step() {
    let dir = corpus();
    let r = run(cibox(&dir).args(["workflow", "lint", "tp-issue-comment-checkout.yml"]));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.lines().any(|l| l
            == "error: tp-issue-comment-checkout.yml:29:9: job gh, step 2 (Check out the PR): checks out the pull request's code (`gh pr checkout` in the script) under issue_comment, with the base repository's token and secrets, and no guard [pr-head-checkout]"),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr.contains("1 workflow(s), 5 error(s), 0 warning(s)"),
        "{}",
        r.stderr
    );
}

#[test]
fn lint_keeps_going_past_unreadable_files_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("a-not-yaml.yml"), "on: [push\njobs: {}\n").unwrap();
    std::fs::write(
        d.join("b-not-workflow.yml"),
        "on: push\njobs:\n  x:\n    runs-on: 3\n    steps: 4\n",
    )
    .unwrap();
    std::fs::write(d.join("c-empty.yaml"), "").unwrap();
    std::fs::write(
        d.join("d-bad.yml"),
        "on: pull_request\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    timeout-minutes: 5\n    steps: [{run: make}]\n",
    )
    .unwrap();
    // A FIFO must not block the read; a huge file is not read.
    nix::unistd::mkfifo(
        &d.join("e-fifo.yml"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    std::fs::write(d.join("f-huge.yml"), vec![b'#'; 2 << 20]).unwrap();
    std::fs::write(d.join("notes.txt"), "not a workflow, not read").unwrap();
    let r = run(cibox(d).args(["workflow", "lint"]).arg(d));
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    assert!(has("a-not-yaml.yml:2:5: not YAML"), "{}", r.stdout);
    assert!(
        has("b-not-workflow.yml:4:14: not a GitHub Actions workflow at `jobs.x.runs-on`"),
        "{}",
        r.stdout
    );
    assert!(has("c-empty.yaml:1:1: empty file"), "{}", r.stdout);
    assert!(
        has("d-bad.yml:4:14: job gpu: runs on a self-hosted runner"),
        "{}",
        r.stdout
    );
    assert!(
        has("e-fifo.yml:1:1: cannot read: not a plain file"),
        "{}",
        r.stdout
    );
    assert!(has("f-huge.yml:1:1: larger than 1024 KiB"), "{}", r.stdout);
    assert!(!has("notes.txt"), "{}", r.stdout);
    assert!(
        r.stderr
            .contains("6 workflow(s), 1 error(s), 0 warning(s), 5 not readable as a workflow"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
}

#[test]
fn lint_needs_no_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join(".git")).unwrap();
    std::fs::create_dir_all(d.join(".github/workflows")).unwrap();
    std::fs::create_dir_all(d.join("src/deep")).unwrap();
    std::fs::write(
        d.join(".github/workflows/gpu.yml"),
        "on: pull_request\njobs:\n  gpu:\n    runs-on: gpu-8x-h100\n    timeout-minutes: 5\n    steps: [{run: make}]\n",
    )
    .unwrap();
    // From a subfolder of a repository without cibox.yaml: its .github/workflows.
    let r = run(cibox(&d.join("src/deep")).args(["--json", "workflow", "lint"]));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let report: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(report["files"], 1);
    assert_eq!(report["errors"], 1);
    assert_eq!(report["findings"][0]["rule"], "untrusted-self-hosted");
    assert_eq!(report["findings"][0]["line"], 4);
    // Nothing to lint: one clear line, exit 2.
    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir(empty.path().join(".git")).unwrap();
    run(cibox(empty.path()).args(["workflow", "lint"])).fails_with(2, "no workflows folder at");
    run(cibox(empty.path()).args(["workflow", "lint", "missing.yml"])).fails_with(2, "missing.yml");
}

#[test]
fn names_a_workflow_gives_reach_the_terminal_shown_not_sent() {
    // A pull request's workflow whose step is named with a title change (OSC 0), a
    // clipboard write (OSC 52), an 8-bit CSI and an override.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("pr.yml"),
        "on: pull_request\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    timeout-minutes: 5\n    steps:\n      - name: \"a\\e]0;pwned\\a\\e]52;c;Y3VybCBldmls\\a\\x9b2J\\u202eb\"\n        run: echo ${{ github.event.pull_request.title }}\n",
    )
    .unwrap();
    for format in ["text", "json", "sarif"] {
        let r = run(cibox(dir.path()).args(["workflow", "lint", "--format", format, "pr.yml"]));
        assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
        let raw: Vec<char> = r
            .stdout
            .chars()
            .chain(r.stderr.chars())
            .filter(|c| *c != '\n' && (c.is_control() || ('\u{202a}'..='\u{202e}').contains(c)))
            .collect();
        assert!(raw.is_empty(), "{format}: {raw:?} in {:?}", r.stdout);
    }
    let r = run(cibox(dir.path()).args(["workflow", "lint", "pr.yml"]));
    assert!(
        r.stdout.contains(
            "step 1 (a\\u{1b}]0;pwned\\u{7}\\u{1b}]52;c;Y3VybCBldmls\\u{7}\\u{9b}2J\\u{202e}b)"
        ),
        "{}",
        r.stdout
    );
}

#[test]
fn hostile_workflow_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let wf = d.join("wf");
    std::fs::create_dir(&wf).unwrap();
    // A chain of 25,000 `&&` would overflow the stack of a recursive parser.
    let chain = vec!["a"; 25_000].join(" && ");
    std::fs::write(
        wf.join("a-long.yml"),
        format!("on: pull_request\njobs:\n  gpu:\n    if: {chain}\n    runs-on: [self-hosted]\n    timeout-minutes: 5\n    steps:\n      - run: echo ${{{{ {chain} }}}}\n"),
    )
    .unwrap();
    // A link in the folder is not followed, and no message quotes what it points to.
    let secret = d.join("credentials");
    std::fs::write(&secret, "aws_secret_access_key = AKIAEXAMPLESECRET123\n").unwrap();
    std::os::unix::fs::symlink(&secret, wf.join("b-link.yml")).unwrap();
    // A called workflow fanned out over many jobs, three levels deep, is linted once
    // per level and reported once.
    let calls = |callee: &str| {
        let mut s = String::from("on: {pull_request: {}, workflow_call: {}}\njobs:\n");
        for i in 0..150 {
            s.push_str(&format!(
                "  j{i}:\n    uses: ./.github/workflows/{callee}\n"
            ));
        }
        s
    };
    std::fs::write(wf.join("c-top.yml"), calls("d-mid.yml")).unwrap();
    std::fs::write(
        wf.join("d-mid.yml"),
        calls("e-low.yml").replace("pull_request: {}, ", ""),
    )
    .unwrap();
    std::fs::write(
        wf.join("e-low.yml"),
        calls("f-gpu.yml").replace("pull_request: {}, ", ""),
    )
    .unwrap();
    std::fs::write(
        wf.join("f-gpu.yml"),
        "on: workflow_call\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    timeout-minutes: 5\n    steps: [{run: make}]\n",
    )
    .unwrap();
    let r = run(cibox(d).args(["--json", "workflow", "lint"]).arg(&wf));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(!r.stdout.contains("AKIAEXAMPLESECRET123"), "{}", r.stdout);
    let report: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let findings = report["findings"].as_array().unwrap();
    let of = |file: &str| -> Vec<&serde_json::Value> {
        findings
            .iter()
            .filter(|f| f["file"].as_str().unwrap().ends_with(file))
            .collect()
    };
    let long = of("a-long.yml");
    assert_eq!(long.len(), 2, "{long:?}");
    assert!(
        long[0]["message"]
            .as_str()
            .unwrap()
            .contains("longer than 4096 bytes")
    );
    assert!(
        long[1]["message"]
            .as_str()
            .unwrap()
            .contains("too long to check")
    );
    let link = of("b-link.yml");
    assert_eq!(link[0]["rule"], "unparsable");
    assert!(
        link[0]["message"]
            .as_str()
            .unwrap()
            .contains("a symbolic link: not followed")
    );
    let gpu = of("f-gpu.yml");
    assert_eq!(gpu.len(), 1, "{gpu:?}");
    assert_eq!(gpu[0]["rule"], "untrusted-self-hosted");
    assert_eq!(gpu[0]["called_by_count"], 150 * 150 * 150);
    assert_eq!(gpu[0]["called_by"].as_array().unwrap().len(), 3);

    // Named on the command line, a link is followed; the message still quotes nothing.
    let r = run(cibox(d)
        .args(["workflow", "lint"])
        .arg(wf.join("b-link.yml")));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stdout.contains("not a GitHub Actions workflow"),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("AKIA"), "{}", r.stdout);
}

#[test]
fn calls_deeper_than_github_allows_are_named_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // w00 (pull_request) calls w01, … calls w11: GitHub stops at ten workflows.
    for i in 0..12 {
        let on = if i == 0 {
            "pull_request"
        } else {
            "workflow_call"
        };
        let text = if i < 11 {
            format!(
                "on: {on}\njobs:\n  next:\n    uses: ./.github/workflows/w{:02}.yml\n",
                i + 1
            )
        } else {
            format!(
                "on: {on}\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    timeout-minutes: 5\n    steps: [{{run: make}}]\n"
            )
        };
        std::fs::write(d.join(format!("w{i:02}.yml")), text).unwrap();
    }
    let r = run(cibox(d).args(["--json", "workflow", "lint", "w00.yml"]));
    assert_eq!(r.code, 0, "warnings only:\n{}{}", r.stdout, r.stderr);
    let report: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0]["rule"], "unchecked-call");
    assert!(
        findings[0]["file"].as_str().unwrap().ends_with("w09.yml"),
        "{findings:?}"
    );
    assert!(
        findings[0]["message"]
            .as_str()
            .unwrap()
            .contains("more than 10 calls deep"),
        "{findings:?}"
    );
}

#[test]
fn sarif_for_code_scanning() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join(".git")).unwrap();
    std::fs::create_dir_all(d.join(".github/workflows")).unwrap();
    std::fs::create_dir_all(d.join("src")).unwrap();
    std::fs::write(
        d.join(".github/workflows/gpu.yml"),
        "on: pull_request\njobs:\n  gpu:\n    runs-on: gpu-8x-h100\n    container: pytorch/pytorch:2.4.0\n    timeout-minutes: 5\n    steps: [{run: make}]\n",
    )
    .unwrap();
    // From a subfolder: URIs are still relative to the repository's root.
    let r = run(cibox(&d.join("src")).args(["workflow", "lint", "--format", "sarif"]));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let log: serde_json::Value = serde_json::from_str(&r.stdout).expect("SARIF is JSON");
    assert_eq!(log["version"], "2.1.0");
    assert!(log["$schema"].as_str().unwrap().contains("sarif-2.1.0"));
    let run0 = &log["runs"][0];
    let rules: Vec<&str> = run0["tool"]["driver"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    for id in [
        "untrusted-self-hosted",
        "pr-head-checkout",
        "unpinned-image",
    ] {
        assert!(rules.contains(&id), "{rules:?}");
    }
    let results = run0["results"].as_array().unwrap();
    let got: Vec<String> = results
        .iter()
        .map(|x| {
            let loc = &x["locations"][0]["physicalLocation"];
            format!(
                "{} {} {}:{}:{}",
                x["ruleId"].as_str().unwrap(),
                x["level"].as_str().unwrap(),
                loc["artifactLocation"]["uri"].as_str().unwrap(),
                loc["region"]["startLine"],
                loc["region"]["startColumn"]
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            "untrusted-self-hosted error .github/workflows/gpu.yml:4:14",
            "unpinned-image warning .github/workflows/gpu.yml:5:16",
        ]
    );
    // One way to ask for the format.
    let r = run(cibox(d).args(["--json", "workflow", "lint", "--format", "sarif"]));
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("give one of them"), "{}", r.stderr);
}
