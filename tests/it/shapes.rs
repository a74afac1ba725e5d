//! Issue 46: the shapes large CIs decide at run time, written as their maintainers
//! would and rendered for both CIs (GitHub's lint, Buildkite's schema), and run through
//! the engine: a batch's working folder, its queue beside its GPU model, manual (block)
//! steps, its HOME, `est_time: 0s`, a layer's warm-up once per part and the budget that
//! sizes its parts.

use crate::common::*;

/// vLLM's steps as `.buildkite/test_areas/*.yaml` (local-inference-lab/vllm 9aaf83ef5)
/// writes them: `compile.yaml:42-51` (AsyncTP on B200: `working_dir: "/vllm-workspace/"`,
/// `device: b200-k8s`, `optional: true`, 2 devices), `compile.yaml:53-58` (2×H100, a
/// change group), `docker.yaml:7` (`device: cpu-small`), `lora.yaml:14`
/// (`parallelism: 4`, still `meta` here); SGLang's stage of 30 minutes
/// (`.github/workflows/pr-test.yml:356`, sglang 8905cbd42) with its DeepGEMM warm-up
/// (`.github/workflows/_pr-test-stage.yml:131-137`) and a file of `est_time=0`
/// (`test/registered/unit/entrypoints/openai/utils.py:31`).
const MANIFEST: &str = r#"version: 1
project: vllm
image: {locks: [cibox.yaml]}
defaults: {timeout: 50m, run: ["pytest -v -s $CIBOX_TEST_FILE"], working_dir: tests}
batches:
  asynctp-correctness-tests-b200:
    gpus: 2
    gpu_model: "*B200*"
    queue: b200-k8s
    working_dir: /vllm-workspace/
    manual: true
    env: {VLLM_TEST_CLEAN_GPU_MEMORY: "1"}
    run: ["pytest -v -s tests/compile/correctness_e2e/test_async_tp.py"]
  distributed-compile-unit-tests-2xh100:
    gpus: 2
    gpu_model: "*H100*"
    timeout: 20m
    run: ["pytest -v -s compile/distributed"]
  docker-build-check:
    gpus: 0
    queue: cpu-small
    timeout: 10m
    run: ["bash ../.buildkite/scripts/check-dockerfile.sh"]
  deepgemm-warmup:
    gpus: 1
    gpu_model: "*H100*"
    est_time: 2m
    run: ["python3 scripts/ci/cuda/warmup_deep_gemm.py lmsys/sglang-ci-dsv3-test:4"]
  test-utils: {gpus: 1, gpu_model: "*H100*", est_time: 0s}
  test-a: {gpus: 1, gpu_model: "*H100*", est_time: 10m}
  test-b: {gpus: 1, gpu_model: "*H100*", est_time: 12m}
  test-c: {gpus: 1, gpu_model: "*H100*", est_time: 9m}
  test-d: {gpus: 1, gpu_model: "*H100*", est_time: 8m}
layers:
  compile: {batches: [asynctp-correctness-tests-b200, distributed-compile-unit-tests-2xh100, docker-build-check]}
  stage-b: {batches: [test-utils, test-a, test-b, test-c, test-d], warmup: deepgemm-warmup, budget: 30m}
workflows:
  buildkite: .buildkite
"#;

/// ci-infra's pipeline as `buildkite/pipeline_generator/buildkite_step.py` builds it
/// (cb564ad): a block step before an optional step (`:319`, `:477-487`), `cd` into the
/// working folder before the commands (`:197-200`), the queue by device (`constants.py:10-13`).
const PIPELINE: &str = r#"steps:
  - label: ":docker: build image"
    key: image-build
    command: cibox image build
    agents: {queue: cpu_queue_premerge}
<% for b in layers.compile.batch_list %>
<% if b.manual %>
  - block: "Run << b.name >>"
    key: block-<< b.name >>
    depends_on: image-build
<% endif %>
  - label: << b.name | yaml >>
    key: << b.name >>
    depends_on: [image-build<% if b.manual %>, block-<< b.name >><% endif %>]
    agents: {queue: << (b.queue or b.gpu_model_label or "cpu_queue_premerge") | yaml >>}
    command: cibox batch run << b.name | shell >> --wait 10m
    timeout_in_minutes: << b.timeout_minutes >>
<% endfor %>
<% set stage = layers["stage-b"] %>
  - label: "stage-b (%n/<< stage.parts >>), warm-up << stage.warmup.name >>"
    key: stage-b
    depends_on: image-build
    agents: {queue: << stage.gpu_models[0] | yaml >>}
    parallelism: << stage.parts >>
    command: cibox layer run stage-b --wait 10m
    timeout_in_minutes: << stage.budget_minutes >>
"#;

/// The same for GitHub: a manual batch runs on `workflow_dispatch`, when a person picks
/// it (GitHub has no block step; an environment with required reviewers is the other
/// way); the queue is the runner label beside `self-hosted`.
const WORKFLOW: &str = r#"name: << project >> compile
on:
  push:
    branches: [main]
  workflow_dispatch:
    inputs:
      manual:
        description: A manual batch to run
        type: choice
        options: << layers.compile.batch_list | selectattr("manual") | map(attribute="name") | list | tojson >>
permissions:
  contents: read
jobs:
<% for b in layers.compile.batch_list %>
  << b.name >>:
<% if b.manual %>
    if: github.event_name == 'workflow_dispatch' && inputs.manual == << b.name | ghstr >>
<% endif %>
    runs-on: [self-hosted, << (b.queue or b.gpu_model_label or "cpu") >>]
    timeout-minutes: << b.timeout_minutes + 15 >>
    steps:
      - uses: actions/checkout@v4
      - run: cibox batch run << b.name | shell >> --wait 10m
<% endfor %>
  stage-b:
    runs-on: [self-hosted, h100]
    timeout-minutes: << layers["stage-b"].budget_minutes >>
    strategy:
      fail-fast: false
      matrix:
        part: << range(1, layers["stage-b"].parts + 1) | list | tojson >>
    steps:
      - uses: actions/checkout@v4
      - run: cibox layer run stage-b --partition ${{ matrix.part }}/<< layers["stage-b"].parts >> --wait 10m
"#;

#[test]
fn vllm_and_sglang_shapes_render_for_buildkite_and_github() {
    let p = Project::new(MANIFEST);
    p.write(".buildkite/pipeline.yml.j2", PIPELINE);
    p.write(".github/workflows/compile.yml.j2", WORKFLOW);
    let r = p.cibox(&["workflow", "render"]);
    r.ok();
    let bk = std::fs::read_to_string(p.path().join(".buildkite/pipeline.yml")).unwrap();
    for want in [
        "  - block: \"Run asynctp-correctness-tests-b200\"",
        "    depends_on: [image-build, block-asynctp-correctness-tests-b200]",
        "    agents: {queue: \"b200-k8s\"}",
        "    agents: {queue: \"h100\"}",
        "    agents: {queue: \"cpu-small\"}",
        // 39 minutes of tests (0s, 10m, 12m, 9m, 8m) in parts of 30 × 3/4 − 2 = 20.5
        // minutes: 2 parts, as SGLang's compute_partitions.py:169 sizes them.
        "    parallelism: 2",
        "warm-up deepgemm-warmup",
        "    timeout_in_minutes: 30",
    ] {
        assert!(bk.contains(want), "{want} missing from:\n{bk}");
    }
    // Only the manual step is blocked.
    assert_eq!(bk.matches("- block:").count(), 1, "{bk}");
    let gh = std::fs::read_to_string(p.path().join(".github/workflows/compile.yml")).unwrap();
    for want in [
        "options: [\"asynctp-correctness-tests-b200\"]",
        "    if: github.event_name == 'workflow_dispatch' && inputs.manual == 'asynctp-correctness-tests-b200'",
        "    runs-on: [self-hosted, b200-k8s]",
        "    runs-on: [self-hosted, cpu-small]",
        "        part: [1, 2]",
        "--partition ${{ matrix.part }}/2",
    ] {
        assert!(gh.contains(want), "{want} missing from:\n{gh}");
    }
    p.cibox(&["workflow", "render", "--check"]).ok();
    p.cibox(&["workflow", "lint"]).ok();
}

#[test]
fn a_queue_or_folder_a_ci_cannot_take_is_refused_with_one_line() {
    let p = Project::new(&MANIFEST.replace("queue: b200-k8s", "queue: \"b200\\nk8s\""));
    let r = p.cibox(&["workflow", "render"]);
    r.fails_with(
        2,
        "batches.asynctp-correctness-tests-b200.queue: `b200\\nk8s` is not a queue name",
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    let p =
        Project::new(&MANIFEST.replace("working_dir: /vllm-workspace/", "working_dir: ../../etc"));
    p.cibox(&["workflow", "render"]).fails_with(
        2,
        "batches.asynctp-correctness-tests-b200.working_dir: `../../etc`: holds `..`",
    );
    let p = Project::new(&MANIFEST.replace("budget: 30m", "budget: 2m"));
    p.cibox(&["workflow", "render"])
        .fails_with(2, "layers.stage-b.budget: must leave room for the tests");
}

fn step(name: &str, extra: &str, run: &str) -> String {
    format!("  {name}:\n    gpus: 0\n    timeout: 1m\n{extra}    run: [{run:?}, {JUNIT_OK:?}]\n")
}

#[test]
fn a_batch_runs_in_its_working_dir_with_the_home_it_asks() {
    let p = busybox_project(
        &format!(
            "{}{}{}",
            step(
                "here",
                "    working_dir: sub/dir\n    env: {HOME: /work/home}\n",
                "mkdir -p /work/home && [ \"$(pwd)\" = /work/sub/dir ] && [ \"$HOME\" = /work/home ]"
            ),
            step(
                "plain",
                "",
                "[ \"$(pwd)\" = /work ] && [ \"$HOME\" = /tmp ]"
            ),
            step("nowhere", "    working_dir: /nope\n", "true"),
        ),
        "",
    );
    p.project.write("sub/dir/.keep", "");
    run(&mut p.batch_cmd(&["batch", "run", "here", "plain"])).ok();
    let r = run(&mut p.batch_cmd(&["batch", "run", "nowhere"]));
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stdout
            .contains("cibox: working_dir /nope: no such folder in the container")
            || r.stderr
                .contains("cibox: working_dir /nope: no such folder in the container"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
}

#[test]
fn a_layers_warm_up_runs_first_in_every_part_and_a_failed_one_stops_the_part() {
    let p = busybox_project(
        &format!(
            "{}{}{}{}",
            step("warm", "    est_time: 1m\n", "true"),
            step("a", "    est_time: 5m\n", "true"),
            step("b", "    est_time: 5m\n", "true"),
            step("z", "    est_time: 0s\n", "true"),
        ),
        "layers:\n  stage: {batches: [a, b, z], warmup: warm, budget: 10m}\n",
    );
    let ran = |args: &[&str]| -> Vec<String> {
        let r = run(&mut p.batch_cmd(args));
        r.ok();
        let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
        v["batches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["batch"].as_str().unwrap().to_string())
            .collect()
    };
    let one = ran(&[
        "--json",
        "layer",
        "run",
        "stage",
        "--partition",
        "1/2",
        "--parallel",
    ]);
    let two = ran(&["--json", "layer", "run", "stage", "--partition", "2/2"]);
    assert_eq!(one[0], "warm", "{one:?}");
    assert_eq!(two[0], "warm", "{two:?}");
    let mut all: Vec<String> = one[1..].iter().chain(&two[1..]).cloned().collect();
    all.sort();
    assert_eq!(all, ["a", "b", "z"]);
    // A warm-up that fails: the part's batches do not start, each saying why.
    p.project.write(
        "cibox.yaml",
        std::fs::read_to_string(p.project.path().join("cibox.yaml"))
            .unwrap()
            .replacen("run: [\"true\"", "run: [\"exit 3\"", 1),
    );
    let r = run(&mut p.batch_cmd(&["--json", "layer", "run", "stage", "--parallel"]));
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout
            .contains("the layer's warm-up, batch warm, did not pass")
            || r.stderr
                .contains("the layer's warm-up, batch warm, did not pass"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
}

/// vLLM's sharded steps as a maintainer ports them (local-inference-lab/vllm 9aaf83ef5):
/// `.buildkite/test_areas/kernels.yaml:79-93` (Kernels MoE Test, `parallelism: 5`, two
/// pytest commands each given `--shard-id`/`--num-shards`) and `lora.yaml:5-14` (LoRA,
/// `parallelism: 4`, on `h200_35gb`). One batch each with `shards:`; the LoRA command
/// keeps Buildkite's variables (`$$` is Buildkite's escape, `$` here: cibox sets them
/// in each shard's container), the MoE one uses cibox's own.
const SHARDED: &str = r#"version: 1
project: vllm
image: {locks: [cibox.yaml]}
defaults: {working_dir: tests}
batches:
  kernels-moe-test:
    gpus: 1
    timeout: 25m
    shards: 5
    run:
      - pytest -v -s kernels/moe --ignore=kernels/moe/test_modular_oai_triton_moe.py --shard-id=$CIBOX_SHARD_INDEX --num-shards=$CIBOX_SHARD_COUNT
      - pytest -v -s kernels/moe/test_modular_oai_triton_moe.py --shard-id=$CIBOX_SHARD_INDEX --num-shards=$CIBOX_SHARD_COUNT
  lora:
    gpus: 1
    gpu_model: "*H200*"
    queue: h200_35gb
    timeout: 30m
    shards: 4
    run: ["pytest -v -s lora --shard-id=$BUILDKITE_PARALLEL_JOB --num-shards=$BUILDKITE_PARALLEL_JOB_COUNT --ignore=lora/test_chatglm3_tp.py --ignore=lora/test_llama_tp.py"]
layers:
  kernels: {batches: [kernels-moe-test, lora]}
workflows:
  buildkite: .buildkite
"#;

/// ci-infra's rendering of a step with `parallelism` (vllm-project/ci-infra cb564ad,
/// `buildkite/pipeline_generator/buildkite_step.py:260-261`: the step's `parallelism`
/// copied onto the command step; the docker plugin's `propagate-environment: true`,
/// `plugin/docker_plugin.py:8`, carries `BUILDKITE_PARALLEL_JOB` into the container).
/// Here each job runs `cibox batch run NAME`: the job's `BUILDKITE_PARALLEL_JOB` is its
/// part of the batch's shards, one shard a job.
const SHARDED_PIPELINE: &str = r#"steps:
  - label: ":docker: build image"
    key: image-build
    command: cibox image build
    agents: {queue: cpu_queue_premerge}
<% for b in layers.kernels.batch_list %>
  - block: "Run << b.name >>"
    key: block-<< b.name >>
    depends_on: image-build
  - label: "<< b.name >> %N"
    key: << b.name >>
    depends_on: [image-build, block-<< b.name >>]
    agents: {queue: << (b.queue or b.gpu_model_label or "gpu_1_queue") | yaml >>}
<% if b.shards > 1 %>
    parallelism: << b.shards >>
<% endif %>
    command: cibox batch run << b.name | shell >> --wait 10m
    timeout_in_minutes: << b.timeout_minutes >>
<% endfor %>
"#;

/// The same for GitHub: a matrix axis of the shards, each job its part.
const SHARDED_WORKFLOW: &str = r#"name: << project >> kernels
on:
  push:
    branches: [main]
permissions:
  contents: read
jobs:
<% for b in layers.kernels.batch_list %>
  << b.name >>:
    runs-on: [self-hosted, << (b.queue or "gpu") >>]
    timeout-minutes: << b.timeout_minutes + 15 >>
    strategy:
      fail-fast: false
      matrix:
        shard: << range(1, b.shards + 1) | list | tojson >>
    steps:
      - uses: actions/checkout@v4
      - run: cibox batch run << b.name | shell >> --partition ${{ matrix.shard }}/<< b.shards >> --wait 10m
<% endfor %>
"#;

#[test]
fn vllms_sharded_steps_render_for_buildkite_and_github() {
    let p = Project::new(SHARDED);
    p.write(".buildkite/pipeline.yml.j2", SHARDED_PIPELINE);
    p.write(".github/workflows/kernels.yml.j2", SHARDED_WORKFLOW);
    // Rendering checks the pipeline against Buildkite's schema.
    p.cibox(&["workflow", "render"]).ok();
    let bk = std::fs::read_to_string(p.path().join(".buildkite/pipeline.yml")).unwrap();
    for want in [
        "  - label: \"kernels-moe-test %N\"",
        "    parallelism: 5",
        "    parallelism: 4",
        "    agents: {queue: \"h200_35gb\"}",
        "    command: cibox batch run kernels-moe-test --wait 10m",
    ] {
        assert!(bk.contains(want), "{want} missing from:\n{bk}");
    }
    let gh = std::fs::read_to_string(p.path().join(".github/workflows/kernels.yml")).unwrap();
    for want in [
        "        shard: [1, 2, 3, 4, 5]",
        "        shard: [1, 2, 3, 4]",
        "--partition ${{ matrix.shard }}/5",
    ] {
        assert!(gh.contains(want), "{want} missing from:\n{gh}");
    }
    p.cibox(&["workflow", "render", "--check"]).ok();
    p.cibox(&["workflow", "lint"]).ok();
    // A count no CI can run: one line at its place, nothing written.
    for (bad, why) in [
        (
            "shards: 5",
            "batches.kernels-moe-test.shards: must be 1 to 256",
        ),
        (
            "shards: 0",
            "batches.kernels-moe-test.shards: must be 1 to 256",
        ),
        ("shards: 5.5", "batches.kernels-moe-test.shards"),
    ] {
        let text = if bad == "shards: 5" {
            SHARDED.replace("shards: 5", "shards: 100000")
        } else {
            SHARDED.replace("shards: 5", bad)
        };
        let q = Project::new(&text);
        q.write(".buildkite/pipeline.yml.j2", SHARDED_PIPELINE);
        let r = q.cibox(&["workflow", "render"]);
        r.fails_with(2, why);
        assert!(
            r.stderr
                .contains("cibox.yaml:9:13: batches.kernels-moe-test.shards"),
            "{}",
            r.stderr
        );
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        assert!(!q.path().join(".buildkite/pipeline.yml").exists());
    }
}

/// pytest-shard's choice in a shell: of tests t0..t5, shard I of N runs those whose
/// number is I modulo N, each a JUnit case naming its shard.
fn sharded_step(fail_at: Option<u32>) -> String {
    let fail = fail_at.map_or(String::new(), |i| {
        format!("[ \"$CIBOX_SHARD_INDEX\" != {i} ] || exit 3; ")
    });
    serde_json::to_string(&format!(
        "[ \"$BUILDKITE_PARALLEL_JOB\" = \"$CIBOX_SHARD_INDEX\" ] && [ \"$BUILDKITE_PARALLEL_JOB_COUNT\" = \"$CIBOX_SHARD_COUNT\" ] || exit 9; \
         [ \"$(echo $CUDA_VISIBLE_DEVICES | tr , '\\n' | grep -c '^GPU-')\" = 2 ] || exit 8; {fail}\
         {{ echo '<testsuite>'; for t in 0 1 2 3 4 5; do [ $((t % CIBOX_SHARD_COUNT)) = \"$CIBOX_SHARD_INDEX\" ] && echo \"<testcase classname=\\\"shard$CIBOX_SHARD_INDEX\\\" name=\\\"t$t\\\"/>\"; done; echo '</testsuite>'; }} > $CIBOX_REPORTS/junit.xml"
    ))
    .unwrap()
}

#[test]
fn a_sharded_batch_runs_as_its_shards_each_with_its_gpus_and_reports_as_one() {
    let p = busybox_project(
        &format!(
            "  moe:\n    gpus: 2\n    timeout: 2m\n    shards: 3\n    run: [{}]\n  bad:\n    gpus: 2\n    timeout: 2m\n    shards: 2\n    run: [{}]\n",
            sharded_step(None),
            sharded_step(Some(1)),
        ),
        "",
    );
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("fake").display().to_string();
    let r = run(cibox(p.project.path()).args([
        "gpu", "fake", "--vendor", "nvidia", "--count", "4", "--dir", &dir,
    ]));
    r.ok();
    let vars: Vec<(String, String)> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
        .collect();
    let cmd = |args: &[&str]| {
        let mut c = p.batch_cmd(args);
        for (k, v) in &vars {
            c.env(k, v);
        }
        c
    };
    // What an earlier run of the batch left in its folder is gone before its shards run.
    std::fs::create_dir_all(p.reports().join("moe")).unwrap();
    std::fs::write(p.reports().join("moe/.cibox-batch"), "").unwrap();
    std::fs::write(p.reports().join("moe/old.xml"), "<testsuite/>").unwrap();
    let r = run(&mut cmd(&["--json", "batch", "run", "moe", "--wait", "1m"]));
    r.ok();
    assert!(!p.reports().join("moe/old.xml").exists());
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    // One batch in the outcome, its shards listed; 6 tests, each once.
    assert_eq!(v["batches"].as_array().unwrap().len(), 1, "{v}");
    let moe = &v["batches"][0];
    assert_eq!(
        (moe["batch"].as_str(), moe["status"].as_str()),
        (Some("moe"), Some("passed"))
    );
    assert_eq!(moe["tests"]["total"], 6, "{moe}");
    assert_eq!(moe["shards"].as_array().unwrap().len(), 3, "{moe}");
    assert_eq!(moe["gpus"].as_array().unwrap().len(), 6, "{moe}");
    for k in 1..=3 {
        let dir = p.reports().join("moe").join(format!("shard-{k}"));
        let text = std::fs::read_to_string(dir.join("result.json")).unwrap();
        let shard: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(shard["shard"]["index"], k - 1, "{shard}");
        assert_eq!(shard["gpus"].as_array().unwrap().len(), 2, "{shard}");
        assert!(dir.join("log.txt").exists());
    }
    assert_eq!(
        p.result("moe")["shards"][2]["result"],
        "shard-3/result.json"
    );
    let junit = std::fs::read_to_string(p.reports().join("junit.xml")).unwrap();
    for t in 0..6 {
        assert!(junit.contains(&format!("name=\"t{t}\"")), "t{t}: {junit}");
    }
    let summary = std::fs::read_to_string(p.reports().join("summary.md")).unwrap();
    assert!(summary.contains("moe"), "{summary}");
    assert!(
        !summary.contains("moe[1/3]"),
        "one batch, not three: {summary}"
    );
    // A shard that fails fails the batch, named.
    let r = run(&mut cmd(&["--json", "batch", "run", "bad", "--wait", "1m"]));
    assert_eq!(r.code, 1, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let bad = &v["batches"][0];
    assert_eq!(
        (bad["batch"].as_str(), bad["status"].as_str()),
        (Some("bad"), Some("failed"))
    );
    assert!(
        bad["message"].as_str().unwrap().starts_with(
            "1 of 2 shards did not pass: shard 2/2 failed (shard-2/): a step exited with 3"
        ),
        "{bad}"
    );
    // As the jobs of a Buildkite step with `parallelism: 3`: each job one shard.
    for job in 0..3u32 {
        let r = run(cmd(&["--json", "batch", "run", "moe", "--wait", "1m"])
            .env("BUILDKITE", "true")
            .env("BUILDKITE_AGENT_ACCESS_TOKEN", "")
            .env("BUILDKITE_PARALLEL_JOB", job.to_string())
            .env("BUILDKITE_PARALLEL_JOB_COUNT", "3")
            .env("PATH", "/usr/bin:/bin"));
        r.ok();
        let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
        let moe = &v["batches"][0];
        assert_eq!(moe["batch"], "moe", "{v}");
        let shards = moe["shards"].as_array().unwrap();
        assert_eq!(shards.len(), 1, "{moe}");
        assert_eq!(shards[0]["index"], job, "{moe}");
        assert_eq!(moe["tests"]["total"], 2, "{moe}");
    }
    assert!(p.containers().is_empty());
}
