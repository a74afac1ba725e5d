//! Artifacts across runners (issue 46, item 5): an SGLang-shaped project (the
//! sgl-kernel wheel built in one job and installed by later ones, `pr-test.yml`:176,
//! `_pr-test-sgl-kernel-build.yml`:113-118, `_pr-test-stage.yml`:107-121) rendered for
//! GitHub (upload and download pinned by commit, the listing's digest handed on as a
//! job output and checked by `cibox artifact verify`) and Buildkite (`buildkite-agent
//! artifact upload/download`, the digest in the build's meta-data), each checked by
//! `workflow render` (GitHub's lint, Buildkite's schema).

use crate::common::*;

const MANIFEST: &str = r#"version: 1
project: kernel
image: {locks: [cibox.yaml]}
defaults: {gpus: 0, timeout: 30m}
batches:
  wheel:
    run: ["cd sgl-kernel && ./build.sh"]
    outputs: ["sgl-kernel/dist/*.whl"]
  kernel-tests:
    gpus: 1
    run: ["pip install /artifacts/wheel/*.whl && pytest sgl-kernel/tests"]
    needs: [wheel]
layers:
  build: {batches: [wheel]}
  tests: {batches: [kernel-tests]}
workflows:
  dir: wf
  buildkite: .buildkite
"#;

/// A job per layer: a producer uploads its artifact and hands its listing's digest on;
/// a consumer downloads it and has cibox check it before its layer runs.
const GITHUB: &str = r#"name: kernel
on:
  pull_request:
permissions:
  contents: read
jobs:
<% for name, layer in layers | items %>
  << name >>:
    if: github.event.pull_request.head.repo.full_name == github.repository
    runs-on: [self-hosted, gpu]
    timeout-minutes: 60
<% if loop.index0 > 0 %>
    needs: << (layers | list)[:loop.index0] | tojson >>
<% endif %>
    outputs:
<% for b in layer.batch_list %><% if b.outputs %>
      << b.name >>: ${{ steps.digest.outputs.<< b.name >> }}
<% endif %><% endfor %>
      none: ""
    steps:
      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1
        with:
          persist-credentials: false
<% for b in layer.batch_list %><% for need in b.needs %><% for pname, p in layers | items %><% if need in p.batches %>
      - name: Download the artifact of << need >>
        uses: actions/download-artifact@3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c # v8.0.1
        with:
          name: cibox-artifact-<< need >>
          path: cibox-reports/_artifacts/<< need >>
      - name: Check it against the digest its job handed on
        env:
          DIGEST: ${{ needs.<< pname >>.outputs.<< need >> }}
        run: cibox artifact verify "<< need >>=$DIGEST"
<% endif %><% endfor %><% endfor %><% endfor %>
      - name: Run layer << name >>
        run: cibox layer run << name | shell >> --source .
<% for b in layer.batch_list %><% if b.outputs %>
      - name: Keep the artifact of << b.name >>
        uses: actions/upload-artifact@bbbca2ddaa5d8feaa63e36b76fdaad77386f024f # v7.0.0
        with:
          name: cibox-artifact-<< b.name >>
          path: cibox-reports/_artifacts/<< b.name >>/
          if-no-files-found: error
      - name: Hand on its digest
        id: digest
        run: echo "<< b.name >>=$(cibox artifact digest << b.name >>)" >> "$GITHUB_OUTPUT"
<% endif %><% endfor %>
<% endfor %>
"#;

const BUILDKITE: &str = r#"steps:
<% for name, layer in layers | items %>
  - label: "layer << name >>"
    key: layer-<< name >>
<% if loop.index0 > 0 %>
    depends_on: << ("layer-" ~ (layers | list)[loop.index0 - 1]) | tojson >>
<% endif %>
    command: |
<% for b in layer.batch_list %><% for need in b.needs %>
      buildkite-agent artifact download "cibox-reports/_artifacts/<< need >>/**/*" .
      cibox artifact verify "<< need >>=$$(buildkite-agent meta-data get cibox-artifact-<< need >>)"
<% endfor %><% endfor %>
      cibox layer run << name | shell >> --source .
<% for b in layer.batch_list %><% if b.outputs %>
      buildkite-agent artifact upload "cibox-reports/_artifacts/<< b.name >>/**/*"
      buildkite-agent meta-data set cibox-artifact-<< b.name >> "$$(cibox artifact digest << b.name >>)"
<% endif %><% endfor %>
<% endfor %>
"#;

#[test]
fn an_sglang_shaped_wheel_crosses_runners_checked_by_digest_on_both_cis() {
    let p = Project::new(MANIFEST);
    p.write("wf/kernel.yml.j2", GITHUB);
    p.write(".buildkite/pipeline.yml.j2", BUILDKITE);
    let r = p.cibox(&["workflow", "render"]);
    r.ok();
    let gh = std::fs::read_to_string(p.path().join("wf/kernel.yml")).unwrap();
    for want in [
        "      wheel: ${{ steps.digest.outputs.wheel }}",
        "    needs: [\"build\"]",
        "        uses: actions/download-artifact@3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c # v8.0.1",
        "          path: cibox-reports/_artifacts/wheel",
        "          DIGEST: ${{ needs.build.outputs.wheel }}",
        "        run: cibox artifact verify \"wheel=$DIGEST\"",
        "        uses: actions/upload-artifact@bbbca2ddaa5d8feaa63e36b76fdaad77386f024f # v7.0.0",
        "        run: echo \"wheel=$(cibox artifact digest wheel)\" >> \"$GITHUB_OUTPUT\"",
    ] {
        assert!(gh.contains(want), "{want} missing from:\n{gh}");
    }
    let bk = std::fs::read_to_string(p.path().join(".buildkite/pipeline.yml")).unwrap();
    for want in [
        "buildkite-agent artifact download \"cibox-reports/_artifacts/wheel/**/*\" .",
        "cibox artifact verify \"wheel=$$(buildkite-agent meta-data get cibox-artifact-wheel)\"",
        "buildkite-agent artifact upload \"cibox-reports/_artifacts/wheel/**/*\"",
        "buildkite-agent meta-data set cibox-artifact-wheel \"$$(cibox artifact digest wheel)\"",
    ] {
        assert!(bk.contains(want), "{want} missing from:\n{bk}");
    }
}

#[test]
fn a_need_of_no_batch_or_of_a_later_layer_is_refused_at_its_place_and_slurm_refuses_artifacts() {
    let id = format!("sha256:{}", "0".repeat(64));
    let p = Project::new(&MANIFEST.replace("needs: [wheel]", "needs: [wheell]"));
    p.cibox(&["layer", "run", "tests", "--image", &id]).fails_with(
        2,
        "cibox.yaml:12:13: batches.kernel-tests.needs.0: batch `wheell` is not defined; did you mean `wheel`?",
    );
    let swapped = MANIFEST.replace(
        "  build: {batches: [wheel]}\n  tests: {batches: [kernel-tests]}\n",
        "  tests: {batches: [kernel-tests]}\n  build: {batches: [wheel]}\n",
    );
    let p = Project::new(&swapped);
    p.cibox(&["layer", "run", "tests", "--image", &id]).fails_with(
        2,
        "cibox.yaml:12:13: batches.kernel-tests.needs.0: batch `wheel` is in no layer before layer `tests` (it is only in layer build after it)",
    );
    assert!(!p.path().join("cibox-reports").exists());
    // Under a Slurm scheduler a node does not share the reports folder: refused
    // before anything is submitted.
    let p = Project::new(MANIFEST);
    let policy = HostPolicyFile::new("version: 1\nscheduler: slurm\nslurm: {partition: gpu}\n");
    let r = run(cibox(p.path())
        .env("CIBOX_HOST_POLICY", policy.path())
        .args(["layer", "run", "build", "--image", &id]));
    r.fails_with(
        2,
        "batch wheel has `outputs` or `needs`, and this host runs batches as Slurm jobs",
    );
    assert!(!p.path().join("cibox-reports").exists());
}
