//! What `image build` makes besides its image (scratch folders, the raw build, the
//! images of each step) is gone when it ends, and what a killed build left is removed
//! by the next one. Each build here gets a temporary folder of its own (`TMPDIR`), so
//! what is left there is its own. These are the classic builder's (`DOCKER_BUILDKIT=0`),
//! whose steps leave images; BuildKit's leave none ([`super::buildkit`]).

use std::io::BufRead;
use std::process::Stdio;

use crate::common::*;

/// The images the builder says this build's steps made (` ---> <id>` lines, not
/// those of steps taken from the cache), from its output.
fn step_images(output: &str) -> Vec<String> {
    let mut cached = false;
    let mut out = Vec::new();
    for line in output.lines().map(str::trim) {
        if line.starts_with("Step ") {
            cached = line.contains(" : FROM ");
        } else if line == "---> Using cache" {
            cached = true;
        } else if let Some(id) = line.strip_prefix("---> ")
            && id.len() == 12
            && id.bytes().all(|b| b.is_ascii_hexdigit())
            && !cached
        {
            out.push(id.to_string());
        }
    }
    out
}

fn image_present(id: &str) -> bool {
    std::process::Command::new("docker")
        .args(["image", "inspect", id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// A project whose Dockerfile is `dockerfile` (with a unique file `nonce` beside it).
fn project(dockerfile: &str) -> Project {
    let p = Project::new(&manifest_with_locks(&["image/Dockerfile"]));
    p.write("image/Dockerfile", dockerfile);
    p.write("image/nonce", nonce());
    p
}

/// `cibox image build` with the builder's output shown and `tmp` as its TMPDIR.
fn build_cmd(p: &Project, tmp: &std::path::Path) -> std::process::Command {
    let mut c = cibox(p.path());
    c.args(["image", "build"])
        .env("DOCKER_BUILDKIT", "0")
        .env("CIBOX_LOG", "debug")
        .env("TMPDIR", tmp);
    c
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_multi_stage_build_leaves_no_image_nor_folder_of_its_own() {
    require_engine();
    // The first stage's images are the builder's intermediate ones, left dangling.
    let p = project(
        "FROM scratch AS a\nCOPY nonce /nonce\nCOPY nonce /again\nFROM scratch\nCOPY --from=a /nonce /n\n",
    );
    let tmp = tempfile::tempdir().unwrap();
    let r = {
        let _store = image_store_lock(false);
        run(&mut build_cmd(&p, tmp.path()))
    };
    r.ok();
    let _built = ImageGuard(r.stdout.trim().to_string());
    let made = step_images(&r.stderr);
    assert!(made.len() >= 3, "the builder's steps: {}", r.stderr);
    let left: Vec<&String> = made.iter().filter(|id| image_present(id)).collect();
    assert!(left.is_empty(), "images of the build left: {left:?}");
    assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
}

#[test]
fn what_a_killed_build_left_the_next_build_removes() {
    // A build killed while a step runs leaves its scratch folder and the images of the
    // steps before; the next build (here of another Dockerfile) removes both.
    let base = busybox_project(
        "  b:\n    gpus: 0\n    timeout: 1m\n    run: [\"true\"]\n",
        "",
    );
    let p = project(&format!(
        "FROM {} AS a\nCOPY nonce /nonce\nRUN sleep 300\nFROM scratch\nCOPY --from=a /nonce /n\n",
        base.image.0
    ));
    let tmp = tempfile::tempdir().unwrap();
    let store = image_store_lock(false);
    let mut killed = build_cmd(&p, tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    let mut lines = std::io::BufReader::new(killed.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("Running in") {
            break;
        }
    }
    killed.kill().unwrap();
    killed.wait().unwrap();
    // The engine stops the build its client left, and removes the step's container.
    let container = seen
        .lines()
        .find_map(|l| l.trim().strip_prefix("---> Running in "))
        .unwrap()
        .to_string();
    assert!(wait_until(60, || !std::process::Command::new("docker")
        .args(["container", "inspect", &container])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()));
    let made = step_images(&seen);
    assert_eq!(made.len(), 1, "the COPY step's image: {seen}");
    assert!(image_present(&made[0]));
    let scratch = entries(tmp.path());
    assert_eq!(scratch.len(), 1, "{scratch:?}");
    // Judged only once it is a minute old (a build may not have locked it yet).
    let folder = tmp.path().join(&scratch[0]);
    std::fs::File::open(&folder)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(120))
        .unwrap();
    p.write("image/Dockerfile", "FROM scratch\nCOPY nonce /nonce\n");
    let r = run(&mut build_cmd(&p, tmp.path()));
    drop(store);
    r.ok();
    let _built = ImageGuard(r.stdout.trim().to_string());
    assert!(
        r.stderr.contains("removed what killed builds had left"),
        "{}",
        r.stderr
    );
    assert!(!image_present(&made[0]), "the killed build's image is left");
    assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
}
