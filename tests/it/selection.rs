//! Change selection over a real git repository, as vLLM's and SGLang's own logic
//! selects: deleted files and renames' old names count, `exclude:` and `paths:`
//! (vLLM's `source_file_dependencies`) and braces work, a docs-only change selects
//! nothing where the groups leave docs out, a pattern that matches nothing is warned
//! about, an extended glob is refused by name; a test list's file is one row per entry
//! that `changed run` takes back exactly.

use std::path::Path;

use crate::common::*;

const MANIFEST: &str = r#"version: 1
project: sel
image: {locks: [cibox.yaml]}
defaults: {timeout: 10m, run: [x]}
batches:
  unit: {gpus: 0, tests: ["tests/**/test_*.py"]}
  qwen:
    gpus: 2
    run: ["python $CIBOX_TEST_FILE $CIBOX_TEST_ARGS"]
    each:
      - {file: tests/test_qwen.py, args: --fsdp}
      - {file: tests/test_qwen.py, name: qwen-megatron, gpus: 4, args: --megatron}
changed:
  patterns: ["tests/**/test_*.py"]
  exclude: ["tests/**/test_*_skip.py"]
  default_gpus: 1
  groups:
    main:
      patterns: ["python/pkg/**", "tests/**"]
      exclude: ["python/pkg/gen/**", "**/*.md"]
      kind: files
    dist:
      paths: [vllm/distributed, "vllm/config.py"]
      kind: files
    engines:
      patterns: ["vllm/{engine,executor}/**"]
      kind: files
    docs:
      patterns: ["**/*.md", "docs/**"]
      kind: files
"#;

fn write(d: &Path, rel: &str, text: &str) {
    let p = d.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// A repository at its base commit; returns it and the base's SHA.
fn repo(manifest: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    git(d, &["init", "-q", "-b", "main"]);
    write(d, "cibox.yaml", manifest);
    for (rel, text) in [
        ("tests/test_old.py", "NUM_GPUS = 1\n"),
        ("tests/test_old_skip.py", "NUM_GPUS = 1\n"),
        ("tests/test_gone.py", "NUM_GPUS = 1\n"),
        ("tests/test_moved.py", "NUM_GPUS = 2\n"),
        ("tests/test_qwen.py", "import torch\n"),
        ("vllm/distributed/comm.py", "x = 1\n"),
        ("vllm/distributed_old/comm.py", "x = 1\n"),
        ("vllm/config.py", "x = 1\n"),
        ("vllm/engine/llm.py", "x = 1\n"),
        ("python/pkg/a.py", "x = 1\n"),
        ("python/pkg/gen/b.py", "x = 1\n"),
        ("python/pkg/README.md", "# pkg\n"),
        ("README.md", "# project\n"),
        ("docs/index.md", "# docs\n"),
    ] {
        write(d, rel, text);
    }
    git(d, &["add", "-A"]);
    git(d, &["commit", "-qm", "base"]);
    let base = git(d, &["rev-parse", "HEAD"]);
    git(d, &["checkout", "-q", "-b", "pr"]);
    (dir, base)
}

fn changed_json(d: &Path, base: &str) -> (serde_json::Value, String) {
    let r = run(cibox(d).args(["--json", "changed", "--base", base]));
    r.ok();
    (serde_json::from_str(r.stdout.trim()).unwrap(), r.stderr)
}

fn files(v: &serde_json::Value, group: &str) -> Vec<String> {
    v["groups"][group]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect()
}

fn test_files(v: &serde_json::Value) -> Vec<String> {
    v["include"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["test_file"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn deletions_renames_exclusions_braces_and_path_prefixes_select_as_vllm_and_sglang_do() {
    let (dir, base) = repo(MANIFEST);
    let d = dir.path();
    // SGLang 3d922a51f: a commit that only deletes a test still selects its suites.
    git(d, &["rm", "-q", "tests/test_gone.py"]);
    git(d, &["commit", "-qm", "delete a test"]);
    let (v, _) = changed_json(d, &base);
    assert_eq!(files(&v, "main"), ["tests/test_gone.py"], "{v}");
    assert_eq!(v["groups"]["main"]["changed"], true);
    // Nothing to run for it: a test gone at head is no row.
    assert_eq!(v["has_tests"], false, "{v}");

    // vLLM cd49a05d5: a deleted source file under a step's dependency; a rename whose
    // old name is under a braced pattern; an excluded file and a sibling folder that
    // merely starts like a dependency select nothing.
    git(d, &["rm", "-q", "vllm/distributed/comm.py"]);
    std::fs::create_dir_all(d.join("vllm/other")).unwrap();
    git(d, &["mv", "vllm/engine/llm.py", "vllm/other/llm.py"]);
    write(d, "vllm/distributed_old/comm.py", "x = 2\n");
    write(d, "python/pkg/gen/b.py", "x = 2\n");
    std::fs::create_dir_all(d.join("tests/deep")).unwrap();
    git(
        d,
        &["mv", "tests/test_moved.py", "tests/deep/test_renamed.py"],
    );
    write(d, "tests/test_new_skip.py", "NUM_GPUS = 1\n");
    git(d, &["add", "-A"]);
    git(d, &["commit", "-qm", "more"]);
    let (v, stderr) = changed_json(d, &base);
    assert_eq!(files(&v, "dist"), ["vllm/distributed/comm.py"], "{v}");
    assert_eq!(
        files(&v, "engines"),
        ["vllm/engine/llm.py"],
        "a rename's old name counts: {v}"
    );
    let main = files(&v, "main");
    assert!(main.contains(&"tests/test_moved.py".to_string()), "{v}");
    assert!(
        main.contains(&"tests/deep/test_renamed.py".to_string()),
        "{v}"
    );
    assert!(
        !main.iter().any(|f| f.starts_with("python/pkg/gen/")),
        "{v}"
    );
    // The test matrix: the renamed test under its new name; the excluded one not.
    assert_eq!(test_files(&v), ["tests/deep/test_renamed.py"], "{v}");
    assert_eq!(v["include"][0]["num_gpus"], 2, "{v}");
    // `docs` matches files of the tree, if none changed: no warning for it.
    assert!(!stderr.contains("matches no file"), "{stderr}");
}

#[test]
fn a_docs_only_change_selects_nothing_where_the_groups_leave_docs_out() {
    let (dir, base) = repo(MANIFEST);
    let d = dir.path();
    write(d, "README.md", "# project, better\n");
    write(d, "python/pkg/README.md", "# pkg, better\n");
    write(d, "docs/index.md", "# more docs\n");
    git(d, &["commit", "-qam", "docs"]);
    let (v, _) = changed_json(d, &base);
    assert_eq!(v["has_tests"], false, "{v}");
    assert_eq!(v["groups"]["main"]["changed"], false, "{v}");
    assert_eq!(v["groups"]["dist"]["changed"], false, "{v}");
    assert_eq!(v["groups"]["docs"]["changed"], true, "{v}");
}

#[test]
fn patterns_that_match_nothing_are_warned_and_other_tools_globs_are_refused_by_name() {
    let stale = MANIFEST.replace(
        "    docs:\n      patterns: [\"**/*.md\", \"docs/**\"]\n",
        "    docs:\n      patterns: [\"**/*.md\", \"doc/**\"]\n      paths: [vllm/distrbuted]\n",
    );
    let (dir, base) = repo(&stale);
    let d = dir.path();
    write(d, "python/pkg/a.py", "x = 2\n");
    git(d, &["commit", "-qam", "code"]);
    let (v, stderr) = changed_json(d, &base);
    assert_eq!(v["groups"]["main"]["changed"], true, "{v}");
    for want in [
        "warning: changed.groups.docs.patterns: `doc/**` matches no file in the tree of HEAD nor any changed path",
        "warning: changed.groups.docs.paths: `vllm/distrbuted` matches no file in the tree of HEAD nor any changed path",
    ] {
        assert!(stderr.contains(want), "{want} not in:\n{stderr}");
    }
    assert_eq!(stderr.matches("matches no file").count(), 2, "{stderr}");

    // SGLang's extended globs, and paths-filter's negations, are refused where they
    // are written, saying what to write instead.
    for (pattern, want) in [
        (
            "python/sglang/!(multimodal_gen)/**",
            "cibox.yaml:19:18: changed.groups.main.patterns.0: `python/sglang/!(multimodal_gen)/**` is an extended glob (`!(…)`), which changed patterns do not read",
        ),
        (
            "!docs/**",
            "starts with `!`, which is no negation here: put the pattern without it under `exclude`",
        ),
    ] {
        std::fs::write(
            d.join("cibox.yaml"),
            MANIFEST.replace(
                "[\"python/pkg/**\", \"tests/**\"]",
                &format!("[{pattern:?}, \"tests/**\"]"),
            ),
        )
        .unwrap();
        run(cibox(d).args(["changed", "--base", &base])).fails_with(2, want);
    }
    std::fs::write(
        d.join("cibox.yaml"),
        MANIFEST.replace("paths: [vllm/distributed,", "paths: [\"vllm/*\","),
    )
    .unwrap();
    run(cibox(d).args(["changed", "--base", &base])).fails_with(
        2,
        "changed.groups.dist.paths.0: `vllm/*` holds a glob character",
    );
}

#[test]
fn a_test_lists_file_is_a_row_per_entry_and_changed_run_takes_them_back_exactly() {
    let manifest = MANIFEST.replace(
        "  default_gpus: 1\n",
        "  default_gpus: 1\n  run: {command: \"pytest $CIBOX_TEST_FILE\", timeout: 5m}\n",
    );
    let (dir, base) = repo(&manifest);
    let d = dir.path();
    write(d, "tests/test_qwen.py", "import torch  # changed\n");
    git(d, &["commit", "-qam", "qwen"]);
    let (v, _) = changed_json(d, &base);
    let rows = v["include"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    assert_eq!(
        rows[0],
        serde_json::json!({"test_file": "tests/test_qwen.py", "num_gpus": 2, "batch": "qwen-test_qwen", "args": "--fsdp", "image": "default", "gpu_model": null}),
        "{v}"
    );
    assert_eq!(rows[1]["batch"], "qwen-megatron");
    assert_eq!(rows[1]["args"], "--megatron");
    assert_eq!(rows[1]["num_gpus"], 4);

    // What `changed` printed is taken (it goes on to verify the image, which this
    // project has none of: exit 3, past every check of the matrix).
    let matrix = serde_json::json!({"include": rows}).to_string();
    let changed_run = |matrix: &str| {
        run(cibox(d)
            .args([
                "changed",
                "run",
                "--matrix-env",
                "M",
                "--image",
                &format!("sha256:{}", "0".repeat(64)),
            ])
            .env("M", matrix))
    };
    let r = changed_run(&matrix);
    assert_eq!(r.code, 3, "{}\n{}", r.stdout, r.stderr);
    // One row of it too (a workflow's `toJSON(matrix)`).
    assert_eq!(changed_run(&rows[1].to_string()).code, 3);
    // A row for the file without its entry would run it without the entry's arguments,
    // image and container: refused, and so is a row the manifest disagrees with.
    for (row, want) in [
        (
            serde_json::json!({"test_file": "tests/test_qwen.py", "num_gpus": 2}),
            "`tests/test_qwen.py` is run by test list entries (qwen-test_qwen, qwen-megatron): give each row the entry's `batch`",
        ),
        (
            serde_json::json!({"test_file": "tests/test_qwen.py", "num_gpus": 2, "batch": "qwen-test_qwen", "args": "--other"}),
            "the row of batch `qwen-test_qwen` says args \"--other\", the manifest \"--fsdp\"",
        ),
        (
            serde_json::json!({"test_file": "tests/test_qwen.py", "num_gpus": 8, "batch": "qwen-megatron"}),
            "the row of batch `qwen-megatron` says num_gpus 8, the manifest 4",
        ),
        (
            serde_json::json!({"test_file": "tests/test_old.py", "num_gpus": 2, "batch": "qwen-megatron"}),
            "`qwen-megatron` is no test list entry's batch for `tests/test_old.py`",
        ),
        (
            serde_json::json!({"test_file": "tests/test_old.py", "num_gpus": 0, "batch": "unit"}),
            "`unit` is no test list entry's batch",
        ),
    ] {
        changed_run(&row.to_string()).fails_with(2, want);
    }
}

#[test]
fn unregistered_prints_json_under_json() {
    let (dir, _) = repo(MANIFEST);
    let d = dir.path();
    std::fs::write(
        d.join("cibox.yaml"),
        MANIFEST.replace(
            "tests: [\"tests/**/test_*.py\"]",
            "tests: [\"tests/test_{old,qwen}.py\"]",
        ),
    )
    .unwrap();
    let r = run(cibox(d).args(["--json", "changed", "--unregistered"]));
    assert_eq!(r.code, 1, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"unregistered": ["tests/test_gone.py", "tests/test_moved.py"]})
    );
}

/// verl's `paths:` lists (`.github/workflows/e2e_ppo_trainer_megatron_vllm.yml:56-78`,
/// volcengine/verl b178a3cd5) as one group in GitHub's order: a file taken back after a
/// `!` is selected, the last pattern that matches decides.
const VERL: &str = r#"version: 1
project: verl
image: {locks: [cibox.yaml]}
defaults: {timeout: 10m, run: [x]}
batches:
  e2e: {gpus: 1}
changed:
  groups:
    e2e_ppo_trainer_megatron_vllm:
      kind: files
      filter:
        - "**/*.py"
        - "!docker/**"
        - "!**/*.md"
        - "!docs/**"
        - "!examples/**"
        - "!tests/**"
        - "!verl/trainer/main_*.py"
        - "!verl/workers/**/*dp_*.py"
        - ".github/workflows/e2e_ppo_trainer_megatron_vllm.yml"
        - "examples/data_preprocess/gsm8k.py"
        - "tests/special_e2e/run_ppo_trainer_megatron.sh"
        - "verl/trainer/main_ppo.py"
"#;

#[test]
fn a_filter_list_selects_in_githubs_order_as_verls_workflows_do() {
    let (dir, base) = repo(VERL);
    let d = dir.path();
    for (rel, text) in [
        ("examples/data_preprocess/gsm8k.py", "x = 2\n"),
        ("examples/data_preprocess/geo3k.py", "x = 2\n"),
        ("verl/trainer/main_ppo.py", "x = 2\n"),
        ("verl/trainer/main_eval.py", "x = 2\n"),
        ("verl/workers/actor/dp_actor.py", "x = 2\n"),
        ("verl/workers/megatron_workers.py", "x = 2\n"),
        ("tests/special_e2e/run_ppo_trainer_megatron.sh", "x\n"),
        ("tests/test_x.py", "x = 2\n"),
        ("docs/index.md", "# changed\n"),
    ] {
        write(d, rel, text);
    }
    git(d, &["add", "-A"]);
    git(d, &["commit", "-qm", "pr"]);
    let (v, _) = changed_json(d, &base);
    assert_eq!(
        files(&v, "e2e_ppo_trainer_megatron_vllm"),
        [
            "examples/data_preprocess/gsm8k.py",
            "tests/special_e2e/run_ppo_trainer_megatron.sh",
            "verl/trainer/main_ppo.py",
            "verl/workers/megatron_workers.py",
        ],
        "{v}"
    );
    // Beside `patterns`, `filter` is refused: which decides would be unclear.
    let p = Project::new(&VERL.replace(
        "      kind: files\n      filter:",
        "      kind: files\n      exclude: [\"**/*.md\"]\n      filter:",
    ));
    p.cibox(&["changed", "--unregistered"]).fails_with(
        2,
        "changed.groups.e2e_ppo_trainer_megatron_vllm.filter: stands alone",
    );
    // Only exclusions take nothing: refused, saying so.
    let p = Project::new(
        "version: 1\nproject: x\nimage: {locks: [cibox.yaml]}\ndefaults: {timeout: 1m, run: [x]}\nbatches:\n  a: {gpus: 0}\nchanged:\n  filter: [\"!docs/**\"]\n",
    );
    p.cibox(&["changed", "--unregistered"])
        .fails_with(2, "changed.filter.0: only excludes (`!`)");
}

/// Issue 48: `tests/**test_*.py` matched one folder deep, silently; vLLM's ci-infra
/// lists a rename by its new name alone (`git diff --name-only`,
/// `buildkite/pipeline_generator/utils_lib/git_utils.py:31-43`, ci-infra cb564ad).
#[test]
fn a_lone_double_star_is_refused_and_a_buildkite_manifest_counts_a_renames_new_name() {
    let p = Project::new(&MANIFEST.replace(
        "patterns: [\"tests/**/test_*.py\"]\n  exclude",
        "patterns: [\"tests/**test_*.py\"]\n  exclude",
    ));
    let r = p.cibox(&["changed", "--unregistered"]);
    r.fails_with(
        2,
        "changed.patterns.0: `tests/**test_*.py` puts `**` beside other characters",
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    let (dir, base) = repo(&format!("{MANIFEST}workflows:\n  buildkite: .buildkite\n"));
    let d = dir.path();
    std::fs::create_dir_all(d.join("vllm/other")).unwrap();
    git(d, &["mv", "vllm/engine/llm.py", "vllm/other/llm.py"]);
    git(d, &["commit", "-qm", "move"]);
    let (v, _) = changed_json(d, &base);
    assert_eq!(files(&v, "engines"), Vec::<String>::new(), "{v}");
    // Said in the manifest, the old name counts again (dorny/paths-filter's way).
    let (dir, base) = repo(&format!(
        "{}workflows:\n  buildkite: .buildkite\n",
        MANIFEST.replace(
            "  default_gpus: 1\n",
            "  default_gpus: 1\n  renames: both\n"
        )
    ));
    let d = dir.path();
    std::fs::create_dir_all(d.join("vllm/other")).unwrap();
    git(d, &["mv", "vllm/engine/llm.py", "vllm/other/llm.py"]);
    git(d, &["commit", "-qm", "move"]);
    let (v, _) = changed_json(d, &base);
    assert_eq!(files(&v, "engines"), ["vllm/engine/llm.py"], "{v}");
}

/// vLLM's pipeline as ci-infra builds it from the diff (`buildkite_step.py:311-328`,
/// `:477-487`, cb564ad): a step whose `source_file_dependencies` changed runs, the
/// others wait behind a block step a person can click. Here the selection is cibox's
/// (`changed`), rendered at build time by `workflow render --print … --base`.
const FOLLOWS: &str = r#"version: 1
project: vllm
image: {locks: [cibox.yaml]}
defaults: {timeout: 30m, run: ["pytest -v -s tests"], gpus: 1}
batches:
  distributed-tests: {gpus: 2, changes: [distributed]}
  engine-tests: {changes: [engine]}
  basic-correctness: {}
changed:
  groups:
    distributed: {paths: [vllm/distributed, tests/distributed], kind: files}
    engine: {paths: [vllm/engine, tests/engine], kind: files}
workflows:
  buildkite: .buildkite
"#;

const BOOTSTRAP: &str = "steps:\n  - label: \":pipeline: upload what the diff selects\"\n    command: cibox workflow render --print pipeline.yml --base \"origin/$BUILDKITE_PULL_REQUEST_BASE_BRANCH\" | buildkite-agent pipeline upload\n";

const FOLLOWING_PIPELINE: &str = r#"steps:
<% for b in batches %>
<% if not b.selected %>
  - block: "Run << b.name >>"
    key: block-<< b.name >>
<% endif %>
  - label: << b.name | yaml >>
    key: << b.name >>
<% if not b.selected %>
    depends_on: block-<< b.name >>
<% endif %>
    command: cibox batch run << b.name | shell >>
<% endfor %>
"#;

#[test]
fn a_pipeline_follows_the_diff_with_unselected_steps_behind_block_steps() {
    let (dir, base) = repo(FOLLOWS);
    let d = dir.path();
    write(d, ".buildkite/bootstrap.yml.j2", BOOTSTRAP);
    write(d, ".buildkite/pipeline.yml.j2", FOLLOWING_PIPELINE);
    // Rendered without a diff (what is committed): every step runs.
    run(cibox(d).args(["workflow", "render"])).ok();
    let committed = std::fs::read_to_string(d.join(".buildkite/pipeline.yml")).unwrap();
    assert!(!committed.contains("- block:"), "{committed}");
    write(d, "vllm/distributed/comm.py", "x = 3\n");
    git(d, &["add", "-A"]);
    git(d, &["commit", "-qm", "touch distributed"]);
    let r = run(cibox(d).args([
        "workflow",
        "render",
        "--print",
        "pipeline.yml",
        "--base",
        &base,
    ]));
    r.ok();
    let p = &r.stdout;
    assert!(p.contains("  - block: \"Run engine-tests\"\n"), "{p}");
    assert!(p.contains("    depends_on: block-engine-tests\n"), "{p}");
    assert!(!p.contains("block-distributed-tests"), "{p}");
    assert!(!p.contains("block-basic-correctness"), "{p}");
    // The selection is the one `changed` makes: for GitHub, a matrix of its output.
    let r = run(cibox(d).args(["--json", "changed", "--base", &base]));
    r.ok();
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(
        v["selected_batches"],
        serde_json::json!(["distributed-tests", "basic-correctness"]),
        "{v}"
    );
    // A base that git would read as an option: refused, nothing written.
    for cmd in [
        vec!["changed", "--base=--output=pwned"],
        vec![
            "workflow",
            "render",
            "--print",
            "pipeline.yml",
            "--base=--output=pwned",
        ],
    ] {
        let r = run(cibox(d).args(&cmd));
        assert_eq!(r.code, 2, "{cmd:?}: {}", r.stderr);
        assert!(r.stderr.contains("--output=pwned"), "{}", r.stderr);
        assert!(
            std::fs::read_dir(d).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("pwned")),
            "{cmd:?} wrote a file"
        );
    }
    // A base that is no revision: one line, nothing printed.
    let r = run(cibox(d).args([
        "workflow",
        "render",
        "--print",
        "pipeline.yml",
        "--base",
        "nope",
    ]));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    // A batch naming a group that is not defined is refused at its key.
    let p = Project::new(&FOLLOWS.replace("changes: [engine]", "changes: [engin]"));
    p.cibox(&["workflow", "render"]).fails_with(
        2,
        "batches.engine-tests.changes.0: change group `engin` is not defined (changed.groups: distributed, engine)",
    );
}
