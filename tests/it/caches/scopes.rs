//! Issue 38: pull requests' cache scopes. Where the host keeps pull requests' writes
//! (`caches.pull_requests: keep`), a pull request's passing run keeps what it wrote in
//! its own scope: its next run reads it over the base's generation, another pull
//! request's run and a base run never do; a failing run's writes go; a scope over its
//! cap evicts; an event file that does not hold together is believed for nothing (the
//! run writes privately).

use super::*;

/// A policy that keeps pull requests' writes, for project `bt` of THUDM/slime.
fn scoped_policy(store: &Store, extra: &str) -> String {
    store.policy(
        true,
        &format!("  projects: {{bt: THUDM/slime}}\n  pull_requests: keep\n{extra}"),
    )
}

const HEAD: &str = "0123456789abcdef0123456789abcdef01234567";

/// A `pull_request_target` event file of pull request `number` (the top-level
/// `number` as `top`), of `repo`, in `dir`: mode 0644 as the runner writes it.
fn event_file(dir: &std::path::Path, number: &str, top: &str, repo: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("event-{n}.json"));
    std::fs::write(
        &path,
        format!(
            r#"{{"action":"labeled","number":{top},"pull_request":{{"number":{number},"head":{{"sha":"{HEAD}"}},"base":{{"repo":{{"full_name":"{repo}"}}}}}},"repository":{{"full_name":"{repo}"}}}}"#
        ),
    )
    .unwrap();
    path
}

/// Batches that read and write the cache as a pull request's tests would: `plant`
/// writes `weights` with its argument (the environment's `WHO`).
const SCOPE_BATCHES: &str = "  warm:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"echo base > /cache/models/.base\"]\n  plant:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    container: {pass_env: [WHO]}\n    run: [\"echo $WHO > /cache/models/weights\", \"mkdir -p /cache/models/$WHO && echo x > /cache/models/$WHO/f\"]\n  look:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"if [ -e /cache/models/weights ]; then echo SEEN: $(cat /cache/models/weights); else echo NOT-SEEN; fi; ls /cache/models\"]\n  fail:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"echo failed > /cache/models/weights\", \"false\"]\n  fill:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    container: {pass_env: [WHO]}\n    run: [\"dd if=/dev/zero of=/cache/models/$WHO-big bs=1k count=60\"]\n";

struct Scoped {
    store: Store,
    p: BusyboxProject,
    events: tempfile::TempDir,
}

fn scoped(extra: &str) -> Scoped {
    scoped_as(extra, true)
}

/// [`scoped`], with the base's cache written first when `warm`.
fn scoped_as(extra: &str, warm: bool) -> Scoped {
    let store = Store::new();
    // `grants` is a top-level key: the caches block ends before it.
    let policy = scoped_policy(&store, &format!("{extra}grants: {{pass_env: [WHO]}}\n"));
    let p = busybox_project(SCOPE_BATCHES, CACHES).with_policy(&policy);
    let events = tempfile::tempdir().unwrap();
    let s = Scoped { store, p, events };
    // The base has written the cache: a pull request gets a scope only of such a one.
    if warm {
        s.run("warm", None, "base").ok();
    }
    s
}

impl Scoped {
    /// `batch run BATCH` as a `pull_request_target` run of pull request `number`
    /// (`None`: a push to the base branch), with `WHO=who`.
    fn run(&self, batch: &str, number: Option<u64>, who: &str) -> Run {
        let mut c = self.p.batch_cmd(&["batch", "run", batch]);
        c.env("GITHUB_REPOSITORY", "THUDM/slime").env("WHO", who);
        match number {
            Some(n) => {
                let n = n.to_string();
                let file = event_file(self.events.path(), &n, &n, "THUDM/slime");
                c.env("GITHUB_EVENT_NAME", "pull_request_target")
                    .env("GITHUB_EVENT_PATH", file)
                    .env("GITHUB_REF", "refs/heads/main");
            }
            None => {
                c.env("GITHUB_EVENT_NAME", "push");
            }
        }
        run(&mut c)
    }

    /// What `look` saw as `number`'s run: the `SEEN:` line's value, or `NOT-SEEN`.
    fn seen(&self, number: Option<u64>) -> String {
        let r = self.run("look", number, "nobody");
        r.ok();
        r.stdout
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("SEEN:") || *l == "NOT-SEEN")
            .unwrap_or_default()
            .to_string()
    }
}

#[test]
fn a_pull_requests_writes_are_read_by_its_own_next_run_only() {
    let s = scoped("");
    // The base branch's scheduled run warms the base generation.
    s.run("plant", None, "base").ok();
    assert_eq!(s.p.result("plant")["caches"][0]["writes"], "through");
    // Pull request 7 reads it (warm), and its passing run keeps its own writes.
    assert_eq!(s.seen(Some(7)), "SEEN: base");
    let r = s.run("plant", Some(7), "seven");
    r.ok();
    assert!(
        r.stderr.contains("kept for pull request 7 only"),
        "{}",
        r.stderr
    );
    let rec = s.p.result("plant");
    let c = &rec["caches"][0];
    assert_eq!(c["writes"], "pull-request", "{rec}");
    assert_eq!(c["pull_request"], 7, "{rec}");
    assert!(c["kept"].is_string(), "{rec}");
    // 7's next run reads its own writes over the base's; 8's and a push's do not.
    assert_eq!(s.seen(Some(7)), "SEEN: seven");
    let r = s.run("look", Some(7), "x");
    assert!(
        r.stdout.contains("base") && r.stdout.contains("seven"),
        "{}",
        r.stdout
    );
    assert_eq!(s.seen(Some(8)), "SEEN: base");
    assert_eq!(s.seen(None), "SEEN: base");
    let r = s.run("look", None, "x");
    assert!(!r.stdout.contains("seven"), "{}", r.stdout);
    // The base's generation on disk holds nothing of 7's.
    let base = s.store.root.join("bt/models");
    let current = std::fs::read_to_string(base.join("current")).unwrap();
    let gen_dir = base.join("gens").join(current.trim());
    assert_eq!(
        std::fs::read_to_string(gen_dir.join("weights")).unwrap(),
        "base\n"
    );
    assert!(!gen_dir.join("seven").exists());
    // A later base run moves the base on; 7 still reads its own over the new base.
    s.run("plant", None, "base2").ok();
    assert_eq!(s.seen(Some(7)), "SEEN: seven");
    let r = s.run("look", Some(7), "x");
    assert!(r.stdout.contains("base2"), "{}", r.stdout);
    // A failing run of 7 keeps nothing.
    let r = s.run("fail", Some(7), "x");
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(s.p.result("fail")["caches"][0]["kept"].is_null());
    assert_eq!(s.seen(Some(7)), "SEEN: seven");
    // `cache inspect` shows the scope and how warm 7's next run is.
    let r = run(&mut s
        .p
        .batch_cmd_bare(&["cache", "inspect", "models", "--json"]));
    r.ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["scopes"][0]["pull_request"], 7, "{v}");
    assert!(v["scopes"][0]["files"].as_u64().unwrap() >= 2, "{v}");
    let r = run(&mut s
        .p
        .batch_cmd_bare(&["cache", "inspect", "models", "--pull-request", "7"]));
    r.ok();
    assert!(
        r.stdout.contains("pull request 7's next run reads"),
        "{}",
        r.stdout
    );
    let r = run(&mut s
        .p
        .batch_cmd_bare(&["cache", "inspect", "models", "--pull-request", "9"]));
    r.ok();
    assert!(
        r.stdout.contains("pull request 9 has no scope"),
        "{}",
        r.stdout
    );
}

#[test]
fn a_cache_the_base_never_made_keeps_no_pull_requests_writes() {
    // A pull request's manifest may name caches of its own: each scope has a cap of
    // its own, so new names would multiply what it keeps (issue 38, attack finding 5).
    let s = scoped_as("", false);
    let r = s.run("plant", Some(7), "seven");
    r.ok();
    let rec = s.p.result("plant");
    assert_eq!(rec["caches"][0]["writes"], "private", "{rec}");
    assert_eq!(s.seen(Some(7)), "NOT-SEEN");
    assert!(!s.store.root.join("bt/models/pulls/7").exists());
    // Once a base run has the cache, the pull request's writes are its scope's.
    s.run("plant", None, "base").ok();
    s.run("plant", Some(7), "seven").ok();
    assert_eq!(s.p.result("plant")["caches"][0]["writes"], "pull-request");
    assert_eq!(s.seen(Some(7)), "SEEN: seven");
}

#[test]
fn a_scope_over_its_cap_evicts_and_an_unused_one_expires() {
    let s = scoped("  pull_request_size: 100k\n  pull_request_expiry: 1h\n");
    s.run("fill", Some(7), "one").ok();
    s.run("fill", Some(7), "two").ok();
    let rec = s.p.result("fill");
    let evicted = rec["caches"][0]["evicted"].as_array().unwrap();
    assert_eq!(evicted, &[serde_json::json!("one-big")], "{rec}");
    let r = s.run("look", Some(7), "x");
    assert!(
        r.stdout.contains("two-big") && !r.stdout.contains("one-big"),
        "{}",
        r.stdout
    );
    // Another pull request's scope is not charged for 7's.
    s.run("fill", Some(8), "eight").ok();
    assert!(s.p.result("fill")["caches"][0]["evicted"].is_null());
    // A scope nobody used for the expiry goes at a prune; one in use stays.
    let lock = s.store.root.join("bt/models/pulls/7/cache.lock");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    std::fs::File::options()
        .write(true)
        .open(&lock)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let r = run(&mut s.p.batch_cmd_bare(&["cache", "prune", "models"]));
    r.ok();
    assert!(r.stdout.contains("1 pull request scope(s)"), "{}", r.stdout);
    assert!(!s.store.root.join("bt/models/pulls/7").exists());
    assert!(s.store.root.join("bt/models/pulls/8").exists());
    let r = s.run("look", Some(7), "x");
    assert!(!r.stdout.contains("two-big"), "{}", r.stdout);
}

#[test]
fn an_event_that_does_not_hold_together_is_believed_for_nothing() {
    let s = scoped("");
    let d = s.events.path();
    let cases: Vec<(&str, Vec<(&str, std::ffi::OsString)>)> = vec![
        (
            "No such file",
            vec![("GITHUB_EVENT_PATH", d.join("none.json").into())],
        ),
        (
            "the event file's number (7) is not its pull request's (8)",
            vec![(
                "GITHUB_EVENT_PATH",
                event_file(d, "8", "7", "THUDM/slime").into(),
            )],
        ),
        (
            "GITHUB_REF (refs/pull/8/merge) names another pull request",
            vec![
                (
                    "GITHUB_EVENT_PATH",
                    event_file(d, "7", "7", "THUDM/slime").into(),
                ),
                ("GITHUB_REF", "refs/pull/8/merge".into()),
            ],
        ),
        (
            "is not this run's repository (THUDM/slime)",
            vec![(
                "GITHUB_EVENT_PATH",
                event_file(d, "7", "7", "mallory/slime").into(),
            )],
        ),
        (
            "pull_request.number is not a pull request's number",
            vec![(
                "GITHUB_EVENT_PATH",
                event_file(d, "\"7/../../..\"", "\"7/../../..\"", "THUDM/slime").into(),
            )],
        ),
    ];
    // A link to a good file, and a file others may write.
    let good = event_file(d, "7", "7", "THUDM/slime");
    let link = d.join("link.json");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    let open = d.join("open.json");
    std::fs::copy(&good, &open).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
    let cases = cases.into_iter().chain([
        ("symbolic links", vec![("GITHUB_EVENT_PATH", link.into())]),
        (
            "has mode 666: others may write it",
            vec![("GITHUB_EVENT_PATH", open.into())],
        ),
    ]);
    // Each case: why the run is not believed to be pull request 7's.
    for (what, env) in cases {
        let mut c = s.p.batch_cmd(&["batch", "run", "plant"]);
        c.env("GITHUB_REPOSITORY", "THUDM/slime")
            .env("WHO", "forged")
            .env("GITHUB_EVENT_NAME", "pull_request_target");
        for (k, v) in env {
            c.env(k, v);
        }
        let r = run(&mut c);
        r.ok();
        assert!(
            r.stderr.contains("not believed to be one pull request's") && r.stderr.contains(what),
            "{what}: {}",
            r.stderr
        );
        let rec = s.p.result("plant");
        assert_eq!(rec["caches"][0]["writes"], "private", "{what}: {rec}");
    }
    // None of them made a scope, and nothing any of them wrote is read: not by 7, 8
    // or the base.
    assert!(!s.store.root.join("bt/models/pulls").exists());
    for n in [Some(7), Some(8), None] {
        assert_eq!(s.seen(n), "NOT-SEEN", "{n:?}");
    }
}

/// The commit tested must be the pull request's: its head (the approved-commit
/// pattern checks out `head.sha`) or its merge commit; a checkout of anything else
/// keeps nothing, in no scope.
#[test]
fn a_checkout_that_is_not_the_pull_requests_head_keeps_nothing() {
    let s = scoped("");
    make_checkout(s.p.project.path());
    let sha = git(s.p.project.path(), &["rev-parse", "HEAD"])
        .trim()
        .to_string();
    let as_seven = |batch: &str, head: &str| {
        let file = s.events.path().join(format!("event-{head}.json"));
        std::fs::write(
            &file,
            format!(
                r#"{{"number":7,"pull_request":{{"number":7,"head":{{"sha":"{head}"}},"base":{{"repo":{{"full_name":"THUDM/slime"}}}}}},"repository":{{"full_name":"THUDM/slime"}}}}"#
            ),
        )
        .unwrap();
        let mut c = s.p.batch_cmd(&["batch", "run", batch]);
        c.env("GITHUB_REPOSITORY", "THUDM/slime")
            .env("WHO", "seven")
            .env("GITHUB_EVENT_NAME", "pull_request_target")
            .env("GITHUB_EVENT_PATH", &file);
        run(&mut c)
    };
    let r = as_seven("plant", HEAD);
    r.ok();
    assert!(
        r.stderr.contains(&format!(
            "the commit tested ({sha}) is neither the pull request's head"
        )),
        "{}",
        r.stderr
    );
    assert_eq!(s.p.result("plant")["caches"][0]["writes"], "private");
    let r = as_seven("look", &sha);
    assert!(r.stdout.contains("NOT-SEEN"), "{}", r.stdout);
    // The head itself: kept for 7, and read by 7's next run.
    as_seven("plant", &sha).ok();
    assert_eq!(s.p.result("plant")["caches"][0]["writes"], "pull-request");
    let r = as_seven("look", &sha);
    assert!(r.stdout.contains("SEEN: seven"), "{}", r.stdout);
    // Read by a run of another commit as 7's: no (it writes and reads privately).
    let r = as_seven("look", HEAD);
    assert!(r.stdout.contains("NOT-SEEN"), "{}", r.stdout);
}

/// Issue 38, attack: a `pull_request_review` (or `_comment`) run runs the workflow of
/// the pull request's merge commit, so its steps are the pull request's and can write
/// the event file it is handed. Pull request 9's review run wrote an event claiming 40
/// (with `GITHUB_REF` to match) and kept its writes in 40's scope. And with a git
/// checkout, an event naming no head was believed without the commit check.
#[test]
fn a_review_run_and_an_event_naming_no_head_reach_no_scope() {
    let s = scoped("");
    make_checkout(s.p.project.path());
    let sha = git(s.p.project.path(), &["rev-parse", "HEAD"])
        .trim()
        .to_string();
    let event = |name: &str, text: String, git_ref: &str| {
        let file = s.events.path().join(format!("{name}.json"));
        std::fs::write(&file, text).unwrap();
        let mut c = s.p.batch_cmd(&["batch", "run", "plant"]);
        c.env("GITHUB_REPOSITORY", "THUDM/slime")
            .env("WHO", "planted")
            .env("GITHUB_EVENT_NAME", name)
            .env("GITHUB_EVENT_PATH", &file)
            .env("GITHUB_REF", git_ref);
        let r = run(&mut c);
        r.ok();
        assert_eq!(
            s.p.result("plant")["caches"][0]["writes"],
            "private",
            "{name}: {}",
            r.stderr
        );
        r
    };
    let claims_40 = format!(
        r#"{{"action":"submitted","pull_request":{{"number":40,"head":{{"sha":"{sha}"}},"base":{{"repo":{{"full_name":"THUDM/slime"}}}}}},"repository":{{"full_name":"THUDM/slime"}}}}"#
    );
    for name in ["pull_request_review", "pull_request_review_comment"] {
        let r = event(name, claims_40.clone(), "refs/pull/40/merge");
        assert!(
            r.stderr.contains(&format!(
                "a {name} run's workflow is the pull request's own"
            )),
            "{}",
            r.stderr
        );
    }
    let no_head = r#"{"number":41,"pull_request":{"number":41,"base":{"repo":{"full_name":"THUDM/slime"}}},"repository":{"full_name":"THUDM/slime"}}"#;
    let r = event(
        "pull_request_target",
        no_head.to_string(),
        "refs/heads/main",
    );
    assert!(
        r.stderr.contains(&format!(
            "the commit tested ({sha}) is neither the pull request's head (none)"
        )),
        "{}",
        r.stderr
    );
    // No scope was made, and neither 40's run nor 41's reads what they wrote.
    assert!(!s.store.root.join("bt/models/pulls").exists());
    for n in [40, 41] {
        let file = s.events.path().join(format!("{n}.json"));
        std::fs::write(
            &file,
            format!(
                r#"{{"number":{n},"pull_request":{{"number":{n},"head":{{"sha":"{sha}"}},"base":{{"repo":{{"full_name":"THUDM/slime"}}}}}},"repository":{{"full_name":"THUDM/slime"}}}}"#
            ),
        )
        .unwrap();
        let r = run(s
            .p
            .batch_cmd(&["batch", "run", "look"])
            .env("GITHUB_REPOSITORY", "THUDM/slime")
            .env("GITHUB_EVENT_NAME", "pull_request_target")
            .env("GITHUB_EVENT_PATH", &file));
        r.ok();
        assert!(r.stdout.contains("NOT-SEEN"), "{n}: {}", r.stdout);
    }
}

/// Issue 38, attack: a pull request's run decides what its layer holds, and a
/// promotion copies a file it cannot link (one with as many names as ext4 allows). A
/// file of 2 GiB that took no room (`truncate`) was copied byte for byte into the
/// pull request's scope: 2 GiB of zeros written to the store's disk before the cap was
/// looked at (of a petabyte, the disk filled). The copy keeps the file's holes.
#[test]
fn a_pull_requests_sparse_file_takes_no_more_room_kept_than_written() {
    // On disk (ext4 here): /tmp may be a tmpfs, which has no limit on links.
    let store = Store::new_in(std::path::Path::new("/var/tmp"));
    let batch = "  sparse:\n    gpus: 0\n    timeout: 2m\n    verdict: exit-code\n    run: [\"set -e; cd /cache/models; mkdir -p links/a; truncate -s 2G links/a/f; cd links; for i in $(seq 254); do ln a/f a/f$i; done; for i in $(seq 255); do cp -al a d$i 2>/dev/null || true; done; stat -c 'LINKS %h' a/f\"]\n  warm:\n    gpus: 0\n    timeout: 1m\n    verdict: exit-code\n    run: [\"echo base > /cache/models/base\"]\n";
    let p = busybox_project(batch, CACHES).with_policy(&scoped_policy(&store, ""));
    // The base has the cache (a pull request gets a scope only of such a one).
    run(p
        .batch_cmd(&["batch", "run", "warm"])
        .env("GITHUB_REPOSITORY", "THUDM/slime")
        .env("GITHUB_EVENT_NAME", "push"))
    .ok();
    let events = tempfile::tempdir().unwrap();
    let file = event_file(events.path(), "7", "7", "THUDM/slime");
    let r = run(p
        .batch_cmd(&["batch", "run", "sparse"])
        .env("GITHUB_REPOSITORY", "THUDM/slime")
        .env("GITHUB_EVENT_NAME", "pull_request_target")
        .env("GITHUB_EVENT_PATH", &file)
        .env("GITHUB_REF", "refs/heads/main"));
    r.ok();
    assert!(
        r.stdout.contains("LINKS 65000"),
        "the store's file system should stop a file at 65,000 links, as ext4 does: {}",
        r.stdout
    );
    let rec = p.result("sparse");
    let c = &rec["caches"][0];
    assert_eq!(c["writes"], "pull-request", "{rec}");
    let kept = c["kept"].as_str().expect("kept").to_string();
    assert!(c["problem"].is_null(), "{rec}");
    // What the scope's new generation takes on disk: about what the run wrote.
    let generation = store.root.join("bt/models/pulls/7/gens").join(&kept);
    let mut bytes = 0;
    let mut stack = vec![generation];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let md = e.as_ref().unwrap().metadata().unwrap();
            if md.is_dir() {
                stack.push(e.unwrap().path());
            }
            use std::os::unix::fs::MetadataExt;
            bytes += md.blocks() * 512;
        }
    }
    assert!(
        bytes < 64 << 20,
        "the scope takes {bytes} bytes for a run that wrote {}",
        c["wrote_bytes"]
    );
}
