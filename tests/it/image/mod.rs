//! Images on the real engine: build, verify, save/load, and every refusal; what builds
//! leave behind is [`leftovers`].

use std::process::{Command, Stdio};

use crate::common::*;

mod build_args;
mod build_caches;
mod buildkit;
mod faults;
mod hidden;
mod hostile;
mod leftovers;
mod nix_recipe;
mod recipes;
mod warm;

/// A project whose image is `FROM scratch` plus a unique file, with lock files.
fn image_project(locks: &[&str]) -> Project {
    let p = Project::new(&manifest_with_locks(locks));
    p.write("image/Dockerfile", "FROM scratch\nCOPY nonce /nonce\n");
    p.write("image/nonce", nonce());
    p
}

/// `cibox image build`, returning the ID it prints (and removing the image on drop).
fn build(p: &Project) -> ImageGuard {
    require_engine();
    let r = {
        let _store = image_store_lock(false);
        p.cibox(&["image", "build"])
    };
    r.ok();
    let id = r.stdout.trim().to_string();
    assert!(id.starts_with("sha256:") && id.len() == 71, "{id}");
    ImageGuard(id)
}

fn full_fake_id() -> String {
    use std::hash::{BuildHasher, RandomState};
    let h = RandomState::new().hash_one(nonce());
    format!("sha256:{}", format!("{h:016x}").repeat(4))
}

#[test]
fn malformed_ids_are_refused_with_exit_3() {
    let p = image_project(&["image/*"]);
    for (id, why) in [
        ("ubuntu:22.04", "is a tag or name"),
        ("latest", "is a tag or name"),
        ("sha256:0123abcd", "short or truncated"),
        ("0123abcd", "is a short ID"),
        (&format!("sha256:{}", "AB".repeat(32)), "in upper case"),
        (&format!("sha256:{}", "zz".repeat(32)), "is not hex"),
        (&"ab".repeat(32), "lacks the `sha256:` prefix"),
    ] {
        p.cibox(&["image", "verify", id]).fails_with(3, why);
    }
}

#[test]
fn unknown_id_is_refused_and_never_pulled() {
    require_engine();
    let p = image_project(&["image/*"]);
    let id = full_fake_id();
    p.cibox(&["image", "verify", &id]).fails_with(
        3,
        "is not present in the local engine, and cibox never pulls",
    );
    assert!(!image_exists(&id));
}

#[test]
fn image_without_labels_is_refused() {
    let img = docker_build(&[]);
    let p = image_project(&["image/*"]);
    p.cibox(&["image", "verify", &img.0])
        .fails_with(3, "has no lockset labels");
}

#[test]
fn labels_that_disagree_are_refused() {
    let text = format!("{}  image/Dockerfile\n", "0".repeat(64));
    let wrong = format!("sha256:{}", "1".repeat(64));
    let img = docker_build(&[
        ("org.cibox.lockset", &wrong),
        ("org.cibox.lockset.files", &text),
    ]);
    let p = image_project(&["image/*"]);
    p.cibox(&["image", "verify", &img.0])
        .fails_with(3, "is not the digest of its org.cibox.lockset.files label");
}

#[test]
fn build_labels_and_verifies_from_flag_env_and_manifest() {
    let p = image_project(&["image/*"]);
    let img = build(&p);
    let r = p.cibox(&["-v", "image", "verify", &img.0]);
    r.ok();
    assert!(
        r.stdout.starts_with(&format!("verified {}", img.0)),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr.contains("image IDs are config digests")
            || r.stderr.contains("manifest/index digests"),
        "{}",
        r.stderr
    );
    run(cibox(p.path())
        .env("CIBOX_IMAGE", &img.0)
        .args(["image", "verify"]))
    .ok();
    let manifest = std::fs::read_to_string(p.path().join("cibox.yaml")).unwrap();
    p.write(
        "cibox.yaml",
        manifest.replace("image:\n", &format!("image:\n  id: {}\n", img.0)),
    );
    let r = p.cibox(&["image", "verify", "--json"]);
    r.ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["image"], img.0.as_str());
    assert_eq!(v["status"], "verified");
    // The labels the engine holds are exactly the lockset cibox prints.
    let lockset = p.cibox(&["image", "lockset"]);
    let out = Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{json .Config.Labels}}",
            &img.0,
        ])
        .output()
        .unwrap();
    let labels: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (text, digest) = lockset.stdout.rsplit_once("digest: ").unwrap();
    assert_eq!(labels["org.cibox.lockset.files"], text);
    assert_eq!(labels["org.cibox.lockset"], digest.trim());
}

#[test]
fn mismatch_names_each_changed_added_and_removed_lock_file() {
    let p = image_project(&["image/*", "locks/*.lock"]);
    p.write("locks/a.lock", "a1");
    p.write("locks/b.lock", "b1");
    let img = build(&p);
    p.write("locks/a.lock", "a2");
    std::fs::remove_file(p.path().join("locks/b.lock")).unwrap();
    p.write("locks/c.lock", "c1");
    let r = p.cibox(&["image", "verify", &img.0]);
    r.fails_with(
        3,
        "was built from different lock files (1 changed, 1 added, 1 removed)",
    );
    for line in [
        "changed: locks/a.lock",
        "added:   locks/c.lock",
        "removed: locks/b.lock",
    ] {
        assert!(r.stderr.contains(line), "missing `{line}`:\n{}", r.stderr);
    }
}

#[test]
fn save_then_load_restores_the_identical_id() {
    let p = image_project(&["image/*"]);
    let img = build(&p);
    let archive = p.path().join("backup.tar");
    let archive_s = archive.to_str().unwrap();
    p.cibox(&["image", "save", &img.0, "--to", archive_s]).ok();
    assert!(archive.metadata().unwrap().len() > 0);
    assert!(remove_image(&img.0));
    assert!(!image_exists(&img.0));
    let r = p.cibox(&["image", "load", "--from", archive_s]);
    r.ok();
    assert_eq!(r.stdout.trim(), img.0);
    assert!(r.stderr.contains("verified"), "{}", r.stderr);
    // Named again as `image build` named it, so the engine does not prune it.
    let tags = std::process::Command::new("docker")
        .args(["inspect", "--format", "{{json .RepoTags}}", &img.0])
        .output()
        .unwrap();
    let tags = String::from_utf8_lossy(&tags.stdout).to_string();
    assert!(tags.contains(":lockset-"), "{tags}");
    // From standard input too.
    remove_image(&img.0);
    let r = run(cibox(p.path())
        .args(["image", "load"])
        .stdin(Stdio::from(std::fs::File::open(&archive).unwrap())));
    r.ok();
    assert_eq!(r.stdout.trim(), img.0);
}

#[test]
fn load_of_a_mismatched_image_loads_but_refuses() {
    let p = image_project(&["image/*"]);
    let img = build(&p);
    let archive = p.path().join("backup.tar");
    p.cibox(&["image", "save", &img.0, "--to", archive.to_str().unwrap()])
        .ok();
    p.write("image/extra.lock", "new");
    p.cibox(&["image", "load", "--from", archive.to_str().unwrap()])
        .fails_with(3, "(0 changed, 1 added, 0 removed)");
    p.cibox(&[
        "image",
        "load",
        "--no-verify",
        "--from",
        archive.to_str().unwrap(),
    ])
    .ok();
}

#[test]
fn load_no_verify_skips_the_lockset_but_not_the_pin() {
    // --no-verify skips the lockset check only: an ID the manifest pins is still held
    // to (exit 3 when it differs); without a manifest there is no pin to hold to.
    let p = image_project(&["image/*"]);
    let img = build(&p);
    let archive = p.path().join("pinned.tar");
    let from = archive.to_str().unwrap();
    p.cibox(&["image", "save", &img.0, "--to", from]).ok();
    let manifest = std::fs::read_to_string(p.path().join("cibox.yaml")).unwrap();
    let pin = |id: &str| {
        manifest.replace(
            "  dockerfile: image/Dockerfile\n",
            &format!("  dockerfile: image/Dockerfile\n  id: \"{id}\"\n"),
        )
    };
    let wrong = full_fake_id();
    p.write("cibox.yaml", pin(&wrong));
    let r = p.cibox(&["image", "load", "--no-verify", "--from", from]);
    r.fails_with(3, &format!("pins {wrong}"));
    assert!(
        r.stdout.is_empty(),
        "a refused ID is not printed: {}",
        r.stdout
    );
    // Pinned right, with lock files that no longer match: loads (the lockset is skipped).
    p.write("cibox.yaml", pin(&img.0));
    p.write("image/extra.lock", "new");
    let r = p.cibox(&["image", "load", "--no-verify", "--from", from]);
    r.ok();
    assert_eq!(r.stdout.trim(), img.0);
    // No manifest at all: nothing to hold it to.
    let bare = tempfile::tempdir().unwrap();
    std::fs::create_dir(bare.path().join(".git")).unwrap();
    let r = run(cibox(bare.path()).args(["image", "load", "--no-verify", "--from", from]));
    r.ok();
    assert_eq!(r.stdout.trim(), img.0);
}

#[test]
fn corrupt_archive_is_refused() {
    require_engine();
    let p = image_project(&["image/*"]);
    let bad = p.write("bad.tar", "this is not a tar archive at all, just text");
    p.cibox(&["image", "load", "--from", bad.to_str().unwrap()])
        .fails_with(3, "loading the archive");
}

#[test]
fn save_refuses_unknown_and_malformed_ids() {
    require_engine();
    let p = image_project(&["image/*"]);
    let to = p.path().join("x.tar");
    p.cibox(&[
        "image",
        "save",
        &full_fake_id(),
        "--to",
        to.to_str().unwrap(),
    ])
    .fails_with(3, "is not present in the local engine");
    p.cibox(&[
        "image",
        "save",
        "busybox:latest",
        "--to",
        to.to_str().unwrap(),
    ])
    .fails_with(3, "is a tag");
    assert!(!to.exists());
}

#[test]
fn missing_engine_socket_is_exit_5() {
    let p = image_project(&["image/*"]);
    let r = run(cibox(p.path())
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args(["image", "verify", &full_fake_id()]));
    r.fails_with(
        5,
        "container engine unreachable at unix:///nonexistent/docker.sock",
    );
}

#[test]
fn a_fetch_reference_that_is_no_repository_name_is_usage_before_the_engine() {
    // The engine is unreachable here: whatever reaches it ends in 5. A repository path
    // with `..`, `.` or a component that does not start and end with a letter or digit
    // is not a name (docker's reference grammar) and is refused first, exit 2.
    let p = image_project(&["image/*"]);
    let digest = format!("sha256:{}", "a".repeat(64));
    for repo in [
        "127.0.0.1:5000/ci/../gpu",
        "127.0.0.1:5000/../gpu",
        "ci/./gpu",
        "ci/gpu/..",
        "ci/-gpu",
        "ci/gpu_",
        "ci/a..b",
        "../../etc",
    ] {
        let r = run(cibox(p.path())
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
            .args(["image", "fetch", &format!("{repo}@{digest}")]));
        r.fails_with(2, "is not a repository name");
    }
}

#[test]
fn refusing_engine_socket_is_exit_5() {
    let p = image_project(&["image/*"]);
    let sock = p.path().join("dead.sock");
    // Bind and close: the socket file stays, but nothing accepts on it.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let r = run(cibox(p.path())
        .env("DOCKER_HOST", format!("unix://{}", sock.display()))
        .args(["image", "build"]));
    r.fails_with(5, "container engine unreachable");
}

#[test]
fn build_never_pulls_a_missing_base_image() {
    require_engine();
    let p = image_project(&["image/*"]);
    let tag = format!("cibox-test-absent-{}:v1", nonce());
    p.write(
        "image/Dockerfile",
        format!("FROM {tag}\nCOPY nonce /nonce\n"),
    );
    p.cibox(&["image", "build"])
        .fails_with(3, "is not present locally, and cibox never pulls by tag");
}

#[test]
fn build_without_a_recipe_is_exit_2() {
    let p = Project::new(
        &manifest_with_locks(&["cibox.yaml"]).replace("  dockerfile: image/Dockerfile\n", ""),
    );
    p.cibox(&["image", "build"])
        .fails_with(2, "image `default` has no recipe");
}

#[test]
fn nix_recipe_without_nix_is_one_line() {
    let p = Project::new(
        &manifest_with_locks(&["cibox.yaml"])
            .replace("dockerfile: image/Dockerfile", "nix: .#image-demo"),
    );
    let r = run(cibox(p.path())
        .env("PATH", "/nonexistent")
        .args(["image", "build"]));
    r.fails_with(5, "needs Nix, and `nix` is not on PATH");
}

/// The files an image holds under `/ctx`, through `docker create` + `docker export`
/// (no container is started).
fn files_under_ctx(id: &str) -> Vec<String> {
    let created = Command::new("docker")
        .args(["create", id, "/none"])
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let cid = String::from_utf8_lossy(&created.stdout).trim().to_string();
    let export = Command::new("sh")
        .arg("-c")
        .arg(format!("docker export {cid} | tar -t"))
        .output()
        .unwrap();
    Command::new("docker")
        .args(["rm", "-f", &cid])
        .output()
        .unwrap();
    assert!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let mut files: Vec<String> = String::from_utf8_lossy(&export.stdout)
        .lines()
        .filter(|l| l.starts_with("ctx/") && !l.ends_with('/'))
        .map(str::to_string)
        .collect();
    files.sort();
    files
}

#[test]
fn build_sends_what_docker_build_sends_under_a_dockerignore() {
    require_engine();
    let p = image_project(&["image/Dockerfile", "image/.dockerignore"]);
    p.write("image/Dockerfile", "FROM scratch\nCOPY . /ctx/\n");
    p.write(
        "image/.dockerignore",
        "# a comment\n*.log\n!keep.log\nbuild\n!build/out/keep.txt\n**/secret*\ndocs/*.md\nDockerfile\n",
    );
    for f in [
        "a.log",
        "keep.log",
        "build/x.o",
        "build/out/keep.txt",
        "build/out/drop.txt",
        "src/secret.key",
        "src/main.py",
        "deep/er/secret",
        "docs/readme.md",
        "docs/sub/x.md",
        "docs/img.png",
        "name with space.txt",
    ] {
        p.write(&format!("image/{f}"), f);
    }
    // A FIFO, as a rootfs context has them (and device nodes), goes along to the
    // classic builder (BuildKit's COPY leaves special files out, as with docker).
    let fifo = p.path().join("image/src/pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let expected = |extra: &[&str], fifo: bool| -> Vec<String> {
        let mut files: Vec<String> = [
            ".dockerignore",
            "build/out/keep.txt",
            "docs/img.png",
            "docs/sub/x.md",
            "keep.log",
            "name with space.txt",
            "nonce",
            "src/main.py",
        ]
        .iter()
        .chain(extra)
        .chain(if fifo { &["src/pipe"][..] } else { &[][..] })
        .map(|f| format!("ctx/{f}"))
        .collect();
        files.sort();
        files
    };
    // The classic builder, theirs and ours.
    let classic = {
        let _store = image_store_lock(false);
        run(cibox(p.path())
            .env("DOCKER_BUILDKIT", "0")
            .args(["image", "build"]))
    };
    classic.ok();
    let classic = ImageGuard(classic.stdout.trim().to_string());
    let theirs = docker_build_dir(&p.path().join("image"), &[]);
    assert_eq!(
        files_under_ctx(&classic.0),
        expected(&[], true),
        "cibox, classic"
    );
    assert_eq!(
        files_under_ctx(&theirs.0),
        expected(&[], true),
        "docker build, classic"
    );
    // BuildKit, theirs and ours: the same, but that BuildKit reads the Dockerfile from
    // the context cibox sends it (docker's own sends it apart), so `COPY .` copies it
    // even where the .dockerignore leaves it out.
    let ours = build(&p);
    let theirs = docker_buildkit_dir(&p.path().join("image"));
    assert_eq!(
        files_under_ctx(&ours.0),
        expected(&["Dockerfile"], false),
        "cibox"
    );
    assert_eq!(
        files_under_ctx(&theirs.0),
        expected(&[], false),
        "docker build, BuildKit"
    );
}

#[test]
fn a_bad_dockerignore_pattern_is_named_and_nothing_is_built() {
    let p = image_project(&["image/Dockerfile"]);
    p.write("image/.dockerignore", "ok\n[z-a]\n");
    p.cibox(&["image", "build"])
        .fails_with(2, ".dockerignore:2: bad pattern `[z-a]`");
}

#[test]
fn an_image_pinned_by_digest_is_fetched_from_a_registry_and_verified() {
    let p = image_project(&["image/*"]);
    let built = build(&p);
    let pinned = push_to_registry(&built.0);
    assert!(
        remove_image(&built.0),
        "the built image could not be removed"
    );
    // Fetched by digest: the same image ID (the config digest), verified by lockset.
    let r = p.cibox(&["image", "fetch", &pinned]);
    r.ok();
    assert_eq!(r.stdout.trim(), built.0, "{}", r.stderr);
    assert!(image_exists(&built.0));
    // From the manifest's image.ref, with image.id pinning the same ID.
    let manifest = std::fs::read_to_string(p.path().join("cibox.yaml")).unwrap();
    let with_ref = manifest.replacen(
        "image:\n",
        &format!("image:\n  ref: \"{pinned}\"\n  id: \"{}\"\n", built.0),
        1,
    );
    assert_ne!(
        with_ref, manifest,
        "the manifest has no image: block to extend"
    );
    p.write("cibox.yaml", &with_ref);
    p.cibox(&["image", "fetch"]).ok();

    // Never a tag; a tag in the manifest is named with its position.
    let repo = pinned.split('@').next().unwrap();
    p.cibox(&["image", "fetch", &format!("{repo}:push")])
        .fails_with(2, "is not pinned by digest");
    p.write(
        "cibox.yaml",
        with_ref.replace(
            &format!("\"{pinned}\""),
            &format!("\"{repo}:v1@{}\"", pinned.split('@').nth(1).unwrap()),
        ),
    );
    p.cibox(&["image", "fetch"])
        .fails_with(2, "cibox.yaml:4:8: image.ref: ");
    // image.id pinning another image: exit 3, both IDs named.
    let other = format!("sha256:{}", "0".repeat(64));
    p.write("cibox.yaml", with_ref.replace(&built.0, &other));
    let r = p.cibox(&["image", "fetch"]);
    r.fails_with(3, "but the id of image `default` in");
    assert!(
        r.stderr.contains(&built.0) && r.stderr.contains(&other),
        "{}",
        r.stderr
    );
    // A digest the registry does not have: refused.
    p.write("cibox.yaml", &manifest);
    p.cibox(&[
        "image",
        "fetch",
        &format!("{repo}@sha256:{}", "1".repeat(64)),
    ])
    .fails_with(3, "pulling");
    // The source's locks changed since the push: the lockset no longer matches.
    p.write("image/nonce", "changed");
    p.cibox(&["image", "fetch", &pinned])
        .fails_with(3, "was built from different lock files");
}

/// `cibox image build` with extra arguments, under the image-store lock.
fn build_with(p: &Project, args: &[&str], envs: &[(&str, &str)]) -> Run {
    require_engine();
    let _store = image_store_lock(false);
    let mut c = cibox(p.path());
    c.args(["image", "build"]).args(args);
    for (k, v) in envs {
        c.env(k, v);
    }
    run(&mut c)
}

#[test]
fn a_dockerfile_build_gives_one_id_whenever_and_wherever_it_is_built() {
    // The demo image, from a copy of the example committed in a repository of its own:
    // built twice, and twice more without the cache (`--check`), it has one ID.
    let (work, copy) = copy_example("demo", "images/demo/make-rootfs.sh");
    git(&copy, &["init", "-q"]);
    git(&copy, &["add", "-A"]);
    git(&copy, &["commit", "-qm", "demo"]);
    let p = Project { dir: work };
    let build = |args: &[&str]| {
        let _store = image_store_lock(false);
        let r = run(cibox(&copy).args(["image", "build"]).args(args));
        r.ok();
        r
    };
    let first = build(&[]);
    let id = first.stdout.trim().to_string();
    let _guard = ImageGuard(id.clone());
    assert!(
        first.stderr.contains("file times set to 1, fixed"),
        "{}",
        first.stderr
    );
    // New file times, owners and a looser umask (another checkout, another runner)
    // change nothing.
    assert!(
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "find {0} -exec touch -h {{}} + && chmod -R g+w {0}/images && chown -R 1234:1234 {0}/images",
                copy.display()
            ))
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(build(&[]).stdout.trim(), id);
    let checked = build(&["--check"]);
    assert_eq!(checked.stdout.trim(), id);
    assert!(
        checked
            .stderr
            .contains("built twice, reproducible, and verified"),
        "{}",
        checked.stderr
    );
    // The ID is the archive's config digest, known without an engine.
    let archive = p.path().join("demo.tar");
    run(cibox(&copy)
        .args(["image", "save", &id, "--to"])
        .arg(&archive))
    .ok();
    let r = run(cibox(&copy).args(["image", "id", "--from"]).arg(&archive));
    r.ok();
    assert_eq!(r.stdout.trim(), id);
    let r = run(cibox(&copy)
        .args(["image", "id"])
        .stdin(Stdio::from(std::fs::File::open(&archive).unwrap())));
    r.ok();
    assert_eq!(r.stdout.trim(), id);
}

#[test]
fn a_build_that_is_not_reproducible_names_what_differs() {
    let p = image_project(&["image/*"]);
    let base = build(&p);
    // A base image with a shell, then a step whose output differs on every build.
    let shell = busybox_project(
        "  b:\n    gpus: 0\n    timeout: 1m\n    run: [\"true\"]\n",
        "",
    );
    p.write(
        "image/Dockerfile",
        format!(
            "FROM {}\nRUN head -c 16 /dev/urandom > /stamp\n",
            own_name("bt", &shell.image.0)
        ),
    );
    drop(base);
    let r = build_with(&p, &["--check"], &[]);
    r.fails_with(
        3,
        "not reproducible: two builds from the same inputs gave sha256:",
    );
    assert!(
        r.stderr.contains("layer 2: stamp (content)"),
        "{}",
        r.stderr
    );
}

#[test]
fn an_id_the_manifest_pins_must_be_what_the_build_and_the_archive_give() {
    let p = image_project(&["image/*"]);
    let img = build(&p);
    let archive = p.path().join("img.tar");
    p.cibox(&["image", "save", &img.0, "--to", archive.to_str().unwrap()])
        .ok();
    let wrong = full_fake_id();
    let manifest = std::fs::read_to_string(p.path().join("cibox.yaml")).unwrap();
    p.write(
        "cibox.yaml",
        manifest.replace(
            "  dockerfile: image/Dockerfile\n",
            &format!("  dockerfile: image/Dockerfile\n  id: \"{wrong}\"\n"),
        ),
    );
    let r = build_with(&p, &[], &[]);
    r.fails_with(3, &format!("image `default` is {}, but", img.0));
    assert!(r.stderr.contains(&format!("pins {wrong}")), "{}", r.stderr);
    p.cibox(&["image", "id", "--from", archive.to_str().unwrap()])
        .fails_with(3, &format!("pins {wrong}"));
    // Pinned right, both pass.
    p.write(
        "cibox.yaml",
        manifest.replace(
            "  dockerfile: image/Dockerfile\n",
            &format!("  dockerfile: image/Dockerfile\n  id: \"{}\"\n", img.0),
        ),
    );
    build_with(&p, &[], &[]).ok();
    let r = p.cibox(&["image", "id", "--from", archive.to_str().unwrap()]);
    r.ok();
    assert!(
        r.stderr.contains("it is the ID image `default` pins"),
        "{}",
        r.stderr
    );
}

#[test]
fn image_id_refuses_what_is_not_one_whole_image() {
    let p = image_project(&["image/*"]);
    let a = build(&p);
    p.write("image/nonce", nonce());
    let b = build(&p);
    let dir = p.path();
    let two = dir.join("two.tar");
    let out = Command::new("docker")
        .args(["save", "-o"])
        .arg(&two)
        .args([&a.0, &b.0])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let one = dir.join("one.tar");
    p.cibox(&["image", "save", &a.0, "--to", one.to_str().unwrap()])
        .ok();
    let bytes = std::fs::read(&one).unwrap();
    let cut = dir.join("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let text = dir.join("text.tar");
    std::fs::write(&text, "not an archive\n").unwrap();
    for (file, want) in [
        (&two, "holds 2 images"),
        (&cut, "truncated or incomplete"),
        (&text, "not a docker-archive"),
    ] {
        // No engine is needed, or asked.
        let r = run(cibox(dir)
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
            .args(["image", "id", "--from"])
            .arg(file));
        r.fails_with(2, want);
    }
}

#[test]
fn build_says_each_stage_as_it_goes() {
    let p = image_project(&["image/*"]);
    require_engine();
    let r = {
        let _store = image_store_lock(false);
        p.cibox(&["image", "build"])
    };
    r.ok();
    let _img = ImageGuard(r.stdout.trim().to_string());
    // What a quiet build would otherwise hide, in order.
    let mut at = 0;
    for stage in [
        "cibox: building ",
        "cibox: sending the build context to the engine: ",
        "cibox: building: [1/1] COPY nonce /nonce",
        "cibox: saving the engine's build",
        "cibox: normalising the build (",
        "cibox: loading the normalised image: ",
        "cibox: built and verified",
    ] {
        let found = r.stderr[at..]
            .find(stage)
            .unwrap_or_else(|| panic!("`{stage}` missing, or out of order:\n{}", r.stderr));
        at += found + stage.len();
    }
}
