//! The README's tour works verbatim: its first shell block, run with `bash -e` in a
//! fresh clone of this repository, with this cibox first on `PATH`.

use std::path::Path;
use std::process::Command;

use crate::common::*;

/// The first ```sh block after the heading `## A short tour`.
fn tour(readme: &str) -> String {
    let after = readme
        .split_once("\n## A short tour\n")
        .expect("the README has `## A short tour`")
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
fn the_readme_tour_runs_verbatim_from_a_fresh_clone() {
    require_engine();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
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
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", &tour])
        .current_dir(&clone)
        .env("PATH", path)
        .env("CIBOX_SCOPE", format!("test-readme-{}", nonce()));
    for (k, _) in std::env::vars() {
        if k.starts_with("CIBOX_") && k != "CIBOX_SCOPE" {
            cmd.env_remove(k);
        }
    }
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
    assert!(r.stdout.contains("unit"), "{}", r.stdout);
    assert!(
        clone
            .join("examples/demo/cibox-reports/unit/result.json")
            .is_file(),
        "the layer's reports: {}",
        r.stderr
    );
}
