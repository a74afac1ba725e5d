//! Offline checks of the Nix side: every tracked `.nix` parses and is formatted, the
//! flake's lock covers its inputs, `nix/lockset.nix` computes exactly what
//! `cibox image lockset` does, refusals included, in pure flake evaluation (as the flake
//! runs it) and in impure evaluation, the CUDA unfree predicate accepts exactly NVIDIA's
//! CUDA licences, and every output of the flake evaluates against a stand-in nixpkgs
//! written here (nixpkgs itself cannot be fetched on these machines). Nothing is built.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

const NIX_CONFIG: &str = "experimental-features = nix-command flakes\nsubstituters =\n";

/// A flake.lock for a flake without inputs.
const EMPTY_LOCK: &str = r#"{"nodes":{"root":{}},"root":"root","version":7}"#;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn require_nix() {
    for tool in ["nix-instantiate", "nix"] {
        let ok = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            ok,
            "these tests need Nix (`{tool}`, Debian's nix-bin): run `bash .ci/run`, which installs it"
        );
    }
}

/// Flake evaluation without a daemon writes to the store: root only (CI runs as root).
fn require_root() {
    assert!(
        nix::unistd::getuid().is_root(),
        "evaluating a flake without a Nix daemon needs root (CI runs as root)"
    );
}

fn tracked_files() -> Vec<String> {
    let out = Command::new("git")
        .current_dir(repo())
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .split('\0')
        .filter(|s| !s.is_empty() && repo().join(s).symlink_metadata().is_ok())
        .map(str::to_string)
        .collect()
}

fn tracked_nix_files() -> Vec<PathBuf> {
    let files: Vec<PathBuf> = tracked_files()
        .iter()
        .filter(|s| s.ends_with(".nix"))
        .map(|s| repo().join(s))
        .collect();
    assert!(
        files.len() >= 6,
        "expected the flake's .nix files, found {files:?}"
    );
    files
}

/// Copies the tracked (and untracked, not ignored) files whose path starts with one of
/// `prefixes` (all when empty) into `to`, symlinks as symlinks: the flake as Nix would
/// see it, whatever the git state.
fn copy_tracked(to: &Path, prefixes: &[&str]) {
    for f in tracked_files() {
        if !prefixes.is_empty() && !prefixes.iter().any(|p| f.starts_with(p)) {
            continue;
        }
        let from = repo().join(&f);
        let dest = to.join(&f);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        let md = from.symlink_metadata().unwrap();
        if md.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from).unwrap(), &dest).unwrap();
        } else {
            std::fs::copy(&from, &dest).unwrap();
        }
    }
}

#[test]
fn every_nix_file_parses() {
    require_nix();
    for f in tracked_nix_files() {
        let out = Command::new("nix-instantiate")
            .arg("--parse")
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn nix_files_are_formatted() {
    // alejandra, the Nix formatter, as a library: runs offline.
    for f in tracked_nix_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let (status, formatted) =
            alejandra::format::in_memory(f.display().to_string(), text.clone());
        assert!(
            !matches!(status, alejandra::format::Status::Error(_)),
            "{}: alejandra cannot parse it",
            f.display()
        );
        assert!(
            formatted == text,
            "{} is not formatted (alejandra); expected:\n{formatted}",
            f.display()
        );
    }
}

fn flake_metadata(dir: &Path) -> std::process::Output {
    Command::new("nix")
        .current_dir(dir)
        .env("NIX_CONFIG", NIX_CONFIG)
        .args([
            "flake",
            "metadata",
            "--no-update-lock-file",
            "--offline",
            "path:.",
        ])
        .output()
        .unwrap()
}

#[test]
fn the_lock_covers_every_flake_input() {
    require_nix();
    require_root();
    // A copy of just the flake, so the check does not depend on git state.
    let dir = tempfile::tempdir().unwrap();
    copy_tracked(dir.path(), &["flake.nix", "flake.lock", "nix/", "images/"]);
    let out = flake_metadata(dir.path());
    assert!(
        out.status.success(),
        "nix flake metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("531670d871c0e29724a02f3cbcac170adc65b58c")
    );
    // And the check has teeth: a lock without the input cannot be completed offline.
    std::fs::write(dir.path().join("flake.lock"), EMPTY_LOCK).unwrap();
    assert!(
        !flake_metadata(dir.path()).status.success(),
        "an incomplete lock passed"
    );
}

/// `nix eval --json --offline` of `installable` (a `path:` flake reference), with extra
/// arguments (`--override-input`, `--apply`): Ok(JSON) or Err(stderr).
fn nix_eval(installable: &str, extra: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new("nix")
        .env("NIX_CONFIG", NIX_CONFIG)
        .args(["eval", "--json", "--offline", "--no-update-lock-file"])
        .args(extra)
        .arg(installable)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A flake (in a scratch folder) that evaluates the repository's `nix/lockset.nix`
/// purely, as the real flake does, over its folder `root/`.
struct LocksetFlake {
    dir: tempfile::TempDir,
}

impl LocksetFlake {
    fn new() -> LocksetFlake {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("flake.nix"),
            "{\n  outputs = {self}: {\n    lockset = import ./lockset.nix {\n      root = ./root;\n      locks = builtins.fromJSON (builtins.readFile ./locks.json);\n    };\n  };\n}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("flake.lock"), EMPTY_LOCK).unwrap();
        std::fs::copy(
            repo().join("nix/lockset.nix"),
            dir.path().join("lockset.nix"),
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        LocksetFlake { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The lockset digest in pure flake evaluation: Ok(digest) or Err(message).
    fn digest(&self, locks: &[&str]) -> Result<String, String> {
        std::fs::write(
            self.dir.path().join("locks.json"),
            serde_json::to_string(locks).unwrap(),
        )
        .unwrap();
        let flake = format!("path:{}#lockset.digest", self.dir.path().display());
        nix_eval(&flake, &[]).map(|v| v.as_str().unwrap().to_string())
    }
}

/// `nix/lockset.nix` over `root` and `locks` in impure evaluation (nix-instantiate):
/// Ok(digest) or Err(message).
fn nix_lockset_impure(root: &Path, locks: &[&str]) -> Result<String, String> {
    let args = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        args.path(),
        serde_json::json!({"root": root, "locks": locks}).to_string(),
    )
    .unwrap();
    let expr = format!(
        "let a = builtins.fromJSON (builtins.readFile {}); in (import {} {{ root = /. + a.root; locks = a.locks; }}).digest",
        args.path().display(),
        repo().join("nix/lockset.nix").display()
    );
    let out = Command::new("nix-instantiate")
        .args(["--eval", "--strict", "--json", "-E", &expr])
        .output()
        .unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice::<String>(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `cibox image lockset` with a manifest written into `root`, which must be a scratch
/// folder of the test's own (the manifest is left there).
fn cibox_lockset(root: &Path, locks: &[&str]) -> Result<String, String> {
    assert!(
        !root.starts_with(repo()),
        "never write manifests into the checkout"
    );
    let manifest = root.join("cibox.yaml");
    let list = locks
        .iter()
        .map(|l| serde_json::to_string(l).unwrap())
        .collect::<Vec<_>>()
        .join(", ");
    std::fs::write(&manifest, format!("version: 1\nproject: p\nimage:\n  locks: [{list}]\nbatches:\n  b: {{gpus: 0, timeout: 1m, run: [x]}}\n")).unwrap();
    manifest_lockset(&manifest, None).map(|(digest, _)| digest)
}

/// `cibox image lockset [--name NAME] --json` of a manifest: Ok((digest, text)).
fn manifest_lockset(manifest: &Path, name: Option<&str>) -> Result<(String, String), String> {
    let mut cmd = cibox(manifest.parent().unwrap());
    cmd.arg("--manifest")
        .arg(manifest)
        .args(["image", "lockset", "--json"]);
    if let Some(name) = name {
        cmd.args(["--name", name]);
    }
    let r = run(&mut cmd);
    if r.code == 0 {
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        Ok((
            v["digest"].as_str().unwrap().to_string(),
            v["text"].as_str().unwrap().to_string(),
        ))
    } else {
        Err(r.stderr)
    }
}

/// The same digest from cibox and from `nix/lockset.nix` in pure flake evaluation, and
/// in impure evaluation too when `impure` (where a dangling symlink is not involved:
/// see the limits in nix/lockset.nix).
fn same(flake: &LocksetFlake, locks: &[&str], impure: bool) {
    let c = cibox_lockset(&flake.root(), locks)
        .unwrap_or_else(|e| panic!("cibox lockset {locks:?}: {e}"));
    let n = flake
        .digest(locks)
        .unwrap_or_else(|e| panic!("nix lockset (pure) {locks:?}: {e}"));
    assert_eq!(n, c, "lockset digests differ (pure) for {locks:?}");
    if impure {
        let n = nix_lockset_impure(&flake.root(), locks)
            .unwrap_or_else(|e| panic!("nix lockset (impure) {locks:?}: {e}"));
        assert_eq!(n, c, "lockset digests differ (impure) for {locks:?}");
    }
}

#[test]
fn lockset_parity_for_the_repository_images_and_the_example() {
    require_nix();
    require_root();
    // The manifests as committed, read only; each image against its own lock list.
    for (manifest, name, locks) in [
        (
            repo().join("cibox.yaml"),
            Some("demo"),
            vec!["flake.lock", "images/demo/*"],
        ),
        (
            repo().join("cibox.yaml"),
            Some("cuda-torch"),
            vec!["flake.lock", "images/cuda-torch/*"],
        ),
        (
            repo().join("examples/demo/cibox.yaml"),
            None,
            vec!["images/demo/*"],
        ),
    ] {
        let (digest, _) = manifest_lockset(&manifest, name).unwrap();
        let folder = manifest.parent().unwrap();
        // Impure, over the checkout itself.
        assert_eq!(
            nix_lockset_impure(folder, &locks).unwrap(),
            digest,
            "{} {name:?} (impure)",
            manifest.display()
        );
        // Pure, over a copy of the files the lock list can name.
        let flake = LocksetFlake::new();
        let prefix = folder.strip_prefix(repo()).unwrap();
        for f in tracked_files() {
            let Ok(rel) = Path::new(&f).strip_prefix(prefix) else {
                continue;
            };
            let rel = rel.to_str().unwrap();
            if rel == "flake.lock" || rel.starts_with("images/") {
                let dest = flake.root().join(rel);
                std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
                std::fs::copy(repo().join(&f), dest).unwrap();
            }
        }
        assert_eq!(
            flake.digest(&locks).unwrap(),
            digest,
            "{} {name:?} (pure)",
            manifest.display()
        );
    }
}

#[test]
fn lockset_parity_for_awkward_names_and_globs() {
    require_nix();
    require_root();
    let flake = LocksetFlake::new();
    let root = flake.root();
    let names = [
        "with space.lock",
        "back\\slash.lock",
        "new\nline.lock",
        "two\nnew\nlines.lock",
        "tab\there.lock",
        "ünïcödé.lock",
        "quote'\"$(echo no).lock",
        "br{ace}+(paren)|bar$.lock",
        "car^et.lock",
        "sq]uare.lock",
        "B-upper.lock",
        "a-lower.lock",
        ".hidden.lock",
        "deep/er/still/x.txt",
        "deep/y.txt",
        "deep/er/z.md",
        "sub/one.lock",
        "sub/dir/two.lock",
    ];
    for (i, n) in names.iter().enumerate() {
        let p = root.join(n);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("content {i}\n")).unwrap();
    }
    // Symlinks count as what they point to; folders never count, even named *.lock.
    std::os::unix::fs::symlink("a-lower.lock", root.join("link.lock")).unwrap();
    std::os::unix::fs::symlink("sub", root.join("linkdir")).unwrap();
    std::fs::create_dir(root.join("folder.lock")).unwrap();
    std::fs::create_dir(root.join("empty")).unwrap();
    std::os::unix::fs::symlink("empty", root.join("emptylink.lock")).unwrap();
    for locks in [
        &["*.lock"][..],
        &["deep/**/*.txt"],
        &["**/*.lock"],
        &["sub/*", "a-lower.lock", "*.lock"],
        &[
            "deep/er/z.md",
            "new\nline.lock",
            "[ab]-*.lock",
            "?-upper.lock",
        ],
        &["[!a]-*.lock", "[]s]q*", "*[{]*", "car^*", "[^c]ar*"],
        &["two\nnew\nlines.lock", "*\n*"],
        &["link.lock", "linkdir/one.lock", "linkdir/*"],
        &["*/**/*.lock", "**/two*", "deep/*"],
        &[
            "./a-lower.lock",
            "sub//one.lock",
            "sub/./one.lock",
            "./sub/*",
        ],
        &["sub/./*", "sub//*", "./*/one.lock"],
    ] {
        same(&flake, locks, true);
    }
    // A dangling symlink is no file: skipped by globs, and named alone it matches
    // nothing (pure evaluation only, see nix/lockset.nix).
    std::os::unix::fs::symlink("nothing", root.join("dangling.lock")).unwrap();
    same(&flake, &["*.lock"], false);
    for locks in [&["dangling.lock"][..], &["dangl*"]] {
        let n = flake.digest(locks).unwrap_err();
        assert!(n.contains("matches no file"), "nix said: {n}");
        let c = cibox_lockset(&root, locks).unwrap_err();
        assert!(c.contains("matches no file"), "cibox said: {c}");
    }
}

#[test]
fn nix_lockset_refuses_what_cibox_refuses() {
    require_nix();
    require_root();
    let flake = LocksetFlake::new();
    let root = flake.root();
    std::fs::write(root.join("a.lock"), "a").unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    std::fs::write(root.join("dir/in.lock"), "in").unwrap();
    std::os::unix::fs::symlink("dir", root.join("dirlink")).unwrap();
    for (locks, nix_says, cibox_says) in [
        (
            vec!["missing.lock"],
            "lock pattern `missing.lock` matches no file",
            "lock pattern `missing.lock` matches no file",
        ),
        (
            vec!["*.toml"],
            "lock pattern `*.toml` matches no file",
            "lock pattern `*.toml` matches no file",
        ),
        (vec![], "image.locks is empty", "image.locks is empty"),
        // A lock list that names a folder, directly or through a symlink.
        (
            vec!["a.lock", "dir"],
            "lock file `dir` cannot be read: is not a regular file",
            "lock file `dir` cannot be read: is not a regular file",
        ),
        (
            vec!["dirlink"],
            "lock file `dirlink` cannot be read: is not a regular file",
            "lock file `dirlink` cannot be read: is not a regular file",
        ),
        (
            vec!["dir/"],
            "lock file `dir/` cannot be read: is not a regular file",
            "lock file `dir/` cannot be read: is not a regular file",
        ),
        (
            vec!["a.lock/"],
            "lock file `a.lock/` cannot be read: Not a directory",
            "lock file `a.lock/` cannot be read: Not a directory",
        ),
        (
            vec!["a.lock/x"],
            "lock file `a.lock/x` cannot be read: Not a directory",
            "lock file `a.lock/x` cannot be read: Not a directory",
        ),
        // A glob that matches only folders matches no file.
        (
            vec!["d*"],
            "lock pattern `d*` matches no file",
            "lock pattern `d*` matches no file",
        ),
        (
            vec!["dir/**"],
            "lock pattern `dir/**` matches no file",
            "lock pattern `dir/**` matches no file",
        ),
        (
            vec!["a***"],
            "is not a valid glob: wildcards are either regular `*` or recursive `**`",
            "is not a valid glob: wildcards are either regular `*` or recursive `**`",
        ),
        (
            vec!["a**/x"],
            "is not a valid glob: recursive wildcards must form a single path component",
            "is not a valid glob: recursive wildcards must form a single path component",
        ),
        (
            vec!["[ab"],
            "is not a valid glob: invalid range pattern",
            "is not a valid glob: invalid range pattern",
        ),
        (
            vec!["../a.lock"],
            "must be a relative path inside the manifest's folder",
            "must be a relative path inside the manifest's folder",
        ),
    ] {
        let n = flake.digest(&locks).unwrap_err();
        assert!(n.contains(nix_says), "{locks:?}: nix (pure) said: {n}");
        let n = nix_lockset_impure(&root, &locks).unwrap_err();
        assert!(n.contains(nix_says), "{locks:?}: nix (impure) said: {n}");
        let c = cibox_lockset(&root, &locks).unwrap_err();
        assert!(c.contains(cibox_says), "{locks:?}: cibox said: {c}");
    }
    // And what both accept, to show the refusals above are about the pattern.
    same(
        &flake,
        &["a.lock", "dir/in.lock", "dirlink/in.lock", "d*/*"],
        true,
    );
}

/// Writes the stand-in nixpkgs into `dir`.
fn write_stand_in(dir: &Path) {
    for (name, text) in STAND_IN {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

#[test]
fn the_cuda_predicate_accepts_exactly_the_cuda_licences() {
    require_nix();
    let stand_in = tempfile::tempdir().unwrap();
    write_stand_in(stand_in.path());
    // Licences as nixpkgs defines them (lib.licenses, _cuda.lib.licenses); meta.license
    // is one licence or a list.
    let expr = format!(
        r#"let
  accept = import {predicate};
  l = import {dir}/licenses.nix;
  c = import {dir}/cuda-licenses.nix;
  pkg = license: {{ pname = "p"; meta = {{ inherit license; }}; }};
  judge = cases: builtins.mapAttrs (_: license: accept (pkg license)) cases;
in {{
  accepted = judge {{
    nvidiaCuda = l.nvidiaCuda;
    nvidiaCudaRedist = l.nvidiaCudaRedist;
    inList = [ l.nvidiaCudaRedist ];
    withFree = [ l.asl20 l.nvidiaCudaRedist ];
    cudnn = c.cudnn;
    cusparseLt = c.cusparse_lt;
    cutensor = c.cutensor;
    tensorrt = l.unfreeRedistributable // c.tensorrt;
    mathSdk = c.math_sdk_sla;
    twoCuda = [ c.cudnn l.nvidiaCuda ];
  }};
  refused = judge {{
    unfree = l.unfree;
    unfreeRedistributable = l.unfreeRedistributable;
    cudaAndUnfree = [ l.nvidiaCuda l.unfree ];
    optix = {{ shortName = "NVidia OptiX EULA"; fullName = "NVidia OptiX EULA"; free = false; }};
    driver = {{ shortName = "nvidia"; fullName = "This License For Customer Use of NVIDIA Software"; free = false; }};
    lookalike = {{ fullName = "CUDA Toolkit End User License Agreement (EULA)"; free = false; }};
    aString = "unfree";
    none = [ ];
  }};
  noMeta = accept {{ pname = "p"; }};
}}"#,
        predicate = repo().join("nix/cuda-unfree.nix").display(),
        dir = stand_in.path().display()
    );
    let out = Command::new("nix-instantiate")
        .args(["--eval", "--strict", "--json", "-E", &expr])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (case, ok) in v["accepted"].as_object().unwrap() {
        assert_eq!(
            ok.as_bool(),
            Some(true),
            "the CUDA predicate refused `{case}`"
        );
    }
    for (case, ok) in v["refused"].as_object().unwrap() {
        assert_eq!(
            ok.as_bool(),
            Some(false),
            "the CUDA predicate accepted `{case}`"
        );
    }
    assert_eq!(v["accepted"].as_object().unwrap().len(), 10);
    assert_eq!(v["refused"].as_object().unwrap().len(), 8);
    assert_eq!(v["noMeta"].as_bool(), Some(false), "a package without meta");
}

/// The repository's flake, copied, with its nixpkgs input replaced by the stand-in.
struct FlakeUnderTest {
    copy: tempfile::TempDir,
    stand_in: tempfile::TempDir,
}

impl FlakeUnderTest {
    fn new() -> FlakeUnderTest {
        let copy = tempfile::tempdir().unwrap();
        copy_tracked(copy.path(), &[]);
        let stand_in = tempfile::tempdir().unwrap();
        write_stand_in(stand_in.path());
        FlakeUnderTest { copy, stand_in }
    }

    /// `nix eval` of `attr` (applying `apply` when given) in pure evaluation.
    fn eval(&self, attr: &str, apply: Option<&str>) -> Result<serde_json::Value, String> {
        let stand_in = format!("path:{}", self.stand_in.path().display());
        let mut extra = vec!["--override-input", "nixpkgs", stand_in.as_str()];
        if let Some(f) = apply {
            extra.extend(["--apply", f]);
        }
        nix_eval(
            &format!("path:{}#{attr}", self.copy.path().display()),
            &extra,
        )
    }

    fn ok(&self, attr: &str, apply: Option<&str>) -> serde_json::Value {
        self.eval(attr, apply)
            .unwrap_or_else(|e| panic!("nix eval {attr}: {e}"))
    }

    /// `nix flake check --no-build`: Nix's own check of the outputs' shapes.
    fn flake_check(&self) -> std::process::Output {
        Command::new("nix")
            .env("NIX_CONFIG", NIX_CONFIG)
            .args([
                "flake",
                "check",
                "--no-build",
                "--offline",
                "--no-update-lock-file",
            ])
            .arg("--override-input")
            .arg("nixpkgs")
            .arg(format!("path:{}", self.stand_in.path().display()))
            .arg(format!("path:{}", self.copy.path().display()))
            .output()
            .unwrap()
    }

    /// Turns a switch of the stand-in on (see its pkgs.nix) or off.
    fn switch(&self, name: &str, on: bool) {
        let p = self.stand_in.path().join(name);
        if on {
            std::fs::write(p, "").unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn every_flake_output_evaluates_against_a_stand_in_nixpkgs() {
    require_nix();
    require_root();
    let f = FlakeUnderTest::new();
    let systems = ["aarch64-linux", "x86_64-linux"];
    let images = ["cuda-torch", "demo"];

    // Outputs per system: the tool, one image per folder, one app per image.
    let names = "builtins.mapAttrs (_: builtins.attrNames)";
    for (output, expected) in [
        (
            "packages",
            vec!["cibox", "default", "image-cuda-torch", "image-demo"],
        ),
        (
            "apps",
            vec![
                "gpu-batch",
                "image-cuda-torch",
                "image-demo",
                "image-verify",
                "reproduce",
            ],
        ),
        ("checks", vec!["cibox"]),
        ("devShells", vec!["default"]),
    ] {
        let v = f.ok(output, Some(names));
        assert_eq!(keys(&v), systems, "{output}");
        for s in systems {
            assert_eq!(v[s], serde_json::json!(expected), "{output}.{s}");
        }
    }

    // The shells and checks evaluate too.
    for s in systems {
        let shell = f.ok(&format!("devShells.{s}.default.standIn.packages"), None);
        assert!(shell.as_array().is_some_and(|p| !p.is_empty()), "{shell}");
        let check = f.ok(&format!("checks.{s}.cibox.name"), None);
        assert!(
            check.as_str().is_some_and(|n| n.starts_with("cibox-")),
            "{check}"
        );
    }

    // Each image: a fixed creation time, and both labels exactly what cibox computes
    // for that image of the manifest; the base files every image gets; CUDA packages
    // only in cuda-torch.
    let manifest = f.copy.path().join("cibox.yaml");
    for s in systems {
        for name in images {
            let args = f.ok(&format!("packages.{s}.image-{name}.standIn"), None);
            assert_eq!(args["created"], "1970-01-01T00:00:01Z", "{name}");
            let (digest, text) = manifest_lockset(&manifest, Some(name)).unwrap();
            let labels = &args["config"]["Labels"];
            assert_eq!(labels["org.cibox.lockset"], digest.as_str(), "{name}");
            assert_eq!(labels["org.cibox.lockset.files"], text.as_str(), "{name}");
            assert_eq!(args["tag"], format!("lockset-{}", &digest[7..19]), "{name}");
            let contents = args["contents"].as_array().unwrap();
            let content_names: Vec<&str> = contents
                .iter()
                .map(|c| c["name"].as_str().unwrap())
                .collect();
            assert_eq!(
                content_names[..3],
                ["usr-bin-env", "ca-certificates", "fake-nss"],
                "{name}"
            );
            let cuda: Vec<bool> = contents[3..]
                .iter()
                .map(|c| c["cudaSupport"].as_bool().unwrap())
                .collect();
            assert!(!cuda.is_empty(), "{name}: no recipe contents");
            assert!(
                cuda.iter().all(|&c| c == (name == "cuda-torch")),
                "{name}: cudaSupport of its contents: {cuda:?}"
            );
            let env = args["config"]["Env"].as_array().unwrap();
            assert!(
                env.contains(&serde_json::json!(
                    "SSL_CERT_FILE=/etc/ssl/certs/ca-bundle.crt"
                )),
                "{name}: {env:?}"
            );
            // The manifest builds this image from the same attribute.
            assert!(
                std::fs::read_to_string(&manifest)
                    .unwrap()
                    .contains(&format!("nix: .#image-{name}\n")),
                "cibox.yaml does not name .#image-{name}"
            );
        }
    }

    // The apps run what the README says, each image app only its own image.
    let paths = f.ok(
        "packages.x86_64-linux",
        Some("p: builtins.mapAttrs (_: d: d.outPath) p"),
    );
    let cibox_bin = format!("{}/bin/cibox", paths["cibox"].as_str().unwrap());
    let apps = f.ok("apps.x86_64-linux", None);
    let script = |app: &str| {
        assert_eq!(apps[app]["type"], "app", "{app}");
        let description = apps[app]["meta"]["description"].as_str().unwrap_or("");
        assert!(!description.is_empty(), "{app} has no meta.description");
        std::fs::read_to_string(apps[app]["program"].as_str().unwrap()).unwrap()
    };
    for (app, line) in [
        ("gpu-batch", format!("exec {cibox_bin} batch run \"$@\"")),
        (
            "image-verify",
            format!("exec {cibox_bin} image verify \"$@\""),
        ),
        ("reproduce", format!("exec {cibox_bin} reproduce \"$@\"")),
    ] {
        let text = script(app);
        assert!(text.contains(&line), "{app} runs:\n{text}");
    }
    for name in images {
        let text = script(&format!("image-{name}"));
        let stream = paths[format!("image-{name}")].as_str().unwrap();
        let line = format!("{stream} | {cibox_bin} image load --from - --name {name} \"$@\"");
        assert!(text.contains(&line), "image-{name} runs:\n{text}");
        for other in images.iter().filter(|o| **o != name) {
            let theirs = paths[format!("image-{other}")].as_str().unwrap();
            assert!(!text.contains(theirs), "image-{name} holds image-{other}");
        }
    }

    // Building the demo never evaluates the CUDA package set.
    f.switch("poison-cuda", true);
    f.eval("apps.x86_64-linux.image-demo.program", None)
        .unwrap_or_else(|e| panic!("image-demo with the CUDA set poisoned: {e}"));
    let e = f
        .eval("apps.x86_64-linux.image-cuda-torch.program", None)
        .unwrap_err();
    assert!(e.contains("pkgsCuda was evaluated"), "{e}");
    f.switch("poison-cuda", false);

    // The unfree predicate lets the CUDA redistributables through (cuda_nvcc pulls in
    // libnvvm, libnvptxcompiler and cuda_cccl; torch cuDNN and cuSPARSELt), and
    // nothing else unfree.
    f.switch("unfree-dep", true);
    let e = f
        .eval(
            "packages.x86_64-linux.image-cuda-torch.standIn.contents",
            None,
        )
        .unwrap_err();
    assert!(
        e.contains(
            "Package ‘nvidia-x11-1.0’ in the stand-in nixpkgs has an unfree license (‘unfree’)"
        ),
        "{e}"
    );
    f.switch("unfree-dep", false);

    // The tool's source is Cargo.toml, Cargo.lock, src/ and the workspace member: an edit
    // to the README does not change it.
    let src = "p: builtins.attrNames (builtins.readDir p.standIn.src)";
    assert_eq!(
        f.ok("packages.x86_64-linux.cibox", Some(src)),
        serde_json::json!(["Cargo.lock", "Cargo.toml", "src", "tests"])
    );
    assert_eq!(
        f.ok(
            "packages.x86_64-linux.cibox",
            Some("p: builtins.attrNames (builtins.readDir (p.standIn.src + \"/tests\"))")
        ),
        serde_json::json!(["nvml-double"])
    );
    let src = || f.ok("packages.x86_64-linux.cibox.standIn.src", None);
    let before = src();
    std::fs::write(f.copy.path().join("README.md"), "edited\n").unwrap();
    assert_eq!(src(), before, "a README edit changed the tool's source");
    std::fs::write(f.copy.path().join("src/edited.rs"), "\n").unwrap();
    assert_ne!(
        src(),
        before,
        "an edit under src/ left the tool's source as it was"
    );

    // Last: Nix 2.8's `flake check` reads sources the evaluations above added to the
    // store, without adding them itself ("path … is not valid" when run first).
    let out = f.flake_check();
    assert!(
        out.status.success(),
        "nix flake check --no-build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A stand-in for nixpkgs, enough for cibox's flake: the interface of the real one (its
/// `lib` functions, `import nixpkgs { system; config; }`, `pkgsCuda`, `callPackage`,
/// `dockerTools`, `rustPlatform.buildRustPackage`, `writeShellScript`, `mkShell`, with
/// the real argument names), fake derivations that record their arguments as
/// `standIn`, and nixpkgs' unfree check. Switches, as files in its folder: `poison-cuda`
/// (evaluating `pkgsCuda` fails) and `unfree-dep` (torch depends on an unfree package).
const STAND_IN: [(&str, &str); 6] = [
    (
        "flake.nix",
        r##"# A stand-in for nixpkgs, for evaluating cibox's flake offline: the same interface
# (`lib`, `legacyPackages`, `import nixpkgs { system; config; }`), fake derivations that
# record what they were given, and nixpkgs' unfree check.
{
  outputs = {self}: {
    lib = import ./lib.nix;
    legacyPackages = builtins.listToAttrs (map (system: {
      name = system;
      value = import ./. {inherit system;};
    }) ["x86_64-linux" "aarch64-linux"]);
  };
}
"##,
    ),
    (
        "default.nix",
        r##"# As nixpkgs' impure.nix: `system` (or `localSystem`), `config`, `overlays`.
{
  localSystem ? {inherit system;},
  system ? localSystem.system,
  config ? {},
  overlays ? [],
  crossSystem ? null,
} @ args:
assert args ? localSystem -> !(args ? system);
assert overlays == [];
assert crossSystem == null;
  import ./pkgs.nix {
    system = localSystem.system;
    inherit config;
  }
"##,
    ),
    (
        "lib.nix",
        r##"# The part of nixpkgs' lib that cibox's flake uses, with the same names and arguments.
let
  hasPrefix = pre: s: builtins.substring 0 (builtins.stringLength pre) s == pre;
in rec {
  inherit hasPrefix;
  inherit (builtins) listToAttrs mapAttrs attrNames concatStringsSep;
  genAttrs = names: f: listToAttrs (map (n: {name = n; value = f n;}) names);
  filterAttrs = pred: set: listToAttrs (builtins.concatMap (n: let v = set.${n}; in if pred n v then [{name = n; value = v;}] else []) (attrNames set));
  concatMapStrings = f: list: builtins.concatStringsSep "" (map f list);
  optionals = cond: list: if cond then list else [];
  toList = x: if builtins.isList x then x else [x];
  getName = x: x.pname or (builtins.parseDrvName x.name).name;
  importTOML = path: builtins.fromTOML (builtins.readFile path);
  licenses = import ./licenses.nix;
  platforms = {linux = ["x86_64-linux" "aarch64-linux"];};
  # lib.fileset: unions of existing paths under `root`, copied with only those.
  fileset = {
    unions = list: let
      check = i: p:
        if !(builtins.isPath p)
        then throw "lib.fileset.unions: Element ${toString i} is not a path or file set"
        else if !(builtins.pathExists p)
        then throw "lib.fileset.unions: Element ${toString i} (${toString p}) is a path that does not exist."
        else p;
    in {
      _type = "fileset";
      paths = builtins.genList (i: check i (builtins.elemAt list i)) (builtins.length list);
    };
    toSource = {
      root,
      fileset,
    }: let
      keep = map toString fileset.paths;
      wanted = path: type: let
        p = toString path;
      in
        builtins.any (k: p == k || hasPrefix (k + "/") p || (type == "directory" && hasPrefix (p + "/") k)) keep;
    in
      assert builtins.all (k: hasPrefix (toString root + "/") k) keep; {
        _isLibCleanSourceWith = true;
        origSrc = root;
        name = "source";
        outPath = builtins.path {
          name = "source";
          path = root;
          filter = wanted;
        };
      };
  };
}
"##,
    ),
    (
        "licenses.nix",
        r##"# As lib/licenses.nix: every licence gets shortName (its key unless set), free (true
# unless set) and redistributable. The NVIDIA ones as nixpkgs defines them.
let
  mk = name: l: {shortName = name; free = true; deprecated = false;} // l // {redistributable = l.redistributable or (l.free or true);};
in
  builtins.mapAttrs mk {
    asl20 = {spdxId = "Apache-2.0"; fullName = "Apache License 2.0";};
    bsd3 = {spdxId = "BSD-3-Clause"; fullName = ''BSD 3-clause "New" or "Revised" License'';};
    mit = {spdxId = "MIT"; fullName = "MIT License";};
    gpl3Plus = {spdxId = "GPL-3.0-or-later"; fullName = "GNU General Public License v3.0 or later";};
    psfl = {spdxId = "Python-2.0"; fullName = "Python Software Foundation License version 2";};
    unfree = {fullName = "Unfree"; free = false;};
    unfreeRedistributable = {fullName = "Unfree redistributable"; free = false; redistributable = true;};
    nvidiaCuda = {shortName = "CUDA EULA"; fullName = "CUDA Toolkit End User License Agreement (EULA)"; url = "https://docs.nvidia.com/cuda/eula/index.html#cuda-toolkit-supplement-license-agreement"; free = false;};
    nvidiaCudaRedist = {shortName = "CUDA EULA"; fullName = "CUDA Toolkit End User License Agreement (EULA)"; url = "https://docs.nvidia.com/cuda/eula/index.html#cuda-toolkit-supplement-license-agreement"; free = false; redistributable = true;};
  }
"##,
    ),
    (
        "cuda-licenses.nix",
        r##"# As pkgs/development/cuda-modules/_cuda/lib/licenses.nix (and the inline TensorRT one).
{
  cudnn = {shortName = "cuDNN EULA"; fullName = "cuDNN SUPPLEMENT TO SOFTWARE LICENSE AGREEMENT FOR NVIDIA SOFTWARE DEVELOPMENT KITS"; free = false; redistributable = false;};
  cusparse_lt = {shortName = "cuSPARSELt EULA"; fullName = "cuSPARSELt SUPPLEMENT TO SOFTWARE LICENSE AGREEMENT FOR NVIDIA SOFTWARE DEVELOPMENT KITS"; free = false; redistributable = false;};
  cutensor = {shortName = "cuTENSOR EULA"; fullName = "cuTENSOR SUPPLEMENT TO SOFTWARE LICENSE AGREEMENT FOR NVIDIA SOFTWARE DEVELOPMENT KITS"; free = false; redistributable = false;};
  tensorrt = {shortName = "TensorRT EULA"; fullName = "TensorRT SUPPLEMENT TO SOFTWARE LICENSE AGREEMENT FOR NVIDIA SOFTWARE DEVELOPMENT KITS"; free = false; redistributable = false;};
  math_sdk_sla = {shortName = "NVIDIA Math SDK SLA"; fullName = "LICENSE AGREEMENT FOR NVIDIA MATH LIBRARIES SOFTWARE DEVELOPMENT KITS"; free = false; redistributable = false;};
}
"##,
    ),
    (
        "pkgs.nix",
        r##"# The package set: fake derivations (never built) that record what they were given, as
# `standIn`, and nixpkgs' check-meta rule: a package with an unfree licence evaluates only
# when config.allowUnfree or config.allowUnfreePredicate accepts it.
{
  system,
  config,
}: let
  lib = import ./lib.nix;
  inherit (lib) licenses;
  cudaLicenses = import ./cuda-licenses.nix;
  cudaSupport = config.cudaSupport or false;
  allowed = drv: (config.allowUnfree or false) || (config.allowUnfreePredicate or (_: false)) drv;
  mkFake = {
    name ? "${pname}-${version}",
    pname ? name,
    version ? "1.0",
    license ? licenses.mit,
    deps ? [],
    record ? {},
  }: let
    licences = lib.toList license;
    unfree = builtins.any (l: !(l.free or true)) licences;
    depPaths = map (d: d.outPath) deps;
    hash = builtins.substring 0 32 (builtins.hashString "sha256" (builtins.toJSON [name system cudaSupport depPaths]));
    drv = {
      type = "derivation";
      inherit name pname version system;
      meta = {inherit license;};
      outPath = "/nix/store/${hash}-${name}";
      standIn = record // {inherit cudaSupport;};
    };
    shortNames = builtins.concatStringsSep ", " (map (l: l.shortName or "?") licences);
  in
    if unfree && !(allowed drv)
    then throw "Package ‘${name}’ in the stand-in nixpkgs has an unfree license (‘${shortNames}’), refusing to evaluate."
    else builtins.deepSeq depPaths drv;
  simple = pname: license: mkFake {inherit pname license;};

  self = {
    inherit lib config;
    # Deprecated in nixpkgs (pkgs.stdenv.hostPlatform.system): refused here.
    system = throw "stand-in nixpkgs: pkgs.system is deprecated, use pkgs.stdenv.hostPlatform.system";
    path = ./.;
    stdenv = {
      hostPlatform = {inherit system;};
      buildPlatform = {inherit system;};
    };
    pkgsCuda =
      if builtins.pathExists ./poison-cuda
      then throw "stand-in nixpkgs: pkgsCuda was evaluated"
      else
        import ./pkgs.nix {
          inherit system;
          config = config // {
            cudaSupport = true;
            rocmSupport = false;
          };
        };
    callPackage = fn: args: let
      f =
        if builtins.isFunction fn
        then fn
        else import fn;
    in
      f (builtins.intersectAttrs (builtins.functionArgs f) self // args);
    # The script's text lands in the store at evaluation, so a test can read it.
    writeShellScript = name: text: builtins.toFile name "#!/bin/sh\n${text}";
    runCommand = name: env: buildCommand:
      mkFake {
        inherit name;
        record = {inherit env buildCommand;};
      };
    mkShell = {packages ? [], ...} @ args:
      mkFake {
        name = "nix-shell";
        deps = packages;
        record = {packages = map (p: p.name) packages;};
      };
    rustPlatform.buildRustPackage = args: let
      lock = builtins.fromTOML (builtins.readFile args.cargoLock.lockFile);
    in
      builtins.seq (builtins.length lock.package) (mkFake {
        inherit (args) pname version;
        license = args.meta.license;
        record = args // {src = "${args.src}";};
      });
    dockerTools = {
      streamLayeredImage = {
        name,
        tag ? null,
        fromImage ? null,
        contents ? [],
        config ? {},
        architecture ? "amd64",
        created ? "1970-01-01T00:00:01Z",
        mtime ? created,
        uid ? 0,
        gid ? 0,
        uname ? "root",
        gname ? "root",
        maxLayers ? 100,
        extraCommands ? "",
        fakeRootCommands ? "",
        enableFakechroot ? false,
        includeStorePaths ? true,
        includeNixDB ? false,
        passthru ? {},
        meta ? {},
      } @ args:
        mkFake {
          name = "stream-${baseNameOf name}";
          deps = lib.toList contents;
          record = args // {contents = map (c: {inherit (c) name; cudaSupport = c.standIn.cudaSupport;}) (lib.toList contents);};
        };
      usrBinEnv = mkFake {name = "usr-bin-env";};
      caCertificates = mkFake {name = "ca-certificates";};
      fakeNss = mkFake {name = "fake-nss";};
      binSh = mkFake {name = "bin-sh";};
    };
    bashInteractive = simple "bash-interactive" licenses.gpl3Plus;
    coreutils = simple "coreutils" licenses.gpl3Plus;
    cargo = simple "cargo" licenses.mit;
    rustc = simple "rustc" licenses.mit;
    clippy = simple "clippy" licenses.mit;
    rustfmt = simple "rustfmt" licenses.mit;
    cargo-nextest = simple "cargo-nextest" licenses.asl20;
    nix = simple "nix" licenses.mit;
    docker-client = simple "docker" licenses.asl20;
    alejandra = simple "alejandra" licenses.mit;
    python3Packages = {
      pytest = simple "python3.13-pytest" licenses.mit;
      numpy = simple "python3.13-numpy" licenses.bsd3;
      torch = mkFake {
        pname = "python3.13-torch";
        license = licenses.bsd3;
        deps =
          lib.optionals cudaSupport (with self.cudaPackages; [cuda_cudart libcublas cudnn libcusparse_lt nccl])
          # A test's switch: an unfree dependency outside the CUDA family.
          ++ lib.optionals (builtins.pathExists ./unfree-dep) [(simple "nvidia-x11" licenses.unfree)];
      };
    };
    python3 =
      simple "python3" licenses.psfl
      // {
        withPackages = f:
          mkFake {
            name = "python3-3.13-env";
            deps = f self.python3Packages;
          };
      };
    cudaPackages = let
      redist = pname: simple pname licenses.nvidiaCudaRedist;
    in rec {
      cuda_cccl = redist "cuda_cccl";
      libnvvm = redist "libnvvm";
      libnvptxcompiler = redist "libnvptxcompiler";
      cuda_nvcc = mkFake {
        pname = "cuda_nvcc";
        license = licenses.nvidiaCudaRedist;
        deps = [cuda_cccl libnvvm libnvptxcompiler];
      };
      cuda_cudart = redist "cuda_cudart";
      libcublas = redist "libcublas";
      cudnn = simple "cudnn" cudaLicenses.cudnn;
      libcusparse_lt = simple "libcusparse_lt" cudaLicenses.cusparse_lt;
      nccl = simple "nccl" licenses.bsd3;
    };
  };
in
  self
"##,
    ),
];
