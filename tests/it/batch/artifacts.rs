//! Artifacts between layers (issue 46, item 5): a batch's `outputs` taken out of its
//! finished container with their digests, mounted read-only in a later layer's batch
//! that `needs` them, checked first; what is not a regular file, or too big, or
//! changed, or a pull request's, refused with one line and nothing left behind.

use super::*;

const BUILD: &str =
    "mkdir -p dist && printf wheel-bytes > dist/pkg-1.0.whl && printf no > dist/notes.txt";
const USE: &str = "test \"$(cat /artifacts/wheel/pkg-1.0.whl)\" = wheel-bytes && ! test -e /artifacts/wheel/notes.txt && ! touch /artifacts/wheel/x 2>/dev/null && ! sh -c 'printf x >> /artifacts/wheel/pkg-1.0.whl' 2>/dev/null";

fn wheel_project() -> BusyboxProject {
    busybox_project(
        &format!(
            "{}{}",
            batch(
                "wheel",
                0,
                "1m",
                &[BUILD, JUNIT_OK],
                "    outputs: [\"dist/*.whl\"]\n"
            ),
            batch("test", 0, "1m", &[USE, JUNIT_OK], "    needs: [wheel]\n"),
        ),
        "layers:\n  build: {batches: [wheel]}\n  tests: {batches: [test]}\n",
    )
}

fn store(p: &BusyboxProject) -> std::path::PathBuf {
    p.reports().join("_artifacts")
}

#[test]
fn a_wheel_built_in_one_layer_reaches_the_next_read_only_and_checked_by_digest() {
    let p = wheel_project();
    // Nothing built yet: refused before anything runs.
    let r = p.run(&["layer", "run", "tests"]);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("the artifact of batch wheel, which batch test needs, is not in"),
        "{}",
        r.stderr
    );
    assert!(!p.reports().join("test").exists());
    let r = p.run(&["layer", "run", "build"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let listing: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(store(&p).join("wheel/listing.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(listing["files"][0]["path"], "pkg-1.0.whl", "{listing}");
    assert_eq!(listing["key"]["trust"], "trusted", "{listing}");
    assert!(!store(&p).join("wheel/files/notes.txt").exists());
    // A changed file is refused before the consumer's layer starts, nothing made.
    let wheel = store(&p).join("wheel/files/pkg-1.0.whl");
    std::fs::write(&wheel, "wheel-bytEs").unwrap();
    let r = p.run(&["layer", "run", "tests"]);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("artifact of batch wheel: `pkg-1.0.whl` has digest sha256:")
            && r.stderr.contains("refused (it changed after it was made)"),
        "{}",
        r.stderr
    );
    assert!(!p.reports().join("test").exists());
    // Made again; the digest the producer's job hands on checks the listing.
    assert_eq!(p.run(&["layer", "run", "build"]).code, 0);
    let digest = p.batch_cmd_bare(&["artifact", "digest", "wheel", "--reports"]);
    let mut digest = digest;
    digest.arg(p.reports());
    let d = run(&mut digest);
    assert_eq!(d.code, 0, "{}", d.stderr);
    let d = d.stdout.trim().to_string();
    assert!(d.starts_with("sha256:") && d.len() == 71, "{d}");
    let reports = p.reports().display().to_string();
    let ok = run(&mut p.batch_cmd_bare(&[
        "artifact",
        "verify",
        &format!("wheel={d}"),
        "--reports",
        &reports,
    ]));
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let other = format!("sha256:{}", "0".repeat(64));
    let bad = run(&mut p.batch_cmd_bare(&[
        "artifact",
        "verify",
        &format!("wheel={other}"),
        "--reports",
        &reports,
    ]));
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr
            .contains(&format!("its listing's digest is {d}, not {other}")),
        "{}",
        bad.stderr
    );
    // Read-only, the wheel alone, what was built.
    let r = p.run(&["layer", "run", "tests"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(p.result("test")["status"], "passed");
}

#[test]
fn a_pull_requests_artifact_never_reaches_a_trusted_run() {
    let p = wheel_project();
    let ci = |event: &str, args: &[&str]| {
        let mut c = p.batch_cmd(args);
        c.env("GITHUB_ACTIONS", "true")
            .env("GITHUB_RUN_ID", "4646")
            .env("GITHUB_REPOSITORY", "o/r")
            .env("GITHUB_EVENT_NAME", event);
        run(&mut c)
    };
    let r = ci("pull_request", &["layer", "run", "build"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = ci("push", &["layer", "run", "tests"]);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains(
            "artifact of batch wheel: made by run github:o/r:4646 (untrusted), and this is run github:o/r:4646 (trusted): refused"
        ),
        "{}",
        r.stderr
    );
    assert!(!p.reports().join("test").exists());
    // Another CI run's is refused too; the pull request's own run gets it.
    let r = ci("pull_request", &["layer", "run", "tests"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

#[test]
fn an_output_that_is_a_link_a_fifo_or_too_big_fails_its_batch_and_leaves_nothing() {
    let out = "    outputs: [\"dist/*.whl\"]\n";
    let p = busybox_project(
        &format!(
            "{}{}{}{}",
            batch(
                "link",
                0,
                "1m",
                &["mkdir -p dist && ln -s /etc/passwd dist/x.whl", JUNIT_OK],
                out
            ),
            batch(
                "fifo",
                0,
                "1m",
                &["mkdir -p dist && mkfifo dist/x.whl", JUNIT_OK],
                out
            ),
            batch(
                "big",
                0,
                "1m",
                &[
                    "mkdir -p dist && dd if=/dev/zero of=dist/x.whl bs=1024 count=4",
                    JUNIT_OK
                ],
                out
            ),
            batch("none", 0, "1m", &["mkdir -p dist", JUNIT_OK], out),
        ),
        "",
    )
    .with_policy("version: 1\nartifacts: {max_size: 1k}\n");
    let r = p.run(&["batch", "run", "link", "fifo", "big", "none"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    for (batch, said) in [
        (
            "link",
            "output `dist/*.whl`: `x.whl` is a symlink, not a regular file: refused",
        ),
        (
            "fifo",
            "output `dist/*.whl`: `x.whl` is a FIFO, not a regular file: refused",
        ),
        (
            "big",
            "output `dist/*.whl`: `x.whl` (4096 bytes) takes the batch's outputs past 1024 bytes",
        ),
        ("none", "output `dist/*.whl`: matched nothing in /work/dist"),
    ] {
        let v = p.result(batch);
        assert_eq!(v["status"], "failed", "{batch}: {v}");
        assert!(
            v["message"].as_str().unwrap_or("").contains(said),
            "{batch}: {v}"
        );
        assert!(r.stderr.contains(said), "{batch}: {}", r.stderr);
    }
    let left: Vec<String> = std::fs::read_dir(store(&p))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}
