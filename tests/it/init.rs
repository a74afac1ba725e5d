//! `cibox init` writes nothing through a link (issue 43): run as root in a checkout whose
//! committed `.github` or `.cibox` (or a folder below, where init writes) is a link
//! leading outside it, it refuses with one line naming the link and writes nothing,
//! there or anywhere.

use crate::common::*;

/// A checkout (`git init`) and a folder outside it; `link` (relative) in the checkout
/// leads to the outside folder, its parents made as folders.
fn checkout_with_link(link: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let at = dir.path().join(link);
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(outside.path(), &at).unwrap();
    (dir, outside)
}

#[test]
fn init_refuses_a_folder_it_writes_into_that_is_a_link_and_writes_nothing() {
    for link in [".github", ".cibox", ".github/workflows", ".cibox/images"] {
        let (dir, outside) = checkout_with_link(link);
        let r = run(cibox(dir.path()).arg("init"));
        r.fails_with(2, &format!("{link}: a symbolic link (to "));
        assert!(
            r.stderr.contains("writes nothing through a link"),
            "{}",
            r.stderr
        );
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "{link}: init wrote outside the checkout"
        );
        assert!(
            !dir.path().join("cibox.yaml").exists(),
            "{link}: nothing is written, not even what no link leads to"
        );
    }
    // A file where init makes a folder: the same.
    let (dir, _outside) = checkout_with_link("unused");
    std::fs::write(dir.path().join(".github"), "x").unwrap();
    run(cibox(dir.path()).arg("init")).fails_with(2, ".github: not a folder");
    assert!(!dir.path().join("cibox.yaml").exists());
}

/// `cibox init` reads a real project: every lock file, in subfolders too, said as
/// found; tests split by the GPU count they declare (`NUM_GPUS = N`); the reports
/// folders ignored in git; the recipe, unedited, refused naming its FROM line (never a
/// network error); every action pinned by commit; what the workflows need, last.
#[test]
fn init_reads_locks_anywhere_splits_tests_by_declared_gpus_and_says_what_to_edit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let status = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(d)
        .status()
        .unwrap();
    assert!(status.success());
    let w = |rel: &str, text: &str| {
        let p = d.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    w("requirements.lock", "torch==2.9\n");
    w("envs/environment.yml", "name: x\n");
    w("sub/pkg/uv.lock", "version = 1\n");
    w("node_modules/x/poetry.lock", "");
    w(".gitignore", "*.pyc");
    w("tests/test_cpu.py", "def test_cpu(): pass\n");
    w(
        "tests/e2e/test_two.py",
        "NUM_GPUS = 2\ndef test_two(): pass\n",
    );
    w("tests/e2e/test_four.py", "NUM_GPUS: int = 4\n");
    let r = run(cibox(d).arg("init"));
    r.ok();
    for line in [
        "lock file: envs/environment.yml",
        "lock file: requirements.lock",
        "lock file: sub/pkg/uv.lock",
        "tests: 1 without GPUs (batch unit)",
        "tests: 1 declaring NUM_GPUS = 2 (batch gpu-2)",
        "tests: 1 declaring NUM_GPUS = 4 (batch gpu-4)",
        "wrote .gitignore",
    ] {
        assert!(r.stderr.contains(line), "{line}: {}", r.stderr);
    }
    assert!(!r.stderr.contains("poetry.lock"), "{}", r.stderr);
    let last = r.stderr.lines().last().unwrap();
    assert!(
        last.starts_with(
            "cibox: the rendered workflows need: repository variables CIBOX_RELEASE_URL"
        ),
        "{last}"
    );
    for var in [
        "CIBOX_SHA256",
        "CIBOX_IMAGE_REF",
        "CIBOX_IMAGE_ID",
        "no secrets",
    ] {
        assert!(last.contains(var), "{var}: {last}");
    }
    let ignore = std::fs::read_to_string(d.join(".gitignore")).unwrap();
    assert!(
        ignore.starts_with("*.pyc\n") && ignore.contains("\n/cibox-reports/\n"),
        "{ignore}"
    );
    let list = run(cibox(d).args(["--json", "batch", "list"]));
    let v: serde_json::Value = serde_json::from_str(&list.ok().stdout).unwrap();
    let gpus: Vec<(String, u64)> = v["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_string(),
                b["gpus"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        gpus,
        [("unit".into(), 0), ("gpu-2".into(), 2), ("gpu-4".into(), 4)],
        "{v}"
    );
    let manifest = std::fs::read_to_string(d.join("cibox.yaml")).unwrap();
    assert!(
        manifest.contains("--ignore=tests/e2e/test_two.py"),
        "{manifest}"
    );
    // Unedited, the recipe stops at its FROM line, saying to edit it; nothing is pulled.
    let b = run(cibox(d).args(["image", "build"]));
    b.fails_with(3, "default.Dockerfile:");
    assert!(
        b.stderr
            .contains("the FROM line still names `replace-me-with-a-base`")
            && b.stderr.contains("edit it to name your base"),
        "{}",
        b.stderr
    );
    run(cibox(d).args(["workflow", "render"])).ok();
    for f in ["cibox-cpu.yml", "cibox-gpu.yml", "cibox-warm-up.yml"] {
        let text = std::fs::read_to_string(d.join(".github/workflows").join(f)).unwrap();
        for uses in text
            .lines()
            .filter_map(|l| l.split_once("uses: ").map(|(_, u)| u))
        {
            let pin = uses
                .split_once('@')
                .map(|(_, p)| &p[..p.find(' ').unwrap_or(p.len())]);
            assert!(
                pin.is_some_and(|p| p.len() == 40 && p.bytes().all(|b| b.is_ascii_hexdigit())),
                "{f}: not pinned by commit: {uses}"
            );
        }
    }
    let cpu = std::fs::read_to_string(d.join(".github/workflows/cibox-cpu.yml")).unwrap();
    assert!(
        cpu.contains("sha256sum --check --strict") && !cpu.contains("cargo install"),
        "{cpu}"
    );
}
