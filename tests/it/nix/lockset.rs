//! Lockset parity: `nix/lockset.nix` computes exactly what `cibox image lockset` does,
//! refusals included, in pure flake evaluation (as the flake runs it) and in impure
//! evaluation.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{
    EMPTY_LOCK, manifest_lockset, nix_eval, repo, require_nix, require_root, tracked_files,
};

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
        &["deep/**", "sub/dir/**"],
        &["**"],
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
        &["a.lock", "dir/in.lock", "dirlink/in.lock", "d*/*", "dir/**"],
        true,
    );
}
