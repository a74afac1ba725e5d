//! An engine that fails in the middle of a build's long way (issue 44): its save cut
//! short, a save that hangs and a build killed while waiting on it, the build's base
//! removed between the build and the load. Each ends with no image named that was not
//! verified, and nothing of the build's left behind (or left only for the next build
//! to remove).

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::Arc;

use super::buildkit::{built, labelled, project};
use crate::common::*;

const SAVING: &str = "saving the engine's build";

/// A file of `len` bytes no two tests share (so no layer is another test's).
fn noise(len: usize) -> Vec<u8> {
    let mut x = nonce().bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A project whose top layer is 4 MiB of noise, so a save cut at 1 MiB ends inside it.
fn big_project() -> (Project, String) {
    let (p, nonce) = project("COPY big /big\nCOPY nonce /nonce\n", "");
    p.write("big", noise(4 << 20));
    (p, nonce)
}

/// `cibox -v image build` through `engine` (a `DOCKER_HOST`), its temporary folders in
/// `tmp`.
fn build_through(p: &Project, engine: &str, tmp: &std::path::Path) -> Command {
    let mut c = cibox(p.path());
    c.args(["-v", "image", "build"])
        .env("DOCKER_HOST", engine)
        .env("TMPDIR", tmp);
    c
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The raw builds (`cibox-raw-build:…`) carrying this test's label.
fn raw_builds(nonce: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            "--filter",
            &format!("label=org.cibox.test.nonce={nonce}"),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("cibox-raw-build:"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_save_the_engine_cuts_short_fails_with_one_line_and_leaves_nothing() {
    let (p, nonce) = big_project();
    let before = labelled(&nonce);
    let proxy = EngineProxy::start(Fault::CutSave(1 << 20));
    let tmp = tempfile::tempdir().unwrap();
    let r = {
        let _store = image_store_lock(false);
        run(&mut build_through(&p, &proxy.host, tmp.path()))
    };
    assert!(r.stderr.contains(SAVING), "{}", r.stderr);
    r.fails_with(5, "container engine: saving the image failed");
    assert!(r.stdout.trim().is_empty(), "an ID printed: {}", r.stdout);
    let last = r.stderr.lines().last().unwrap_or("");
    assert!(last.starts_with("cibox: error: "), "{}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    // No image of this build is left (the base stage's label is on every one), nor
    // its scratch folder.
    assert!(raw_builds(&nonce).is_empty(), "{:?}", raw_builds(&nonce));
    let after = labelled(&nonce);
    assert!(
        after.iter().all(|id| before.contains(id)),
        "left: {after:?}"
    );
    assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
    // The engine as it is builds it, to an ID verified the long way.
    let img = {
        let _store = image_store_lock(false);
        let mut c = cibox(p.path());
        c.args(["-v", "image", "build"]).env("TMPDIR", tmp.path());
        built(&run(&mut c))
    };
    assert!(!img.0.is_empty());
}

#[test]
fn a_build_killed_while_the_engine_hangs_in_its_save_leaves_what_the_next_removes() {
    let (p, nonce) = big_project();
    let proxy = EngineProxy::start(Fault::StallSave(1 << 20));
    let tmp = tempfile::tempdir().unwrap();
    let store = image_store_lock(false);
    let mut killed = build_through(&p, &proxy.host, tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    for line in std::io::BufReader::new(killed.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains(SAVING) {
            break;
        }
    }
    assert!(seen.contains(SAVING), "{seen}");
    // Mid-stream: a megabyte in, the rest never coming.
    std::thread::sleep(std::time::Duration::from_millis(500));
    killed.kill().unwrap();
    killed.wait().unwrap();
    // Its raw build and scratch folder are left, and nothing else of it is named.
    assert_eq!(raw_builds(&nonce).len(), 1, "{seen}");
    let scratch = entries(tmp.path());
    assert_eq!(scratch.len(), 1, "{scratch:?}");
    // Judged only once it is a minute old (a build may not have locked it yet).
    std::fs::File::open(tmp.path().join(&scratch[0]))
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(120))
        .unwrap();
    let mut c = cibox(p.path());
    c.args(["-v", "image", "build"]).env("TMPDIR", tmp.path());
    let r = run(&mut c);
    drop(store);
    let _img = built(&r);
    assert!(
        r.stderr.contains("removed what killed builds had left"),
        "{}",
        r.stderr
    );
    assert!(raw_builds(&nonce).is_empty(), "{:?}", raw_builds(&nonce));
    assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
}

#[test]
fn a_base_removed_between_the_build_and_the_load_still_gives_the_same_id() {
    require_engine();
    // A base of the test's own, by ID, that the test removes while cibox loads.
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(ctx.path().join("base-file"), noise(1 << 20)).unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        "FROM scratch\nCOPY base-file /base-file\n",
    )
    .unwrap();
    let base = docker_build_dir(ctx.path(), &[]);
    let base_name = own_name("t", &base.0);
    let tagged = Command::new("docker")
        .args(["tag", &base.0, &base_name])
        .status()
        .unwrap();
    assert!(tagged.success());
    let make = || {
        let p = Project::new(&manifest_with_locks(&["image/Dockerfile", "image/nonce"]));
        p.write(
            "image/Dockerfile",
            format!("FROM {base_name}\nCOPY nonce /nonce\n"),
        );
        p
    };
    let p = make();
    let n = nonce();
    p.write("image/nonce", &n);
    // The long way with the base in place: the ID to expect.
    let want = {
        let _store = image_store_lock(false);
        built(&p.cibox(&["-v", "image", "build"]))
    };
    // Again, with nothing known of it (a fresh index), the base gone before the load.
    let removed = base.0.clone();
    let proxy = EngineProxy::start(Fault::BeforeLoad(Arc::new(move || {
        let _ = Command::new("docker")
            .args(["image", "rm", "-f", &removed])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    })));
    let want_id = want.0.clone();
    drop(want);
    let home = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let r = {
        let _store = image_store_lock(false);
        run(build_through(&p, &proxy.host, tmp.path()).env("XDG_CACHE_HOME", home.path()))
    };
    assert!(
        !image_exists(&base.0),
        "the base was not removed: {}",
        r.stderr
    );
    assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
    // The raw build, kept until the load, held the base's layers: the same ID, named,
    // though the archive loaded carried none of the base.
    let img = built(&r);
    assert_eq!(img.0, want_id, "{}", r.stderr);
    assert!(image_exists(&img.0));
}

/// The engine's own bug (moby/moby#41595): a build from its cache fails on a layer the
/// cache names but the engine no longer has, where builds and image removals share one
/// engine. cibox says so and builds once more without the cache: the build passes, to
/// the ID the engine gives without the proxy; a second such failure would fail it.
#[test]
fn a_build_the_engines_cache_fails_on_a_lost_layer_runs_again_without_the_cache() {
    let (p, _nonce) = project("COPY nonce /nonce\n", "");
    let lost = "failed to get layer sha256:931c2784846dd90b093d412406e4c328684a7c8af0a361a301134d975e92ea07: layer does not exist";
    let proxy = EngineProxy::start(Fault::fail_first_build(lost));
    let tmp = tempfile::tempdir().unwrap();
    let r = {
        let _store = image_store_lock(false);
        run(&mut build_through(&p, &proxy.host, tmp.path()))
    };
    assert!(
        r.stderr
            .contains("the engine's build cache names a layer the engine no longer has")
            && r.stderr.contains("moby/moby#41595")
            && r.stderr.contains("building again without the cache"),
        "{}",
        r.stderr
    );
    let through_proxy = built(&r);
    let direct = {
        let _store = image_store_lock(false);
        let mut c = cibox(p.path());
        c.args(["image", "build"]).env("TMPDIR", tmp.path());
        built(&run(&mut c))
    };
    assert_eq!(through_proxy.0, direct.0);
    // Another error of the engine's is not retried: it fails the build, once.
    let (p, _nonce) = project("COPY nonce /nonce\n", "");
    let proxy = EngineProxy::start(Fault::fail_first_build("no space left on device"));
    let r = {
        let _store = image_store_lock(false);
        run(&mut build_through(&p, &proxy.host, tmp.path()))
    };
    r.fails_with(3, "no space left on device");
    assert!(!r.stderr.contains("without the cache"), "{}", r.stderr);
}
