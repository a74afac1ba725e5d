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
