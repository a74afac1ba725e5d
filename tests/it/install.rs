//! `install.sh`: a release tarball is installed only when its sha256 is the one given,
//! checked before anything of it is unpacked or run.

use crate::common::*;
use std::process::Command;

/// A tarball of this build's binary, as `.ci/release-build.sh` packs one, and its sha256.
fn tarball(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_cibox"), bin.join("cibox")).unwrap();
    let tar = dir.join("cibox-x86_64-unknown-linux-gnu.tar.gz");
    let ok = Command::new("tar")
        .arg("-czf")
        .arg(&tar)
        .arg("-C")
        .arg(&bin)
        .arg("cibox")
        .status()
        .unwrap();
    assert!(ok.success());
    let sum = Command::new("sha256sum").arg(&tar).output().unwrap();
    let sha = String::from_utf8_lossy(&sum.stdout)[..64].to_string();
    (tar, sha)
}

fn install(url: &str, sha: &str, to: &std::path::Path) -> Run {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("install.sh");
    run(Command::new("sh")
        .arg(script)
        .args(["--url", url, "--sha256", sha, "--to"])
        .arg(to))
}

#[test]
fn install_sh_checks_the_checksum_before_anything_runs() {
    let d = tempfile::tempdir().unwrap();
    let (tar, sha) = tarball(d.path());
    let url = format!("file://{}", tar.display());
    // A checksum that is not the tarball's: refused, nothing installed.
    let to = d.path().join("refused");
    let wrong = format!(
        "{}{}",
        if sha.starts_with('0') { "1" } else { "0" },
        &sha[1..]
    );
    let r = install(&url, &wrong, &to);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "sha256 {sha}, not the {wrong} given: nothing installed"
        )),
        "{}",
        r.stderr
    );
    assert!(!to.exists(), "a refused tarball left {}", to.display());
    // Not a checksum at all: a usage error.
    assert_eq!(install(&url, "latest", &to).code, 2);
    // The right one: installed, and it runs.
    let to = d.path().join("bin-installed");
    let r = install(&url, &sha, &to);
    r.ok();
    assert!(r.stdout.starts_with("cibox "), "{}", r.stdout);
    assert!(to.join("cibox").is_file());
}
