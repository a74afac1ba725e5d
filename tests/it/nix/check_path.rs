//! The unit tests run with exactly the tools the Nix build's check phase has on its
//! PATH (issue 48): stdenv's initial path and its compiler, the Rust toolchain, and
//! the package's `nativeCheckInputs` as `nix/package.nix` declares them. A unit test
//! that starts a tool the package does not declare fails here, not in a user's
//! `nix build .#cibox` (issue 39 was git; issue 48 was util-linux's `setsid`).
//!
//! nixpkgs cannot be fetched on these machines, so each Nix package stands as the
//! Debian package(s) that ship the same programs; a missing one is a failure naming
//! it (`.ci/setup-host.sh` installs them). The unit tests run in the test profile,
//! not the check phase's release build: the PATH is what is checked.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::repo;

/// stdenv's initial path (`pkgs/stdenv/generic/common-path.nix`), its compiler and
/// binutils, and `patchelf` (its default native build inputs), as Debian packages.
const STDENV: &[&str] = &[
    "coreutils",
    "findutils",
    "diffutils",
    "sed",
    "grep",
    "gawk",
    "tar",
    "gzip",
    "bzip2",
    "make",
    "bash",
    "patch",
    "xz-utils",
    "file",
    "gcc",
    "binutils",
    "patchelf",
];

/// A `nativeCheckInputs` attribute → the Debian packages that ship its programs.
const NIX_TO_DEBIAN: &[(&str, &[&str])] = &[
    ("git", &["git"]),
    // Debian splits nixpkgs' util-linux three ways.
    ("util-linux", &["util-linux", "bsdutils", "mount"]),
];

/// The attributes `nativeCheckInputs = [ … ];` lists in `nix/package.nix`.
fn native_check_inputs() -> Vec<String> {
    let path = repo().join("nix/package.nix");
    let text = std::fs::read_to_string(&path).unwrap();
    let re = regex::Regex::new(r"nativeCheckInputs\s*=\s*\[([^\]]*)\]").unwrap();
    let c = re
        .captures(&text)
        .unwrap_or_else(|| panic!("{}: no `nativeCheckInputs = [ … ];`", path.display()));
    c[1].split_whitespace().map(str::to_string).collect()
}

/// The programs a Debian package installs (in a `bin` or `sbin` folder).
fn programs_of(package: &str) -> Vec<PathBuf> {
    let out = Command::new("dpkg")
        .args(["-L", package])
        .output()
        .expect("dpkg: these checks stand Debian packages for Nix ones");
    assert!(
        out.status.success(),
        "the Nix check phase's PATH needs Debian's {package} here (`bash .ci/setup-host.sh` installs it): {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| {
            p.parent()
                .and_then(Path::file_name)
                .is_some_and(|d| d == "bin" || d == "sbin")
                && p.metadata().is_ok_and(|m| m.is_file())
        })
        .collect()
}

/// A folder of links to the programs of `packages`, the Rust toolchain and `cc`: the
/// check phase's PATH.
fn check_path(dir: &Path, packages: &[&str]) {
    for package in packages {
        for p in programs_of(package) {
            let link = dir.join(p.file_name().unwrap());
            if !link.exists() {
                symlink(&p, &link).unwrap();
            }
        }
    }
    // nixpkgs' bash is also its `sh` (Debian's is dash, a package of its own).
    symlink("/bin/bash", dir.join("sh")).unwrap();
    // buildRustPackage's toolchain, and stdenv's `cc` (Debian's is an alternative).
    for tool in ["cargo", "rustc", "cc", "c++"] {
        let found = which(tool).unwrap_or_else(|| panic!("no {tool} on this PATH"));
        let link = dir.join(tool);
        if !link.exists() {
            symlink(found, link).unwrap();
        }
    }
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// The unit tests' binary (`cargo test --bins`, as the package's `cargoTestFlags`).
fn unit_test_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo())
        .args(["test", "--bins", "--no-run", "--message-format=json", "-q"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo test --bins --no-run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["profile"]["test"] == true)
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .expect("cargo named no unit test binary")
}

/// Runs the unit tests (those `filter` selects) with only `inputs` declared.
fn unit_tests_with(inputs: &[String], filter: Option<&str>) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let mut packages: Vec<&str> = STDENV.to_vec();
    for input in inputs {
        let (_, debian) = NIX_TO_DEBIAN
            .iter()
            .find(|(nix, _)| nix == input)
            .unwrap_or_else(|| {
                panic!(
                    "nix/package.nix declares {input} in nativeCheckInputs: add the Debian package(s) that ship its programs to NIX_TO_DEBIAN in {}",
                    file!()
                )
            });
        packages.extend_from_slice(debian);
    }
    check_path(dir.path(), &packages);
    let mut cmd = Command::new(unit_test_binary());
    cmd.current_dir(repo()).env("PATH", dir.path());
    if let Some(f) = filter {
        cmd.arg(f);
    }
    cmd.output().unwrap()
}

#[test]
fn unit_tests_pass_with_only_the_nix_check_phases_path() {
    let inputs = native_check_inputs();
    let out = unit_tests_with(&inputs, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let failures: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("test ") && l.ends_with("FAILED"))
        .collect();
    assert!(
        out.status.success(),
        "unit tests fail with only the Nix check phase's PATH (stdenv, the Rust toolchain, nativeCheckInputs {inputs:?}): declare the tool they start in nix/package.nix's nativeCheckInputs (and NIX_TO_DEBIAN here), or do without it:\n{}\n{}",
        failures.join("\n"),
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The check can fail: a unit test that starts `setsid` (util-linux) fails when the
/// package leaves util-linux out.
#[test]
fn a_unit_test_whose_tool_is_not_declared_fails_with_the_check_phases_path() {
    let inputs: Vec<String> = native_check_inputs()
        .into_iter()
        .filter(|i| i != "util-linux")
        .collect();
    let out = unit_tests_with(
        &inputs,
        Some("gpu::overtake::tests::a_waiter_that_waits_on_its_own_gpus"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && stdout.contains("FAILED"),
        "without util-linux the overtake test still passed:\n{stdout}"
    );
}
