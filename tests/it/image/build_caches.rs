//! Issue 43: build caches with the trust model of run-time caches. A build's cache
//! mounts (`RUN --mount=type=cache`) live in a namespace of its project and scope
//! (BuildKit's `BUILDKIT_CACHE_MOUNT_NS`, set by cibox), so a pull request's build
//! never writes what another project's, or a trusted, build reads, and the namespace
//! changes no image ID; what a build's steps get (the network, secrets) is the host
//! policy's `builds:` to grant, by the build's trust.

use crate::common::*;

/// A policy that trusts this host's cache writes and keeps pull requests' apart, for
/// projects `bkc` and `bko` of their repositories; `extra` goes at its end.
fn policy(extra: &str) -> HostPolicyFile {
    HostPolicyFile::new(&format!(
        "version: 1\ncaches:\n  root: /var/cache/cibox-build-tests\n  trusted: true\n  projects: {{bkc: owner/bkc, bko: owner/bko}}\n  pull_requests: keep\n{extra}"
    ))
}

/// A project `name` whose Dockerfile is busybox then `steps` (`NONCE` replaced by
/// `nonce`), with its lock files.
fn project(name: &str, nonce: &str, steps: &str) -> Project {
    require_engine();
    let p = Project::new(&format!(
        "version: 1\nproject: {name}\nimage:\n  locks: [\"image/Dockerfile\", \"image/nonce\"]\n  dockerfile: image/Dockerfile\nbatches:\n  b: {{gpus: 0, timeout: 1m, run: [\"true\"]}}\n"
    ));
    set_steps(&p, nonce, steps);
    p.write("image/nonce", nonce);
    busybox_rootfs(&p.path().join("image/rootfs"));
    p
}

fn set_steps(p: &Project, nonce: &str, steps: &str) {
    p.write(
        "image/Dockerfile",
        format!(
            "FROM scratch\nLABEL org.cibox.test.nonce=NONCE\nCOPY rootfs/ /\nENV PATH=/bin\n{steps}"
        )
        .replace("NONCE", nonce),
    );
}

/// Who builds: a push to the base branch, or pull request N's `pull_request_target`.
#[derive(Clone, Copy)]
enum As {
    Push,
    PullRequest(u64),
}

/// `cibox -v image build ARGS` of `p` (of repository `owner/<project>`) under `policy`,
/// as `who`, with `CIBOX_TEST_TOKEN` set for `--secret`.
fn build_as(p: &Project, policy: &HostPolicyFile, who: As, args: &[&str]) -> Run {
    let events = tempfile::tempdir().unwrap();
    let manifest = std::fs::read_to_string(p.path().join("cibox.yaml")).unwrap();
    let name = manifest
        .lines()
        .find_map(|l| l.strip_prefix("project: "))
        .unwrap()
        .to_string();
    let repo = format!("owner/{name}");
    let mut c = cibox(p.path());
    c.args(["-v", "image", "build"])
        .args(args)
        .env("CIBOX_HOST_POLICY", policy.path())
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_REPOSITORY", &repo)
        .env("CIBOX_TEST_TOKEN", "a-test-token-value");
    match who {
        As::Push => {
            c.env("GITHUB_EVENT_NAME", "push");
        }
        As::PullRequest(n) => {
            let file = events.path().join("event.json");
            std::fs::write(
                &file,
                format!(
                    r#"{{"action":"labeled","number":{n},"pull_request":{{"number":{n},"head":{{"sha":"0123456789abcdef0123456789abcdef01234567"}},"base":{{"repo":{{"full_name":"{repo}"}}}}}},"repository":{{"full_name":"{repo}"}}}}"#
                ),
            )
            .unwrap();
            c.env("GITHUB_EVENT_NAME", "pull_request_target")
                .env("GITHUB_EVENT_PATH", &file)
                .env("GITHUB_REF", "refs/heads/main");
        }
    }
    let _store = image_store_lock(false);
    run(&mut c)
}

/// What the build's `RUN` printed between `KEY=` and `=END`, once; `None` when no step
/// printed it (the step was taken from the cache).
fn printed(r: &Run, key: &str) -> Option<String> {
    let start = format!("{key}=");
    let found: Vec<&str> = r
        .stderr
        .split(&start)
        .skip(1)
        .filter_map(|rest| rest.split_once("=END").map(|(v, _)| v))
        // The step's name echoes its command (`echo KEY=$(…)=END`): not its output.
        .filter(|v| !v.contains('$'))
        .collect();
    assert!(found.len() <= 1, "{key} printed twice:\n{}", r.stderr);
    found.first().map(|v| v.to_string())
}

/// The ID a build printed (removed when the guard goes).
fn built(r: &Run) -> ImageGuard {
    r.ok();
    let id = r.stdout.trim().to_string();
    assert!(id.starts_with("sha256:") && id.len() == 71, "{id}");
    ImageGuard(id)
}

/// A step that lists the cache mount (`SEEN=`), then writes a file of its own name into
/// it (`WROTE=`).
const WRITER: &str = "RUN --mount=type=cache,id=NONCE,target=/c sh -c 'echo SEEN=$(ls /c | tr \"\\n\" ,)=END; n=w$RANDOM$RANDOM; touch /c/$n; echo WROTE=$n=END'";

#[test]
fn a_pull_requests_cache_writes_reach_neither_a_trusted_build_nor_another_projects() {
    let nonce = nonce();
    let policy = policy("");
    let writer = format!("{WRITER}\n");
    // Another step on the same cache mount, which no build has run yet.
    let reader = format!("{WRITER}; : again\n");
    let p = project("bkc", &nonce, &writer);
    // Pull request 7 builds, and writes into its cache mount.
    let pr = build_as(&p, &policy, As::PullRequest(7), &[]);
    let pr_image = built(&pr);
    assert!(
        pr.stderr
            .contains("build cache mounts: pull request 7's own namespace"),
        "{}",
        pr.stderr
    );
    let pr_wrote = printed(&pr, "WROTE").expect("the pull request's step ran");
    // The base branch's build of the step that reads: nothing the pull request wrote.
    set_steps(&p, &nonce, &reader);
    let base = build_as(&p, &policy, As::Push, &[]);
    let _base = built(&base);
    assert!(
        base.stderr
            .contains("build cache mounts: project bkc's shared namespace"),
        "{}",
        base.stderr
    );
    let seen = printed(&base, "SEEN").unwrap();
    assert!(
        !seen.contains(&pr_wrote),
        "the base's build read what pull request 7 wrote: {seen}"
    );
    let base_wrote = printed(&base, "WROTE").unwrap();
    // Another project's, with the same cache ID: neither's files.
    let other = project("bko", &nonce, &reader);
    let o = build_as(&other, &policy, As::Push, &[]);
    let _other = built(&o);
    let seen = printed(&o, "SEEN").unwrap();
    assert!(
        !seen.contains(&pr_wrote) && !seen.contains(&base_wrote),
        "another project's build read bkc's cache: {seen}"
    );
    // The base's build of the pull request's Dockerfile: its step runs in the base's
    // namespace (the pull request's is not taken from the build cache), and the image
    // is the same: the namespace is in neither the history nor the config.
    set_steps(&p, &nonce, &writer);
    let same = build_as(&p, &policy, As::Push, &[]);
    let same_image = built(&same);
    let seen = printed(&same, "SEEN").expect("the base's build ran its own step");
    assert!(
        seen.contains(&base_wrote) && !seen.contains(&pr_wrote),
        "{seen}"
    );
    assert_eq!(same_image.0, pr_image.0, "{}", same.stderr);
    // The pull request's next build reads what it wrote (it was kept); another pull
    // request's reads nothing.
    set_steps(&p, &nonce, &reader);
    let again = build_as(&p, &policy, As::PullRequest(7), &[]);
    let _again = built(&again);
    let seen = printed(&again, "SEEN").unwrap();
    assert!(
        seen.contains(&pr_wrote) && !seen.contains(&base_wrote),
        "{seen}"
    );
    let pr8 = build_as(&p, &policy, As::PullRequest(8), &[]);
    let _pr8 = built(&pr8);
    assert_eq!(printed(&pr8, "SEEN").unwrap(), "");
}

#[test]
fn a_build_gets_the_network_and_secrets_the_policy_grants_its_trust() {
    let nonce = nonce();
    let policy = policy("builds:\n  trusted: {secrets: [tok]}\n  untrusted: {network: none}\n");
    let ifaces = "RUN echo IFACES=$(ls /sys/class/net | tr \"\\n\" ,)=END; : NONCE";
    let p = project("bkc", &nonce, &format!("{ifaces}; : pr\n"));
    // A pull request's build: no network but the loopback.
    let pr = build_as(&p, &policy, As::PullRequest(7), &[]);
    let _pr = built(&pr);
    assert_eq!(
        printed(&pr, "IFACES").as_deref(),
        Some("lo,"),
        "{}",
        pr.stderr
    );
    assert!(
        pr.stderr.contains("RUN steps' network: none"),
        "{}",
        pr.stderr
    );
    // The base branch's: the engine's default network.
    set_steps(&p, &nonce, &format!("{ifaces}; : push\n"));
    let push = build_as(&p, &policy, As::Push, &[]);
    let _push = built(&push);
    let seen = printed(&push, "IFACES").unwrap();
    assert!(seen.contains("eth0"), "{seen}");
    // Secrets: the trusted build may be given `tok` only; the pull request's none.
    let secret = ["--secret", "id=tok,env=CIBOX_TEST_TOKEN"];
    let r = build_as(&p, &policy, As::PullRequest(7), &secret);
    r.fails_with(
        2,
        "--secret id=tok: not granted to this build: it is pull request 7's build, and the host policy",
    );
    assert!(
        r.stderr.contains("builds.untrusted.secrets"),
        "{}",
        r.stderr
    );
    let r = build_as(
        &p,
        &policy,
        As::Push,
        &["--secret", "id=other,env=CIBOX_TEST_TOKEN"],
    );
    r.fails_with(
        2,
        "--secret id=other: not granted to this build: it is a trusted build, and the host policy",
    );
}

#[test]
fn the_cache_namespace_is_cibox_s_own() {
    let nonce = nonce();
    let p = project(
        "bkc",
        &nonce,
        "ARG BUILDKIT_CACHE_MOUNT_NS\nRUN echo $BUILDKIT_CACHE_MOUNT_NS\n",
    );
    let policy = policy("");
    build_as(&p, &policy, As::PullRequest(7), &[]).fails_with(
        2,
        "image/Dockerfile:5: ARG BUILDKIT_CACHE_MOUNT_NS: BUILDKIT_* arguments are options of the builder's frontend",
    );
    // Nor may the build arguments file set BuildKit's own settings.
    let manifest = std::fs::read_to_string(p.path().join("cibox.yaml")).unwrap();
    p.write(
        "cibox.yaml",
        manifest
            .replace("\"image/nonce\"]", "\"image/nonce\", \"image/args.env\"]")
            .replace(
                "  dockerfile:",
                "  build_args: image/args.env\n  dockerfile:",
            ),
    );
    p.write("image/args.env", "BUILDKIT_SYNTAX=docker/dockerfile:1.4\n");
    set_steps(&p, &nonce, "ARG X\n");
    build_as(&p, &policy, As::Push, &[]).fails_with(
        2,
        "build_args image/args.env: line 1: `BUILDKIT_SYNTAX`: BUILDKIT_* arguments are options of the builder's frontend",
    );
}

/// Issue 43, third look: a trusted build's step that wrote its secret into a stage the
/// image does not keep (accepted: the image is clean) stays in the engine's cache,
/// which does not key it on the secret's value; a pull request's build of the same
/// step, given no secret, took it from there and copied the secret into its image. An
/// untrusted build whose steps mount a secret now builds without the cache.
#[test]
fn an_untrusted_build_never_takes_a_secret_step_from_the_cache() {
    let nonce = nonce();
    let policy = policy("builds:\n  trusted: {secrets: [tok]}\n");
    let stage = "FROM scratch AS b\nCOPY rootfs/ /\nENV PATH=/bin\nRUN --mount=type=secret,id=tok cp /run/secrets/tok /leak || echo none > /leak; : NONCE\nRUN wc -c /leak > /h\n";
    let p = project("bkc", &nonce, "");
    p.write(
        "image/Dockerfile",
        format!("{stage}FROM scratch\nLABEL org.cibox.test.nonce=NONCE\nCOPY rootfs/ /\nCOPY --from=b /h /h\n").replace("NONCE", &nonce),
    );
    let trusted = build_as(
        &p,
        &policy,
        As::Push,
        &["--secret", "id=tok,env=CIBOX_TEST_TOKEN"],
    );
    let _trusted = built(&trusted);
    // The pull request's Dockerfile copies the stage's file into its image.
    p.write(
        "image/Dockerfile",
        format!("{stage}FROM scratch\nLABEL org.cibox.test.nonce=NONCE\nCOPY rootfs/ /\nCOPY --from=b /leak /x\n").replace("NONCE", &nonce),
    );
    let pr = build_as(&p, &policy, As::PullRequest(7), &[]);
    assert!(
        pr.stderr.contains("builds without the engine's cache"),
        "{}",
        pr.stderr
    );
    let img = built(&pr);
    let out = std::process::Command::new("docker")
        .args(["run", "--rm", "--network", "none", &img.0, "cat", "/x"])
        .output()
        .unwrap();
    let x = String::from_utf8_lossy(&out.stdout);
    assert!(
        !x.contains("a-test-token-value"),
        "the pull request's image holds the trusted build's secret: {x}"
    );
}
