//! Caches (issue 25): what an untrusted run writes is never seen again, a trusted run's
//! writes are, concurrent trusted writers both land, the cap holds, a full private
//! layer fails the batch without touching the cache, and a run without a granted
//! cache store is refused before anything starts.

use crate::common::*;

mod attacks;
mod scopes;

/// A store only root (the tests' user) can change, in a folder everyone may pass as a
/// host's would be (`/var/lib/...`), removed with its folder.
struct Store {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
}

impl Store {
    fn new() -> Store {
        Store::new_in(&std::env::temp_dir())
    }

    /// One in a folder of its own under `parent`.
    fn new_in(parent: &std::path::Path) -> Store {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir_in(parent).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.path().join("store");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        Store { _dir: dir, root }
    }

    /// A policy granting caches in this store.
    fn policy(&self, trusted: bool, extra: &str) -> String {
        format!(
            "version: 1\ncaches:\n  root: {}\n  trusted: {trusted}\n  private_size: 4m\n{extra}",
            self.root.display()
        )
    }
}

const CACHES: &str = "caches:\n  models: /cache/models\n";

/// Batches that write into the cache, read it, and fill it.
const BATCHES: &str = "  plant:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"echo planted > /cache/models/weights\", \"mkdir -p /cache/models/ckpt && echo step1 > /cache/models/ckpt/s1\", \"cat /cache/models/weights\"]\n  look:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"ls -la /cache/models; if [ -e /cache/models/weights ]; then echo SEEN: $(cat /cache/models/weights); else echo NOT-SEEN; fi\"]\n  fail:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"echo from-a-failed-run > /cache/models/weights\", \"false\"]\n  fill:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"dd if=/dev/zero of=/cache/models/big bs=1M count=16\"]\n";

fn project(store: &Store, trusted: bool) -> BusyboxProject {
    busybox_project(BATCHES, CACHES).with_policy(&store.policy(trusted, ""))
}

#[test]
fn what_an_untrusted_run_writes_no_later_run_sees() {
    let store = Store::new();
    let p = project(&store, false);
    let r = p.run(&["batch", "run", "plant"]);
    r.ok();
    assert!(r.stdout.contains("planted"), "{}", r.stdout);
    let rec = p.result("plant");
    let c = &rec["caches"][0];
    assert_eq!(c["name"], "models", "{rec}");
    assert_eq!(c["writes"], "private", "{rec}");
    assert!(c["wrote_bytes"].as_u64().unwrap() > 0, "{rec}");
    assert!(c["kept"].is_null(), "{rec}");
    // Neither an untrusted run nor a trusted one sees it.
    let r = p.run(&["batch", "run", "look"]);
    r.ok();
    assert!(r.stdout.contains("NOT-SEEN"), "{}", r.stdout);
    let trusted = HostPolicyFile::new(&store.policy(true, ""));
    let r = run(p
        .batch_cmd(&["batch", "run", "look"])
        .env("CIBOX_HOST_POLICY", trusted.path()));
    r.ok();
    assert!(r.stdout.contains("NOT-SEEN"), "{}", r.stdout);
    // Nothing of the batch is left: no holder container, no layer on disk.
    assert!(p.containers().is_empty(), "{:?}", p.containers());
    let work = store.root.join("bt/models/work");
    let left: Vec<_> = std::fs::read_dir(&work).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_trusted_run_that_passes_is_seen_by_the_next_and_one_that_fails_is_not() {
    let store = Store::new();
    let p = project(&store, true);
    p.run(&["batch", "run", "plant"]).ok();
    let rec = p.result("plant");
    let c = &rec["caches"][0];
    assert_eq!(c["writes"], "through", "{rec}");
    let kept = c["kept"].as_str().unwrap().to_string();
    assert_ne!(kept, c["generation"].as_str().unwrap(), "{rec}");
    let r = p.run(&["batch", "run", "look"]);
    r.ok();
    assert!(r.stdout.contains("SEEN: planted"), "{}", r.stdout);
    assert_eq!(p.result("look")["caches"][0]["generation"], kept.as_str());
    // A failed batch's writes are thrown away.
    let r = p.run(&["batch", "run", "fail"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(p.result("fail")["caches"][0]["kept"].is_null());
    let r = p.run(&["batch", "run", "look"]);
    assert!(r.stdout.contains("SEEN: planted"), "{}", r.stdout);
}

#[test]
fn a_pull_request_run_on_a_trusted_host_writes_privately() {
    // The approved-commit pattern starts from the base branch, so a runner group kept
    // to protected branches lets it in; the code it tests is the pull request's.
    let store = Store::new();
    let p = project(&store, true);
    for event in ["pull_request_target", "issue_comment", "merge_group"] {
        let mut c = p.batch_cmd(&["batch", "run", "plant"]);
        c.env("GITHUB_EVENT_NAME", event);
        let r = run(&mut c);
        r.ok();
        assert!(
            r.stderr.contains(&format!("this is a {event} run")),
            "{}",
            r.stderr
        );
        let rec = p.result("plant");
        assert_eq!(rec["caches"][0]["writes"], "private", "{rec}");
        assert!(rec["caches"][0]["kept"].is_null(), "{rec}");
        let r = p.run(&["batch", "run", "look"]);
        assert!(r.stdout.contains("NOT-SEEN"), "{}", r.stdout);
    }
    // A push's run on the same host keeps its writes.
    let mut c = p.batch_cmd(&["batch", "run", "plant"]);
    c.env("GITHUB_EVENT_NAME", "push");
    run(&mut c).ok();
    assert_eq!(p.result("plant")["caches"][0]["writes"], "through");
}

/// Issue 33: `reproduce` of a record (a pull request's downloaded `result.json`, say)
/// on a host that trusts its runs writes privately all the same: what the replay
/// writes never becomes the cache's current generation.
#[test]
fn a_replay_on_a_trusted_host_writes_privately() {
    let store = Store::new();
    let p = project(&store, false);
    let d = p.project.path();
    make_checkout(d);
    p.run(&["batch", "run", "plant"]).ok();
    let record = p.reports().join("plant/result.json");
    assert_eq!(p.result("plant")["caches"][0]["writes"], "private");
    let trusted = HostPolicyFile::new(&store.policy(true, ""));
    let replay = run(cibox(d)
        .env("CIBOX_HOST_POLICY", trusted.path())
        .env_remove("GITHUB_EVENT_NAME")
        .arg("reproduce")
        .arg(&record));
    replay.ok();
    assert!(replay.stdout.contains("planted"), "{}", replay.stdout);
    let run_id = p.result("plant")["run"].as_str().unwrap().to_string();
    let replayed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            d.join("cibox-reproduce")
                .join(&run_id)
                .join("plant/result.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(replayed["caches"][0]["writes"], "private", "{replayed}");
    assert!(replayed["caches"][0]["kept"].is_null(), "{replayed}");
    // A trusted run after it does not see what the replay wrote.
    let r = run(p
        .batch_cmd(&["batch", "run", "look"])
        .env("CIBOX_HOST_POLICY", trusted.path()));
    r.ok();
    assert!(r.stdout.contains("NOT-SEEN"), "{}", r.stdout);
    assert!(
        replay
            .stderr
            .contains("this is a replay of a recorded run (cibox reproduce)"),
        "{}",
        replay.stderr
    );
}

#[test]
fn a_private_layer_that_fills_up_fails_the_batch_and_leaves_the_cache_as_it_was() {
    let store = Store::new();
    let p = project(&store, false);
    let r = p.run(&["batch", "run", "fill"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let rec = p.result("fill");
    let c = &rec["caches"][0];
    assert_eq!(c["full"], true, "{rec}");
    assert!(
        c["problem"].as_str().unwrap().contains("filled up"),
        "{rec}"
    );
    // Said where a person looks first: the batch's message and its closing line.
    let message = rec["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cache ") && message.contains("filled up"),
        "{rec}"
    );
    assert!(r.stderr.contains("filled up"), "{}", r.stderr);
    assert!(p.containers().is_empty(), "{:?}", p.containers());
    let r = p.run(&["batch", "run", "look"]);
    assert!(r.stdout.contains("NOT-SEEN"), "{}", r.stdout);
}

#[test]
fn caches_need_the_hosts_word() {
    let store = Store::new();
    // No policy: refused before anything starts.
    let p = busybox_project(BATCHES, CACHES);
    require_no_host_policy();
    p.run(&["batch", "run", "look"]).fails_with(
        2,
        "batches.look.caches: cache `models` at `/cache/models` is not granted on this host",
    );
    assert!(p.containers().is_empty());
    // A policy without caches, or one that lists other projects.
    let p = p.with_policy("version: 1\n");
    p.run(&["batch", "run", "look"])
        .fails_with(2, "has no `caches:` section");
    let p = p.with_policy(&store.policy(true, "  projects: [other]\n"));
    p.run(&["batch", "run", "look"])
        .fails_with(2, "does not list project `bt`");
    // A store others may write is refused, nothing made.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&store.root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let p = p.with_policy(&store.policy(true, ""));
    p.run(&["batch", "run", "look"])
        .fails_with(2, "others may write it");
    assert!(p.containers().is_empty());
    assert!(!store.root.join("bt").exists());
}

/// Issue 33: a manifest names its own project, so on a host serving several
/// repositories a pull request of one could name another's and read its caches. The
/// policy binds each project to its repository; a run of any other (or of none
/// known) is refused before anything starts.
#[test]
fn a_projects_caches_are_its_repositorys_alone() {
    let store = Store::new();
    let p = busybox_project(BATCHES, CACHES)
        .with_policy(&store.policy(true, "  projects: {bt: THUDM/slime}\n"));
    let look = |repo: Option<&str>| {
        let mut c = p.batch_cmd(&["batch", "run", "look"]);
        c.env_remove("GITHUB_EVENT_NAME");
        match repo {
            Some(r) => c.env("GITHUB_REPOSITORY", r),
            None => c.env_remove("GITHUB_REPOSITORY"),
        };
        run(&mut c)
    };
    let r = look(Some("mallory/slime"));
    r.fails_with(
        2,
        "batches.look.caches: cache `models` at `/cache/models` is not granted on this host: the host policy's caches.projects binds project `bt` to the repository THUDM/slime, and this run is of mallory/slime",
    );
    assert!(p.containers().is_empty(), "{:?}", p.containers());
    assert!(!store.root.join("bt").exists(), "nothing made in the store");
    assert!(!p.reports().join("look").exists(), "no batch folder");
    look(None).fails_with(2, "GITHUB_REPOSITORY is not set");
    // The project's own repository, however GitHub cases it.
    let r = look(Some("thudm/slime"));
    r.ok();
    assert!(r.stdout.contains("NOT-SEEN"), "{}", r.stdout);
    // A project the mapping does not name.
    let p = p.with_policy(&store.policy(true, "  projects: {slime: THUDM/slime}\n"));
    run(p
        .batch_cmd(&["batch", "run", "look"])
        .env("GITHUB_REPOSITORY", "THUDM/slime"))
    .fails_with(2, "does not list project `bt`");
}

#[test]
fn concurrent_trusted_writers_both_land_and_the_cap_evicts_the_least_recently_used() {
    let store = Store::new();
    let batches = "  one:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"mkdir /cache/models/one && dd if=/dev/zero of=/cache/models/one/w bs=1k count=40 && sleep 1\"]\n  two:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"mkdir /cache/models/two && dd if=/dev/zero of=/cache/models/two/w bs=1k count=40 && sleep 1\"]\n  three:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"mkdir /cache/models/three && dd if=/dev/zero of=/cache/models/three/w bs=1k count=40\"]\n  look:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"ls /cache/models\"]\n";
    let p = busybox_project(batches, CACHES).with_policy(&store.policy(true, "  size: 100k\n"));
    // Two runs at once, each in a reports folder of its own.
    let spawn = |name: &str| {
        let reports = p.project.path().join(format!("reports-{name}"));
        p.batch_cmd(&["batch", "run", name, "--reports", reports.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (spawn("one"), spawn("two"));
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    let r = p.run(&["batch", "run", "look"]);
    r.ok();
    assert!(
        r.stdout.contains("one") && r.stdout.contains("two"),
        "{}",
        r.stdout
    );
    // A third entry passes the cap (100k; each entry about 44k): the least recently
    // used goes.
    p.run(&["batch", "run", "three"]).ok();
    let rec = p.result("three");
    let evicted = rec["caches"][0]["evicted"].as_array().unwrap();
    assert_eq!(evicted.len(), 1, "{rec}");
    assert_ne!(evicted[0], "three", "{rec}");
    let r = p.run(&["batch", "run", "look"]);
    assert!(r.stdout.contains("three"), "{}{}", r.stdout, r.stderr);
    // What `cache list` and `inspect` show, and a prune that starts it again.
    let list = run(&mut p.batch_cmd_bare(&["cache", "list", "--json"]));
    list.ok();
    let v: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(v["caches"][0]["name"], "models", "{v}");
    assert!(
        v["caches"][0]["bytes"].as_u64().unwrap() <= 100 << 10,
        "{v}"
    );
    let r = run(&mut p.batch_cmd_bare(&["cache", "prune", "models", "--all"]));
    r.ok();
    assert!(r.stdout.contains("starts again empty"), "{}", r.stdout);
    let r = p.run(&["batch", "run", "look"]);
    assert!(!r.stdout.contains("three"), "{}", r.stdout);
}
