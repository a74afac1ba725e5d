//! A batch's `/work` over the run's snapshot of the source: an overlay whose writes go
//! to a tmpfs of `container.disk` that cibox mounts on the host (cibox is root here),
//! writable, bounded, private to the batch, never writing through to the snapshot or
//! the source, and leaving nothing behind, whether the run ends or is killed. Where
//! cibox is not root, the batches copy the snapshot in, as before.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use super::*;

/// Where cibox mounts the runs' upper layers (`run::work_layer::BASE`).
const LAYERS: &str = "/run/cibox/work";

/// The mounts of this host whose options name `what` (the engine mounts the overlays
/// in the host's mount namespace, which the tests share).
fn mounts_naming(what: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .filter(|l| l.contains(what))
        .map(str::to_string)
        .collect()
}

/// The snapshot volumes of the project's scope.
fn volumes(p: &BusyboxProject) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(["volume", "ls", "-q", "--filter"])
        .arg(format!("label=org.cibox.scope={}", p.scope()))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Nothing of run `run` is left on the host: no folder of upper layers, no mount.
fn nothing_left_of(run: &str) {
    let dir = Path::new(LAYERS).join(run);
    assert!(!dir.exists(), "{} was left", dir.display());
    let mounts = mounts_naming(&dir.to_string_lossy());
    assert!(mounts.is_empty(), "mounts left: {mounts:?}");
}

/// A project whose two batches (one user, so one snapshot) each check what `/work`
/// is, change the source in it, and write past its 4 MiB.
fn writers() -> BusyboxProject {
    let steps = [
        // An overlay, not a tmpfs of its own.
        "grep -q ' /work overlay ' /proc/mounts",
        // The source as it is on the host: what the other batch wrote never shows.
        "test \"$(cat kept.txt)\" = original",
        "test ! -e made.txt",
        "test -e gone.txt",
        // Writable: a file of the source changed, one made, one removed.
        "echo changed > kept.txt && echo made > made.txt && rm gone.txt",
        "test \"$(cat kept.txt)\" = changed && test ! -e gone.txt",
        // Bounded: writing past container.disk fails, and says so.
        "if dd if=/dev/zero of=big bs=1M count=16 2>/tmp/dd.err; then echo 'wrote past the bound of /work'; exit 1; fi; grep -q 'No space left' /tmp/dd.err",
        "rm -f big",
    ];
    let p = busybox_project(
        &format!(
            "{}{}",
            batch("first", 0, "1m", &steps, "    allow_empty: true\n"),
            batch("second", 0, "1m", &steps, "    allow_empty: true\n")
        ),
        "  disk: 4m\n",
    );
    p.project.write("kept.txt", "original\n");
    p.project.write("gone.txt", "here\n");
    p
}

#[test]
fn a_batchs_work_is_an_overlay_writable_bounded_and_its_own() {
    let p = writers();
    let r = p.run(&["-v", "batch", "run", "first", "second"]);
    r.ok();
    // The path taken is said.
    assert!(
        r.stderr.contains("as an overlay over the run's snapshot"),
        "{}",
        r.stderr
    );
    // Nothing the batches wrote reached the source.
    let source = p.project.path();
    assert_eq!(
        std::fs::read_to_string(source.join("kept.txt")).unwrap(),
        "original\n"
    );
    assert!(source.join("gone.txt").exists() && !source.join("made.txt").exists());
    // Nothing left: no upper layer, no snapshot.
    let run = p.result("first")["run"].as_str().unwrap().to_string();
    nothing_left_of(&run);
    assert!(volumes(&p).is_empty(), "{:?}", volumes(&p));
}

#[test]
fn the_snapshot_is_unchanged_while_a_batch_writes_and_nothing_outlives_a_killed_run() {
    let p = busybox_project(
        &format!(
            "{}{}",
            batch(
                "writer",
                0,
                "10m",
                &[
                    "echo changed > kept.txt && rm gone.txt && echo made > made.txt && touch done && sleep 600"
                ],
                ""
            ),
            batch("after", 0, "1m", &["true"], "    allow_empty: true\n")
        ),
        "  disk: 4m\n",
    );
    p.project.write("kept.txt", "original\n");
    p.project.write("gone.txt", "here\n");
    // A lock dir of its own: only this test's sweeps judge its run.
    let locks = tempfile::tempdir().unwrap();
    let mut cibox = p
        .batch_cmd(&["batch", "run", "writer", "after"])
        .env("CIBOX_GPU_LOCK_DIR", locks.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let writers = || -> Vec<String> {
        p.containers()
            .into_iter()
            .filter(|c| c.contains("-writer-"))
            .collect()
    };
    let written = || {
        let c = writers();
        c.len() == 1
            && std::process::Command::new("docker")
                .args(["exec", &c[0], "test", "-e", "/work/done"])
                .status()
                .is_ok_and(|s| s.success())
    };
    assert!(wait_until(60, written), "the writer never wrote");
    // Its overlay is the engine's; cibox's tmpfs is off the host already.
    let container = writers().remove(0);
    let overlays = mounts_naming("upperdir=/run/cibox/work/");
    let run = BusyboxProject::inspect(&container, "{{index .Config.Labels \"org.cibox.run\"}}");
    assert!(
        overlays
            .iter()
            .any(|m| m.contains(&format!("/run/cibox/work/{run}/"))),
        "no overlay of run {run}: {overlays:?}"
    );
    // Of the run's folder, only its lock and the snapshot beneath the overlays (a
    // tmpfs cibox wrote the source into once) are on the host: the writer's upper
    // layer is the overlay's alone.
    let dir = Path::new(LAYERS).join(&run);
    let mut held: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    held.sort();
    assert_eq!(held, [".lock", "lower-65534-65534"]);
    // The snapshot beneath is as shipped.
    let lower = dir.join("lower-65534-65534");
    assert_eq!(
        std::fs::read_to_string(lower.join("kept.txt")).unwrap(),
        "original\n"
    );
    assert!(lower.join("gone.txt").exists() && !lower.join("made.txt").exists());
    assert!(!lower.join("done").exists());
    // Killed: its watchdog removes the container, and the overlay (with the tmpfs it
    // held) goes with it; the next sweep removes the snapshot.
    cibox.kill().unwrap();
    cibox.wait().unwrap();
    assert!(wait_until(15, || p.containers().is_empty()));
    assert!(
        wait_until(10, || mounts_naming(&format!(
            "upperdir=/run/cibox/work/{run}/"
        ))
        .is_empty()),
        "the overlay outlived its container"
    );
    // Its folder (its lock free now), with the snapshot's tmpfs, goes with the next
    // sweep.
    run_cleanup(&p, locks.path());
    nothing_left_of(&run);
    assert!(
        wait_until(10, || volumes(&p).is_empty()),
        "{:?}",
        volumes(&p)
    );
}

fn run_cleanup(p: &BusyboxProject, locks: &Path) {
    run(p
        .batch_cmd_bare(&["cleanup", "--scope", &p.scope()])
        .env("CIBOX_GPU_LOCK_DIR", locks))
    .ok();
}

/// A run killed between mounting an upper layer and starting its container leaves the
/// layer mounted on the host: the sweep of a later run (here `cibox cleanup`) removes
/// it, and leaves a live run's alone.
#[test]
fn the_sweep_removes_the_upper_layers_a_killed_run_left() {
    let p = busybox_project(
        "  quick:\n    gpus: 0\n    timeout: 1m\n    run: [\"true\"]\n",
        "",
    );
    let left = |run: &str| {
        let dir = Path::new(LAYERS).join(run);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("0"))
            .unwrap();
        let lock = std::fs::File::create(dir.join(".lock")).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(dir.join("0"))
            .status()
            .unwrap();
        assert!(ok.success(), "this test mounts a tmpfs: run it as root");
        std::fs::create_dir(dir.join("0/upper")).unwrap();
        (dir, lock)
    };
    // Run IDs no real run has (16 hex digits, from the nonce's time).
    let n = format!(
        "{:016x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    );
    let dead = format!("d{}", &n[1..]);
    let live = format!("e{}", &n[1..]);
    let (dead_dir, dead_lock) = left(&dead);
    drop(dead_lock);
    let (live_dir, live_lock) = left(&live);
    live_lock.try_lock().unwrap();
    let locks = tempfile::tempdir().unwrap();
    let r = run(p
        .batch_cmd_bare(&["cleanup", "--scope", &p.scope()])
        .env("CIBOX_GPU_LOCK_DIR", locks.path()));
    r.ok();
    assert!(!dead_dir.exists(), "{}", r.stderr);
    nothing_left_of(&dead);
    assert!(
        !mounts_naming(&live_dir.join("0").to_string_lossy()).is_empty(),
        "a live run's layer was swept"
    );
    // Its lock let go, it is dead too.
    drop(live_lock);
    run_cleanup(&p, locks.path());
    nothing_left_of(&live);
}

/// Where cibox is not root it cannot mount the upper layers: its batches copy the
/// run's snapshot into a memory-backed `/work`, still writable, still bounded, and say
/// so.
#[test]
fn a_cibox_that_is_not_root_copies_the_snapshot_instead() {
    let p = writers();
    // Its run steps check for an overlay: here /work is a tmpfs.
    let yaml = std::fs::read_to_string(p.project.path().join("cibox.yaml")).unwrap();
    p.project.write(
        "cibox.yaml",
        yaml.replace(
            "grep -q ' /work overlay ' /proc/mounts",
            "grep -q ' /work tmpfs ' /proc/mounts",
        ),
    );
    let home = tempfile::tempdir().unwrap();
    let mut c = p.batch_cmd(&["-v", "batch", "run", "first", "second"]);
    as_nobody(&mut c, &[p.project.path()], home.path());
    let r = run(&mut c);
    r.ok();
    assert!(
        r.stderr.contains("not an overlay") && r.stderr.contains("not root"),
        "{}",
        r.stderr
    );
    assert_eq!(
        std::fs::read_to_string(p.project.path().join("kept.txt")).unwrap(),
        "original\n"
    );
    assert!(volumes(&p).is_empty(), "{:?}", volumes(&p));
}

/// A run that ends by SIGTERM, SIGINT or its batch's timeout, with its batch writing
/// into `/work`, leaves nothing of it on the host: no folder, no mount, no volume, no
/// container; cibox itself removes them, with no sweep after it.
#[test]
fn a_run_cancelled_or_timed_out_leaves_no_layer_mount_or_volume() {
    let step = "echo changed > kept.txt && touch done && sleep 600";
    for (ending, timeout, code) in [
        ("SIGTERM", "10m", 143),
        ("SIGINT", "10m", 130),
        ("timeout", "4s", 124),
    ] {
        let p = busybox_project(&batch("long", 0, timeout, &[step], ""), "  disk: 4m\n");
        p.project.write("kept.txt", "original\n");
        let locks = tempfile::tempdir().unwrap();
        let mut cibox = p
            .batch_cmd(&["batch", "run", "long"])
            .env("CIBOX_GPU_LOCK_DIR", locks.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let written = || {
            let c = p.containers();
            c.len() == 1
                && std::process::Command::new("docker")
                    .args(["exec", &c[0], "test", "-e", "/work/done"])
                    .status()
                    .is_ok_and(|s| s.success())
        };
        assert!(wait_until(60, written), "{ending}: the batch never wrote");
        let run = BusyboxProject::inspect(
            &p.containers()[0],
            "{{index .Config.Labels \"org.cibox.run\"}}",
        );
        assert!(
            Path::new(LAYERS).join(&run).exists(),
            "{ending}: run {run} has no folder under {LAYERS}: not the overlay path"
        );
        let signal = match ending {
            "SIGTERM" => Some(nix::libc::SIGTERM),
            "SIGINT" => Some(nix::libc::SIGINT),
            _ => None,
        };
        if let Some(sig) = signal {
            unsafe { nix::libc::kill(cibox.id() as i32, sig) };
        }
        let status = cibox.wait().unwrap();
        assert_eq!(status.code(), Some(code), "{ending}");
        assert!(p.containers().is_empty(), "{ending}: {:?}", p.containers());
        nothing_left_of(&run);
        assert!(volumes(&p).is_empty(), "{ending}: {:?}", volumes(&p));
        assert_eq!(
            std::fs::read_to_string(p.project.path().join("kept.txt")).unwrap(),
            "original\n",
            "{ending}"
        );
    }
}
