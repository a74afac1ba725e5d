//! The guide's tour (docs/guide/tour.md) works verbatim: its first shell block, run with
//! `bash -e` in a fresh clone of this repository, with this cibox first on `PATH`; then
//! its GPU block, each line as written, on the fake GPUs its first line makes (`cibox
//! gpu fake`, in a state folder of the test's own): a machine without a GPU runs it all.

use std::path::Path;
use std::process::Command;

use crate::common::*;

/// The UUIDs `cibox gpu fake` gives its first two NVIDIA GPUs.
const FAKE_UUID_0: &str = "GPU-fa4e0000-0000-4000-8000-000000000000";
const FAKE_UUID_1: &str = "GPU-fa4e0000-0000-4000-8000-000000000001";

/// The first ```sh block after the heading `## The image and a CPU layer`.
fn tour(readme: &str) -> String {
    let after = readme
        .split_once("\n## The image and a CPU layer\n")
        .expect("the tour has `## The image and a CPU layer`")
        .1;
    let block = after
        .split_once("```sh\n")
        .expect("a ```sh block in the tour")
        .1;
    block
        .split_once("\n```")
        .expect("the block ends")
        .0
        .to_string()
}

/// The ```sh block after `## GPU batches, on fake GPUs`, one command per line, comments dropped: each
/// line then says its exit status (`readme-exit N`), so the test can tell which line
/// did what; `torchrun …` (a placeholder) becomes a command that shows its lease.
fn gpu_block(readme: &str) -> (Vec<String>, String) {
    let after = readme
        .split_once("\n## GPU batches, on fake GPUs\n")
        .expect("the tour has its GPU block")
        .1;
    let block = after.split_once("```sh\n").expect("a ```sh block").1;
    let block = block.split_once("\n```").expect("the block ends").0;
    let mut lines = Vec::new();
    let mut script = String::from("set +e\n");
    for line in block.lines() {
        let command = line.split_once("  #").map_or(line, |(c, _)| c).trim();
        let command = command.replace(
            "torchrun …",
            "sh -c 'echo \"leased $CUDA_VISIBLE_DEVICES\"'",
        );
        script.push_str(&format!(
            "echo '>>> {n}'; {command}; echo \"readme-exit $?\"\n",
            n = lines.len()
        ));
        lines.push(command);
    }
    (lines, script)
}

fn images() -> Vec<String> {
    let out = Command::new("docker")
        .args(["images", "-q", "--no-trunc"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn the_readme_tour_and_gpu_host_block_run_from_a_fresh_clone() {
    require_engine();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(repo.join("docs/guide/tour.md")).unwrap();
    let tour = tour(&readme);
    let dir = tempfile::tempdir().unwrap();
    let clone = dir.path().join("cibox");
    let ok = Command::new("git")
        .args(["clone", "-q", "--no-hardlinks"])
        .arg(repo)
        .arg(&clone)
        .status()
        .unwrap()
        .success();
    assert!(ok, "git clone of {}", repo.display());
    let bin = Path::new(env!("CARGO_BIN_EXE_cibox")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The demo image's ID is reproducible: one this engine already holds (someone's
    // demo) is not this test's to remove.
    let before = images();
    let (gpu_lines, gpu_script) = gpu_block(&readme);
    let state = tempfile::tempdir().unwrap();
    let script = format!("{tour}\necho '=== GPU host'\n{gpu_script}");
    let scope = format!("test-readme-{}", nonce());
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", &script])
        .current_dir(&clone)
        .env("PATH", path)
        .env("CIBOX_SCOPE", &scope);
    for (k, _) in std::env::vars() {
        if k.starts_with("CIBOX_") && k != "CIBOX_SCOPE" {
            cmd.env_remove(k);
        }
    }
    cmd.env("XDG_STATE_HOME", state.path())
        .env("CIBOX_PROBE_TIMEOUT", "5s");
    let r = {
        let _store = image_store_lock(false);
        run(&mut cmd)
    };
    for id in images() {
        if !before.contains(&id) {
            remove_image(&id);
        }
    }
    assert_eq!(r.code, 0, "the tour failed:\n{}\n{}", r.stdout, r.stderr);
    // The GPU-host block, line by line: what each printed and how it ended.
    let (tour_out, gpu_out) = r
        .stdout
        .split_once("=== GPU host\n")
        .expect("the tour ran to its end");
    let parts: Vec<&str> = gpu_out.split(">>> ").skip(1).collect();
    assert_eq!(parts.len(), gpu_lines.len(), "{gpu_out}");
    let status = |i: usize| -> i32 {
        parts[i]
            .rsplit_once("readme-exit ")
            .and_then(|(_, c)| c.trim().parse().ok())
            .unwrap_or(-1)
    };
    let line_of = |start: &str| {
        gpu_lines
            .iter()
            .position(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("the GPU block has `{start}`: {gpu_lines:?}"))
    };
    let ctx = || format!("{gpu_out}\n{}", r.stderr);
    // The fake GPUs: made, and said to be fake.
    let i = line_of("eval \"$(cibox gpu fake");
    assert_eq!(status(i), 0, "{}", ctx());
    // gpu status: both fake GPUs, idle, said first to be fake.
    let i = line_of("cibox gpu status");
    assert_eq!(status(i), 0, "{}", ctx());
    assert!(
        parts[i].contains("FAKE GPUs, not real hardware: 2 × NVIDIA H100"),
        "{}",
        ctx()
    );
    assert!(parts[i].contains(FAKE_UUID_1), "{}", ctx());
    // Both batches pass, gpu-smoke on a fake GPU, its record saying so.
    let i = line_of("cibox batch run unit gpu-smoke");
    assert_eq!(status(i), 0, "{}", ctx());
    let record = |batch: &str| -> serde_json::Value {
        let path = clone.join(format!("examples/demo/cibox-reports/{batch}/result.json"));
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    };
    assert_eq!(record("unit")["status"], "passed", "{}", ctx());
    assert_eq!(record("gpu-smoke")["status"], "passed", "{}", ctx());
    assert_eq!(
        record("gpu-smoke")["hardware"]["fake_gpus"],
        true,
        "{}",
        ctx()
    );
    // qualify runs the `qualify` layer (the unit batch) and writes its record.
    let i = line_of("cibox image qualify");
    assert_eq!(status(i), 0, "{}", ctx());
    assert!(
        clone
            .join("examples/demo/cibox-qualify/qualification.json")
            .is_file(),
        "{}",
        ctx()
    );
    // gpu exec leases two idle GPUs and gives them back.
    let i = line_of("cibox gpu exec --count 2");
    assert_eq!(status(i), 0, "{}", ctx());
    // As the leases name GPUs: by UUID.
    assert!(
        parts[i].contains(&format!("leased {FAKE_UUID_0},{FAKE_UUID_1}")),
        "{}",
        ctx()
    );
    let _ = tour_out;
    // Nothing left: no container of the run's scope, no lease.
    let left = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label=org.cibox.scope={scope}"))
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "containers left: {}",
        String::from_utf8_lossy(&left.stdout)
    );
    let fake = state.path().join("cibox/fake-gpus");
    let mut status_cmd = cibox(&clone);
    status_cmd
        .env("CIBOX_FAKE_GPUS", &fake)
        .env("CIBOX_GPU_LOCK_DIR", fake.join("locks"))
        .args(["gpu", "status", "--json"]);
    let after = run(&mut status_cmd);
    let v: serde_json::Value = serde_json::from_str(&after.stdout).unwrap();
    assert!(
        v["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["lease_holder"].is_null()),
        "{}",
        after.stdout
    );
    assert!(r.stdout.contains("unit"), "{}", r.stdout);
    assert!(
        clone
            .join("examples/demo/cibox-reports/unit/result.json")
            .is_file(),
        "the layer's reports: {}",
        r.stderr
    );
}
