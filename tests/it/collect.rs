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
    run(&mut p.batch_cmd_bare(&["batch", "list"])).fails_with(2, "not both");
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

/// SGLang's collector, as `python/sglang/test/ci/ci_register.py:178-350` reads the
/// registrations (sglang 8905cbd42): each file's module-level `register_*_ci(...)` calls,
/// their arguments constants read from the AST (never imported, never run), the suite
/// `{stage}-test-{runner_config}` or `suite=`, disabled ones left out; the files as
/// `test/run_suite.py:331-340` globs them, sorted (`auto_partition`'s tie-break,
/// `ci_register.py:376`). It prints one entry a line, with the GPUs and model the
/// suite's runner config names.
const COLLECTOR: &str = r#"import ast, glob, json, os, re, sys

BACKENDS = {"register_cpu_ci": "cpu", "register_cuda_ci": "cuda", "register_amd_ci": "amd"}
PARAMS = ("est_time", "suite", "nightly", "disabled")

def registrations(path):
    tree = ast.parse(open(path).read(), filename=path)
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
            continue
        call = stmt.value
        if not isinstance(call.func, ast.Name) or call.func.id not in BACKENDS:
            continue
        args = dict(zip(PARAMS, (a.value for a in call.args)))
        args.update({k.arg: k.value.value for k in call.keywords})
        if "stage" in args:
            args["suite"] = f"{args['stage']}-test-{args['runner_config']}"
        yield BACKENDS[call.func.id], args

def main():
    hw = sys.argv[1]
    for path in sorted(glob.glob("test/registered/**/*.py", recursive=True)):
        for backend, r in registrations(path):
            if backend != hw or r.get("disabled") or r.get("nightly"):
                continue
            suite = r["suite"]
            gpus = re.search(r"(\d+)-gpu", suite)
            model = re.search(r"gpu-(h100|h200|h20|b200|gb300)", suite)
            entry = {"file": path, "est_time": r["est_time"], "suite": suite,
                     "gpus": int(gpus.group(1)) if gpus else 0}
            if model:
                entry["gpu_model"] = "*" + model.group(1).upper() + "*"
            print(json.dumps(entry))

main()
"#;

/// SGLang's stages as families of collected lists, one collector for all of them; the
/// CPU suites run with `python3 FILE` (`test/run_suite.py`'s `run_unittest_files`).
const SGLANG: &str = r#"version: 1
project: sgl
image:
  locks: [image/Dockerfile, image/nonce]
  dockerfile: image/Dockerfile
container: {memory: 512m, pids: 256}
defaults: {timeout: 30m, verdict: exit-code, env: {PYTHONPATH: /work/python}, run: ["python3 $CIBOX_TEST_FILE"]}
batches:
  cpu:
    gpus: 0
    collect: {run: python3 test/ci_collect.py cpu, suite: base-a-test-cpu}
  cpu-arm64:
    gpus: 0
    collect: {run: python3 test/ci_collect.py cpu, suite: base-b-test-cpu-arm64}
  large:
    gpus: 1
    collect: {run: python3 test/ci_collect.py cuda, suite: base-b-test-1-gpu-large}
  b200:
    gpus: 4
    collect: {run: python3 test/ci_collect.py cuda, suite: base-b-test-4-gpu-b200}
layers:
  base-a-cpu: {batches: [cpu], budget: 30m}
  arm64: {batches: [cpu-arm64]}
  base-b-large: {batches: [large], budget: 30m}
  base-b-b200: {batches: [b200], budget: 60m}
workflows:
  buildkite: .buildkite
"#;

/// The pipeline uploaded at build time (`workflow render --print … | buildkite-agent
/// pipeline upload`): a step per collected stage, its parts sized by its budget from
/// the collected `est_time`s. Rendered to be committed (nothing collected), it is a
/// `wait`.
const UPLOADED: &str = r#"steps:
<% for name, l in layers | items if l.batch_list %>
  - label: << name | yaml >>
    key: << name >>
    parallelism: << l.parts >>
    agents: {queue: << (l.batch_list[0].gpu_model_label or "cpu") | yaml >>}
    command: cibox layer run << name | shell >>
<% else %>
  - wait
<% endfor %>
"#;

/// What is committed: a step that collects and uploads the rest.
const BOOTSTRAP: &str = "steps:\n  - label: \":pipeline: collect the test lists and upload their steps\"\n    command: set -o pipefail; cibox workflow render --print pipeline.yml | buildkite-agent pipeline upload --no-interpolation\n";

/// GitHub: a job collects and outputs a matrix, which the stage's job takes with
/// `fromJSON` (the batch's name reaches its command through the environment).
const GITHUB: &str = r#"name: << project >> arm64
on: [push]
permissions:
  contents: read
jobs:
  collect:
    runs-on: [self-hosted, cpu]
    outputs:
      matrix: ${{ steps.list.outputs.matrix }}
    steps:
      - uses: actions/checkout@v4
      - id: list
        run: |
          set -o pipefail
          echo "matrix=$(cibox --json batch list --layer arm64 | jq -c '{batch: [.batches[].name]}')" >> "$GITHUB_OUTPUT"
  arm64:
    needs: collect
    runs-on: [self-hosted, cpu]
    strategy:
      fail-fast: false
      matrix: ${{ fromJSON(needs.collect.outputs.matrix) }}
    steps:
      - uses: actions/checkout@v4
      - run: cibox batch run "$BATCH"
        env:
          BATCH: ${{ matrix.batch }}
"#;

/// Longest first onto the lightest part, ties by file (SGLang's `auto_partition`,
/// `ci_register.py:353-389`): the sums of each part.
fn lpt(mut est: Vec<(String, f64)>, parts: usize) -> Vec<f64> {
    est.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut sums = vec![0.0f64; parts];
    for (_, t) in est {
        let i = (0..parts)
            .min_by(|x, y| sums[*x].total_cmp(&sums[*y]))
            .unwrap();
        sums[i] += t;
    }
    sums
}

#[test]
fn sglang_lists_registered_in_code_become_batches_parts_and_pipelines() {
    require_engine();
    // A Python image the test builds: Debian's python3 over scratch, as `python.rs`.
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("debian-python");
    std::fs::create_dir_all(&cache).unwrap();
    let rootfs = crate::python::debian_rootfs(&cache);
    let ctx = tempfile::tempdir().unwrap();
    let linked = std::process::Command::new("cp")
        .arg("-al")
        .arg(&rootfs)
        .arg(ctx.path().join("rootfs"))
        .status()
        .unwrap();
    assert!(linked.success());
    std::fs::write(
        ctx.path().join("Dockerfile"),
        format!(
            "FROM scratch\nLABEL org.cibox.test.nonce={}\nCOPY rootfs/ /\nENV PATH=/usr/bin:/bin\n",
            nonce()
        ),
    )
    .unwrap();
    let base = docker_build_dir(ctx.path(), &[]);
    let base_name = own_name("sgl-base", &base.0);
    assert!(
        std::process::Command::new("docker")
            .args(["tag", &base.0, &base_name])
            .status()
            .unwrap()
            .success()
    );
    let p = Project::new(SGLANG);
    p.write(
        "image/Dockerfile",
        format!("FROM {base_name}\nCOPY nonce /nonce\n"),
    );
    p.write("image/nonce", nonce());
    let built = {
        let _store = image_store_lock(false);
        p.cibox(&["image", "build"])
    };
    built.ok();
    let image = ImageGuard(built.stdout.trim().to_string());
    p.write("test/ci_collect.py", COLLECTOR);
    // The markers the test files import: no-ops at run time (`ci_register.py:62-163`).
    p.write(
        "python/sglang/test/ci/ci_register.py",
        "def register_cpu_ci(*a, **k):\n    return None\n\n\ndef register_cuda_ci(*a, **k):\n    return None\n\n\ndef register_amd_ci(*a, **k):\n    return None\n",
    );
    // SGLang's 921 per-commit registrations (est_time, suite, GPUs), one file each, as
    // test files register them (`register_cuda_ci(est_time=…, suite=…)`, and the CPU
    // suites' `register_cpu_ci`, two of them `est_time=0`:
    // `test/registered/unit/tools/test_get_version_tag.py:36`).
    let data: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/sglang-est-times.json")).unwrap();
    let entries = data["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 921);
    let mut by_suite: std::collections::BTreeMap<String, Vec<(String, f64)>> = Default::default();
    for (i, e) in entries.iter().enumerate() {
        let suite = e["suite"].as_str().unwrap();
        let est = e["est_time_s"].as_f64().unwrap();
        let register = if suite.contains("-cpu") {
            "register_cpu_ci"
        } else {
            "register_cuda_ci"
        };
        let file = format!("test/registered/{suite}/test_{i:04}.py");
        p.write(
            &file,
            format!(
                "import unittest\nfrom sglang.test.ci.ci_register import {register}\n\n{register}(est_time={est}, suite=\"{suite}\")\n\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n\n\nif __name__ == \"__main__\":\n    unittest.main()\n"
            ),
        );
        by_suite
            .entry(suite.to_string())
            .or_default()
            .push((file, est));
    }
    // Left out as SGLang leaves them: disabled, nightly, another backend.
    p.write(
        "test/registered/x/test_disabled.py",
        "register_cuda_ci(est_time=60, suite=\"base-b-test-1-gpu-large\", disabled=\"flaky\")\n",
    );
    p.write(
        "test/registered/x/test_nightly.py",
        "register_cuda_ci(est_time=60, suite=\"base-b-test-1-gpu-large\", nightly=True)\n",
    );
    p.write(
        "test/registered/x/test_amd.py",
        "register_amd_ci(est_time=60, suite=\"base-b-test-1-gpu-large\")\n",
    );
    let list = |args: &[&str]| -> (serde_json::Value, std::time::Duration) {
        let t = std::time::Instant::now();
        let r = run(cibox(p.path())
            .args([&["--json", "batch", "list"][..], args].concat())
            .env("CIBOX_IMAGE", &image.0));
        let took = t.elapsed();
        r.ok();
        (serde_json::from_str(r.stdout.trim()).unwrap(), took)
    };
    let (all, took) = list(&[]);
    let batches = all["batches"].as_array().unwrap();
    let want = [
        "base-a-test-cpu",
        "base-b-test-cpu-arm64",
        "base-b-test-1-gpu-large",
        "base-b-test-4-gpu-b200",
    ];
    assert_eq!(
        batches.len(),
        want.iter().map(|s| by_suite[*s].len()).sum::<usize>(),
        "{all}"
    );
    eprintln!(
        "figure: 4 families, {} batches from 921 registered files, collected and listed in {took:?}",
        batches.len()
    );
    let zero: Vec<&str> = batches
        .iter()
        .filter(|b| b["expected_s"] == 0.0)
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(zero.len(), 2, "{zero:?}");
    let b200 = batches.iter().find(|b| b["family"] == "b200").unwrap();
    assert_eq!(
        (b200["gpus"].as_u64(), b200["gpu_model"].as_str()),
        (Some(4), Some("*B200*"))
    );
    // The parts `--partition` makes are SGLang's LPT parts.
    for (layer, suite, n) in [
        ("base-a-cpu", "base-a-test-cpu", 4),
        ("base-b-large", "base-b-test-1-gpu-large", 5),
    ] {
        let (v, _) = list(&["--layer", layer, "--partition", &format!("1/{n}")]);
        let mut got: Vec<f64> = v["parts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["serial_s"].as_f64().unwrap())
            .collect();
        let mut want = lpt(by_suite[suite].clone(), n);
        got.sort_by(f64::total_cmp);
        want.sort_by(f64::total_cmp);
        assert_eq!(got, want, "{layer}");
        eprintln!("figure: {layer}, {n} parts of {got:?} s");
    }
    // The pipeline at build time: collected, each stage's parts sized by its budget
    // (ceil(sum / (3/4 × budget)), SGLang's compute_partitions.py).
    p.write(".buildkite/bootstrap.yml.j2", BOOTSTRAP);
    p.write(".buildkite/pipeline.yml.j2", UPLOADED);
    p.write(".github/workflows/arm64.yml.j2", GITHUB);
    let r = run(cibox(p.path())
        .args(["workflow", "render", "--print", "pipeline.yml"])
        .env("CIBOX_IMAGE", &image.0));
    r.ok();
    for (layer, suite, budget) in [
        ("base-a-cpu", "base-a-test-cpu", 1800.0),
        ("base-b-large", "base-b-test-1-gpu-large", 1800.0),
        ("base-b-b200", "base-b-test-4-gpu-b200", 3600.0),
    ] {
        let sum: f64 = by_suite[suite].iter().map(|(_, t)| t).sum();
        let parts = (sum / (0.75 * budget)).ceil() as u64;
        let want = format!("  - label: \"{layer}\"\n    key: {layer}\n    parallelism: {parts}\n");
        assert!(r.stdout.contains(&want), "{want}\n{}", r.stdout);
        eprintln!(
            "figure: {layer}: {} files, {sum} s, {parts} parts",
            by_suite[suite].len()
        );
    }
    assert!(
        r.stdout.contains("agents: {queue: \"b200\"}"),
        "{}",
        r.stdout
    );
    // Committed: rendered without collecting (no engine asked), and linted.
    p.cibox(&["workflow", "render"]).ok();
    p.cibox(&["workflow", "lint"]).ok();
    // The CPU stage on arm64 runs through the engine, one batch per registered file.
    let reports = p.path().join("reports");
    let t = std::time::Instant::now();
    let r = run(cibox(p.path()).args([
        "--json",
        "layer",
        "run",
        "arm64",
        "--image",
        &image.0,
        "--reports",
        &reports.display().to_string(),
    ]));
    r.ok();
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(
        v["batches"].as_array().unwrap().len(),
        by_suite["base-b-test-cpu-arm64"].len(),
        "{v}"
    );
    eprintln!(
        "figure: arm64 layer, {} batches, collected and run in {:?}",
        by_suite["base-b-test-cpu-arm64"].len(),
        t.elapsed()
    );
    assert!(collectors_left("cpu-arm64").is_empty());
}

/// A cibox killed (SIGKILL, or SIGINT while `batch list` collects, which it does not
/// catch) while its collector runs leaves no collector behind: the collector's
/// watchdog removes it, as a batch's does.
#[test]
fn a_collector_outlives_no_killed_cibox() {
    for signal in [nix::libc::SIGKILL, nix::libc::SIGINT] {
        let family = if signal == nix::libc::SIGKILL {
            "killedlist"
        } else {
            "interruptedlist"
        };
        let p = busybox_project(
            &collecting("touch /tmp/started; sleep 600", "      timeout: 5m\n").replacen(
                "  suite:",
                &format!("  {family}:"),
                1,
            ),
            "",
        );
        let mut child = p
            .batch_cmd_bare(&["batch", "list"])
            .env("CIBOX_IMAGE", &p.image.0)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            wait_until(60, || !collectors_left(family).is_empty()),
            "{family}: the collector never started"
        );
        unsafe { nix::libc::kill(child.id() as i32, signal) };
        child.wait().unwrap();
        assert!(
            wait_until(20, || collectors_left(family).is_empty()),
            "{family}: left behind: {:?}",
            collectors_left(family)
        );
    }
}
