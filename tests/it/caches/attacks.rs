//! Caches attacked (issue 25): what a pull request's batch (its code and its manifest)
//! and another local user can do to a cache, and what a trusted batch can plant that
//! would hurt cibox itself while it merges, evicts or prunes.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::Store;
use crate::common::*;

/// A project whose batches each run `sh /src/NAME.sh`, under an untrusted policy
/// (`extra` added to it); [`Scripted::trusted`] runs one under a trusted policy.
struct Scripted {
    p: BusyboxProject,
    trusted: HostPolicyFile,
}

fn scripted(store: &Store, scripts: &[(&str, &str)], extra: &str) -> Scripted {
    let batches: String = scripts
        .iter()
        .map(|(name, _)| {
            format!("  {name}:\n    gpus: 0\n    timeout: 3m\n    verdict: exit-code\n    run: [\"sh /src/{name}.sh\"]\n")
        })
        .collect();
    let p = busybox_project(&batches, super::CACHES).with_policy(&store.policy(false, extra));
    for (name, text) in scripts {
        p.project.write(&format!("{name}.sh"), text);
    }
    Scripted {
        p,
        trusted: HostPolicyFile::new(&store.policy(true, extra)),
    }
}

impl Scripted {
    fn untrusted(&self, batch: &str) -> Run {
        self.p.run(&["batch", "run", batch])
    }

    fn trusted(&self, batch: &str) -> Run {
        run(self
            .p
            .batch_cmd(&["batch", "run", batch])
            .env("CIBOX_HOST_POLICY", self.trusted.path()))
    }
}

/// Runs `cmd` to its end, or stops it and fails the test when it has not ended after
/// `secs`: cibox hangs on `what` (a limit far above what the run needs, not a measure
/// of speed).
fn finishes(cmd: &mut std::process::Command, secs: u64, what: &str) -> Run {
    let out = tempfile::tempdir().unwrap();
    let (o, e) = (out.path().join("out"), out.path().join("err"));
    let mut child = cmd
        .stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap())
        .spawn()
        .unwrap();
    let mut status = None;
    wait_until(secs, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "cibox had not ended {secs} s after it started, on {what}:\n{}{}",
            std::fs::read_to_string(&o).unwrap_or_default(),
            std::fs::read_to_string(&e).unwrap_or_default()
        );
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: std::fs::read_to_string(&o).unwrap(),
        stderr: std::fs::read_to_string(&e).unwrap(),
    }
}

/// The cache's folder in the store, and its current generation's.
fn cache_dir(store: &Store) -> PathBuf {
    store.root.join("bt/models")
}

fn current_gen(store: &Store) -> PathBuf {
    let dir = cache_dir(store);
    let name = std::fs::read_to_string(dir.join("current")).unwrap();
    dir.join("gens").join(name.trim())
}

/// Every entry below `dir` as a line (name, type, mode, owner, size, and a plain
/// file's text when short), links never followed.
fn snapshot(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let md = std::fs::symlink_metadata(&d).unwrap();
        let rel = d.strip_prefix(dir).unwrap().display().to_string();
        let ft = md.file_type();
        let what = if ft.is_dir() {
            "dir".to_string()
        } else if ft.is_symlink() {
            format!("link->{}", std::fs::read_link(&d).unwrap().display())
        } else if ft.is_fifo() {
            "fifo".into()
        } else if ft.is_file() && md.len() < 4096 {
            format!("file={:?}", std::fs::read_to_string(&d).unwrap_or_default())
        } else {
            format!("other {:o}", md.mode() & 0o170000)
        };
        out.push(format!(
            "{rel:?} {what} {:o} {}:{} {}",
            md.mode() & 0o7777,
            md.uid(),
            md.gid(),
            md.len()
        ));
        if ft.is_dir() {
            for e in std::fs::read_dir(&d).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out.sort();
    out
}

/// What a batch sees of the cache: every entry's name, type, mode and owner, every
/// file's digest, and the text of the seeded files.
const LOOK: &str = "cd /cache/models && find . -exec stat -c '%n %F %a %u' {} + | sort && find . -type f -exec md5sum {} + | sort && cat weights dir/file gone/f && readlink link && echo LOOKED\n";

/// What a batch printed, without cibox's own lines.
fn seen(r: &Run) -> Vec<&str> {
    r.stdout
        .lines()
        .filter(|l| !l.starts_with("cibox "))
        .collect()
}

/// A trusted run seeds the cache.
const SEED: &str = "set -e\ncd /cache/models\necho clean > weights\nmkdir dir gone\necho clean > dir/file\necho clean > gone/f\nln -s weights link\n";

/// An untrusted batch tries every way it has to leave something in the cache.
const POISON: &str = r#"cd /cache/models || exit 1
try() { "$@" || echo "FAILED: $*"; }
try sh -c 'echo poison >> weights'
try ln weights hl
try sh -c 'echo poison >> hl'
try mv dir/file dir/moved
try sh -c 'echo poison > dir/file'
try rm -rf gone
try rm link
try ln -s /etc/passwd link
try ln -s / evil
try mkfifo fifo
mknod dev c 1 3 2>/dev/null && echo MKNOD-WORKED
try sh -c 'echo x > suid'
try chmod 4755 suid
try chmod 777 . dir
try truncate -s 1073741824 huge
try mkdir -p many
(cd many && seq 10000 | xargs touch) || echo "FAILED: many"
try mkdir deep
(cd deep && for i in $(seq 200); do mkdir d && cd d || exit 1; done) || echo "FAILED: deep"
try touch "$(printf 'new\nline')"
echo ATTACKED
"#;

#[test]
fn an_untrusted_batch_leaves_nothing_in_the_cache_whatever_it_plants() {
    let store = Store::new();
    let s = scripted(
        &store,
        &[("seed", SEED), ("poison", POISON), ("look", LOOK)],
        "",
    );
    s.trusted("seed").ok();
    let before_look = s.untrusted("look");
    before_look.ok();
    assert!(
        before_look.stdout.contains("LOOKED"),
        "{}",
        before_look.stdout
    );
    let gen_before = current_gen(&store);
    let before = snapshot(&cache_dir(&store));

    let r = s.untrusted("poison");
    r.ok();
    assert!(r.stdout.contains("ATTACKED"), "{}", r.stdout);
    assert!(!r.stdout.contains("FAILED"), "{}", r.stdout);
    assert!(!r.stdout.contains("MKNOD-WORKED"), "{}", r.stdout);
    let rec = s.p.result("poison");
    assert_eq!(rec["caches"][0]["writes"], "private", "{rec}");
    assert!(rec["caches"][0]["kept"].is_null(), "{rec}");

    // The store is as it was, but for the times of use.
    assert_eq!(current_gen(&store), gen_before);
    let after = snapshot(&cache_dir(&store));
    let without_locks = |s: &[String]| -> Vec<String> {
        s.iter()
            .filter(|l| !l.contains(".lock\""))
            .cloned()
            .collect()
    };
    assert_eq!(without_locks(&after), without_locks(&before));
    // Batches after it, untrusted or trusted, see what the seed left.
    for look in [s.untrusted("look"), s.trusted("look")] {
        look.ok();
        assert_eq!(seen(&look), seen(&before_look));
    }
    assert!(s.p.containers().is_empty(), "{:?}", s.p.containers());
}

/// A file of 1 PiB that takes no room: the archive of the private layer would stream it
/// all, and cibox measured the layer by reading that archive to its end.
#[test]
fn a_sparse_file_in_a_private_layer_does_not_hold_cibox() {
    let store = Store::new();
    let s = scripted(
        &store,
        &[(
            "sparse",
            "truncate -s 1125899906842624 /cache/models/huge && echo PLANTED\n",
        )],
        "",
    );
    let r = finishes(
        &mut s.p.batch_cmd(&["batch", "run", "sparse"]),
        180,
        "measuring a private layer that holds a sparse file of 1 PiB",
    );
    r.ok();
    assert!(r.stdout.contains("PLANTED"), "{}", r.stdout);
    let rec = s.p.result("sparse");
    let c = &rec["caches"][0];
    assert!(c["wrote_bytes"].as_u64().unwrap() >= 1 << 50, "{rec}");
    assert!(s.p.containers().is_empty(), "{:?}", s.p.containers());
}

/// Runs `sh -c script` as the host's `nobody` (uid 65534: the user batches run as when
/// cibox is root, and that of many a daemon); whether it succeeded.
fn as_nobody(script: &str) -> bool {
    std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("setpriv (util-linux)")
        .success()
}

/// The files a trusted run kept are the batch user's, and a generation is what every
/// later batch loads: no other local user may reach them, nor hold the cache's locks
/// (a lock needs only a file one can open, and a lock held forever stops every batch).
#[test]
fn another_local_user_can_neither_change_read_nor_lock_a_cache() {
    let store = Store::new();
    let s = scripted(&store, &[("seed", SEED), ("look", LOOK)], "");
    s.trusted("seed").ok();
    let generation = current_gen(&store);
    let dir = cache_dir(&store);
    assert!(
        !as_nobody(&format!("echo poison >> {}/weights", generation.display())),
        "another user wrote the current generation"
    );
    assert!(
        !as_nobody(&format!("cat {}/weights", generation.display())),
        "another user read the current generation"
    );
    for lock in ["cache.lock", "current"] {
        assert!(
            !as_nobody(&format!("flock -n -x {}/{lock} true", dir.display())),
            "another user could lock {lock}"
        );
    }
    let r = s.untrusted("look");
    r.ok();
    assert!(!r.stdout.contains("poison"), "{}", r.stdout);
}

/// What a trusted batch could plant to hurt cibox when it merges the layer, evicts and
/// prunes: links out of the store (to a host folder and a file), a folder nobody may
/// enter, a FIFO, a setuid file, hard links, a name with a newline, a deep tree, a top
/// folder open to all.
const HAZARDS: &str = r#"set -e
cd /cache/models
ln -s "$OUTSIDE" to-dir
ln -s "$OUTSIDE/precious" to-file
mkdir shut
echo x > shut/f
chmod 000 shut
mkfifo fifo
echo s > suid
chmod 4755 suid
echo a > hard1
ln hard1 hard2
touch "$(printf 'new\nline')"
mkdir deep
(cd deep && for i in $(seq 200); do mkdir d && cd d; done && echo bottom > f)
chmod 777 .
echo PLANTED
"#;

/// Lists the hazards as a batch sees them.
const HAZARDS_SEEN: &str = "cd /cache/models && ls -la && readlink to-dir && readlink to-file && find deep -name f && stat -c '%a %h' suid hard1 && echo LOOKED\n";

/// Writes more than the cap: eviction drops every older entry, then this one.
const OVER_CAP: &str = "dd if=/dev/zero of=/cache/models/zz bs=1k count=4096\n";

#[test]
fn what_a_trusted_batch_plants_does_not_lead_cibox_out_of_the_store() {
    let store = Store::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(outside.path().join("precious"), "keep").unwrap();
    std::fs::create_dir(outside.path().join("sub")).unwrap();
    std::fs::write(outside.path().join("sub/f"), "keep too").unwrap();
    let before = snapshot(outside.path());
    let plant = HAZARDS.replace("$OUTSIDE", &outside.path().display().to_string());
    let s = scripted(
        &store,
        &[
            ("plant", &plant),
            ("look", HAZARDS_SEEN),
            ("over", OVER_CAP),
        ],
        "  size: 2m\n",
    );
    let r = s.trusted("plant");
    r.ok();
    assert!(r.stdout.contains("PLANTED"), "{}", r.stdout);
    let rec = s.p.result("plant");
    let c = &rec["caches"][0];
    assert!(c["kept"].is_string(), "{rec}");
    assert!(c["problem"].is_null(), "{rec}");
    assert!(c["evicted"].as_array().is_none_or(Vec::is_empty), "{rec}");
    assert_eq!(snapshot(outside.path()), before);
    // The next batch sees all of it.
    let r = s.untrusted("look");
    r.ok();
    assert!(r.stdout.contains("LOOKED"), "{}", r.stdout);
    assert!(r.stdout.contains("4755 1"), "{}", r.stdout);
    assert!(r.stdout.contains("644 2"), "{}", r.stdout);
    assert!(r.stdout.contains("/d/f"), "{}", r.stdout);
    // Eviction drops it all, and a prune starts the cache again.
    s.trusted("over").ok();
    let rec = s.p.result("over");
    let evicted: Vec<&str> = rec["caches"][0]["evicted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for planted in [
        "to-dir",
        "to-file",
        "shut",
        "fifo",
        "suid",
        "hard1",
        "hard2",
        "new\nline",
        "deep",
    ] {
        assert!(evicted.contains(&planted), "{planted}: {rec}");
    }
    assert!(rec["caches"][0]["problem"].is_null(), "{rec}");
    assert_eq!(snapshot(outside.path()), before);
    let r = run(&mut s.p.batch_cmd_bare(&["cache", "prune", "models", "--all"]));
    r.ok();
    assert_eq!(snapshot(outside.path()), before);
    let dir = cache_dir(&store);
    let gens: Vec<String> = std::fs::read_dir(dir.join("gens"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert_eq!(gens.len(), 1, "{gens:?}");
    assert_eq!(std::fs::read_dir(dir.join("work")).unwrap().count(), 0);
}

/// A file with as many names as ext4 allows (65,000), setuid: none of its names can be
/// linked into the new generation, and each was copied (65,000 copies, as root: a
/// setuid file of root's).
const MANY_LINKS: &str = r#"set -e
cd /cache/models
mkdir links && cd links
mkdir a
dd if=/dev/zero of=a/f bs=4k count=1 2>/dev/null
chmod 4755 a/f
for i in $(seq 254); do ln a/f a/f$i; done
for i in $(seq 255); do cp -al a d$i 2>/dev/null || true; done
stat -c 'LINKS %h' a/f
"#;

#[test]
fn a_file_with_the_most_links_is_copied_once_as_its_owners() {
    // On disk (ext4 here): /tmp may be a tmpfs, which has no limit on links.
    let store = Store::new_in(std::path::Path::new("/var/tmp"));
    let s = scripted(&store, &[("links", MANY_LINKS)], "");
    let r = s.trusted("links");
    r.ok();
    assert!(
        r.stdout.contains("LINKS 65000"),
        "the store's file system should stop a file at 65,000 links, as ext4 does: {}",
        r.stdout
    );
    let rec = s.p.result("links");
    assert!(rec["caches"][0]["kept"].is_string(), "{rec}");
    assert!(rec["caches"][0]["problem"].is_null(), "{rec}");
    let mut inodes = std::collections::HashMap::new();
    let mut stack = vec![current_gen(&store).join("links")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            if md.is_dir() {
                stack.push(e.path());
            } else {
                inodes.insert(md.ino(), (md.uid(), md.mode() & 0o7777));
            }
        }
    }
    assert!(inodes.len() <= 2, "{} copies of one file", inodes.len());
    for (uid, mode) in inodes.values() {
        assert_eq!((*uid, *mode), (65534, 0o4755));
    }
}

/// A cache holds what batches wrote: setuid files among them (see above). However the
/// batch is confined, its cache is mounted as its other writable folders are, with no
/// setuid bit or device file honoured.
#[test]
fn a_cache_is_mounted_nosuid_and_nodev() {
    let store = Store::new();
    let s = scripted(
        &store,
        &[("mounts", "grep ' /cache/models ' /proc/mounts\n")],
        "",
    );
    for r in [s.untrusted("mounts"), s.trusted("mounts")] {
        r.ok();
        let line = r
            .stdout
            .lines()
            .find(|l| l.contains(" /cache/models "))
            .unwrap_or_else(|| panic!("{}", r.stdout));
        assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    }
}

/// A tree whose paths pass what the host's calls take (4,096 bytes): 30 folders of 200
/// letters, made from the bottom up. The batch passes; its layer cannot be merged.
const TOO_LONG: &str = r#"set -e
cd /cache/models
mkdir keep
echo kept > keep/f
n=$(printf 'x%.0s' $(seq 200))
mkdir t0
echo bottom > t0/f
for i in $(seq 30); do mkdir t$i && mv t$((i - 1)) t$i/$n; done
mv t30 long
echo WROTE
"#;

#[test]
fn a_layer_that_cannot_be_merged_is_named_and_thrown_away() {
    let store = Store::new();
    let s = scripted(
        &store,
        &[("long", TOO_LONG), ("look", LOOK), ("seed", SEED)],
        "",
    );
    s.trusted("seed").ok();
    let before = snapshot(&current_gen(&store));
    let r = s.trusted("long");
    r.ok();
    assert!(r.stdout.contains("WROTE"), "{}", r.stdout);
    let rec = s.p.result("long");
    let c = &rec["caches"][0];
    assert!(c["kept"].is_null(), "{rec}");
    assert!(c["problem"].as_str().unwrap().contains("not kept"), "{rec}");
    // The cache is as it was, and nothing of the layer is left.
    assert_eq!(snapshot(&current_gen(&store)), before);
    let work = cache_dir(&store).join("work");
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
    s.trusted("look").ok();
}

/// The volumes a container mounts (named or anonymous).
fn volumes_of(container: &str) -> Vec<String> {
    BusyboxProject::inspect(container, "{{range .Mounts}}{{.Name}} {{end}}")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn volume_exists(name: &str) -> bool {
    std::process::Command::new("docker")
        .args(["volume", "inspect", name])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Writes into the cache, then waits to be killed.
const WRITE_AND_WAIT: &str = "echo half > /cache/models/half && sleep 120\n";

#[test]
fn cibox_killed_mid_batch_leaves_nothing_that_stops_the_next_run() {
    let store = Store::new();
    let s = scripted(
        &store,
        &[("wait", WRITE_AND_WAIT), ("seed", SEED), ("look", LOOK)],
        "",
    );
    s.trusted("seed").ok();
    let generation = current_gen(&store);
    for trusted in [false, true] {
        let mut cmd = s.p.batch_cmd(&["batch", "run", "wait"]);
        if trusted {
            cmd.env("CIBOX_HOST_POLICY", s.trusted.path());
        }
        let mut child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let want = if trusted { 1 } else { 2 };
        assert!(
            wait_until(60, || s.p.containers().len() == want
                && s.p
                    .containers()
                    .iter()
                    .all(
                        |c| BusyboxProject::inspect(c, "{{.State.Running}}") == "true"
                    )),
            "{:?}",
            s.p.containers()
        );
        std::thread::sleep(std::time::Duration::from_secs(1));
        let volumes: Vec<String> =
            s.p.containers()
                .iter()
                .flat_map(|c| volumes_of(c))
                .collect();
        assert!(!volumes.is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
        // The watchdogs remove the batch's container and the holder, with their volumes.
        assert!(
            wait_until(60, || s.p.containers().is_empty()),
            "left: {:?}",
            s.p.containers()
        );
        assert!(
            wait_until(30, || volumes.iter().all(|v| !volume_exists(v))),
            "volumes left: {volumes:?}"
        );
        assert_eq!(current_gen(&store), generation);
    }
    // A trusted run's layer is left behind (its lock free) until the next promotion.
    let r = s.trusted("look");
    r.ok();
    assert!(!r.stdout.contains("half"), "{}", r.stdout);
    let work = cache_dir(&store).join("work");
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
}

/// Many files: the promotion takes long enough to be caught.
const MANY_FILES: &str = "cd /cache/models && for d in $(seq 100); do mkdir -p d$d && (cd d$d && seq 1000 | xargs touch); done && echo WROTE\n";

#[test]
fn cibox_killed_mid_promotion_leaves_the_cache_as_it_was_and_the_next_run_cleans_up() {
    let store = Store::new();
    let s = scripted(
        &store,
        &[("many", MANY_FILES), ("seed", SEED), ("look", LOOK)],
        "",
    );
    s.trusted("seed").ok();
    let generation = current_gen(&store);
    let seen_before = s.untrusted("look");
    seen_before.ok();
    let gens = cache_dir(&store).join("gens");
    let making = || {
        std::fs::read_dir(&gens)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with('.'))
    };
    let mut child =
        s.p.batch_cmd(&["batch", "run", "many"])
            .env("CIBOX_HOST_POLICY", s.trusted.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
    assert!(
        wait_until(180, making),
        "no generation was being made (the promotion went too fast to catch?)"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(making(), "the half-made generation is left");
    assert_eq!(current_gen(&store), generation);
    // Readers see what the seed left; the next promotion cleans up.
    let r = s.untrusted("look");
    r.ok();
    assert_eq!(seen(&r), seen(&seen_before));
    s.trusted("look").ok();
    assert!(!making());
    let work = cache_dir(&store).join("work");
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
    let r = s.untrusted("look");
    assert_eq!(seen(&r), seen(&seen_before));
}

/// Reads the cache, waits while others change it, reads it again.
const READ_TWICE: &str = "cd /cache/models && cat weights dir/file && sleep 25 && echo AGAIN && cat weights dir/file && ls\n";

/// Changes what the seed wrote.
const CHANGE: &str = "cd /cache/models && echo changed > weights && rm -r dir && echo CHANGED\n";

#[test]
fn a_reader_keeps_its_generation_through_a_promotion_and_a_prune() {
    let store = Store::new();
    let s = scripted(
        &store,
        &[
            ("seed", SEED),
            ("read", READ_TWICE),
            ("change", CHANGE),
            ("look", LOOK),
        ],
        "",
    );
    s.trusted("seed").ok();
    let held = current_gen(&store);
    let reports = s.p.project.path().join("reports-read");
    let reader =
        s.p.batch_cmd(&[
            "batch",
            "run",
            "read",
            "--reports",
            reports.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_until(60, || s.p.containers().len() == 2),
        "{:?}",
        s.p.containers()
    );
    // A trusted writer promotes, then the cache is pruned and started again.
    let r = s.trusted("change");
    r.ok();
    assert_ne!(current_gen(&store), held);
    run(&mut s.p.batch_cmd_bare(&["cache", "prune", "models", "--all"])).ok();
    assert!(held.is_dir(), "the generation a batch reads was removed");
    assert!(
        !s.p.containers().is_empty(),
        "the reader ended before the writer and the prune were done: no race was tried"
    );
    let out = reader.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let (first, again) = text.split_once("AGAIN").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(first.matches("clean").count(), 2, "{text}");
    assert_eq!(again.matches("clean").count(), 2, "{text}");
    // Once nobody reads it, it goes.
    run(&mut s.p.batch_cmd_bare(&["cache", "prune", "models"])).ok();
    assert!(!held.exists());
    let r = s.untrusted("look");
    assert!(!r.stdout.contains("clean"), "{}", r.stdout);
}

/// The holder of private layers runs the batch's image (a pull request's, it may be)
/// as root: it is held to a little memory, CPU and processes, as the batch is to its own.
#[test]
fn the_holder_of_private_layers_is_held_to_little() {
    let store = Store::new();
    let s = scripted(&store, &[("wait", "sleep 30\n")], "");
    let mut child = s.p.spawn(&["batch", "run", "wait"]);
    let holder = || {
        s.p.containers()
            .into_iter()
            .find(|c| c.ends_with("-caches"))
    };
    assert!(
        wait_until(60, || holder().is_some()),
        "{:?}",
        s.p.containers()
    );
    let limits = BusyboxProject::inspect(
        &holder().unwrap(),
        "{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}} {{.HostConfig.PidsLimit}}",
    );
    let _ = child.kill();
    let _ = child.wait();
    let n: Vec<i64> = limits
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    assert!(n[0] > 0 && n[0] <= 64 << 20, "memory: {limits}");
    assert!(n[1] > 0 && n[1] <= 500_000_000, "CPU: {limits}");
    assert!(n[2] > 0 && n[2] <= 16, "processes: {limits}");
    assert!(wait_until(60, || s.p.containers().is_empty()));
    // What the batch writes into its private layers is its own memory, not the
    // holder's: 100 MiB is written whatever the holder may use.
    let store = Store::new();
    let s = scripted(
        &store,
        &[(
            "write",
            "dd if=/dev/zero of=/cache/models/big bs=1M count=100 && echo WROTE\n",
        )],
        "",
    );
    let p = s.p.with_policy(&format!(
        "version: 1\ncaches:\n  root: {}\n  private_size: 200m\n",
        store.root.display()
    ));
    let r = p.run(&["batch", "run", "write"]);
    r.ok();
    assert!(r.stdout.contains("WROTE"), "{}", r.stdout);
}

/// A hundred thousand files, kept by a trusted run and written by an untrusted one.
#[test]
fn a_hundred_thousand_files_are_kept_or_thrown_away_whole() {
    let store = Store::new();
    let s = scripted(
        &store,
        &[
            ("many", MANY_FILES),
            ("count", "find /cache/models -type f | wc -l\n"),
        ],
        "",
    );
    s.trusted("many").ok();
    let rec = s.p.result("many");
    assert!(rec["caches"][0]["kept"].is_string(), "{rec}");
    assert!(rec["caches"][0]["problem"].is_null(), "{rec}");
    let r = s.untrusted("count");
    r.ok();
    assert!(seen(&r).contains(&"100000"), "{}", r.stdout);
    // Untrusted, into a private layer of 4 MiB: empty files take no room there.
    let r = s.untrusted("many");
    r.ok();
    let rec = s.p.result("many");
    assert!(!rec["caches"][0]["full"].as_bool().unwrap(), "{rec}");
    assert_eq!(
        std::fs::read_dir(cache_dir(&store).join("work"))
            .unwrap()
            .count(),
        0
    );
}
