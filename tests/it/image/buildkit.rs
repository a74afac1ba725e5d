//! Images as projects build them (issue 35), through the engine's BuildKit: a
//! multi-stage Dockerfile with a cache mount, built for a target from a context above
//! its folder; secrets mounted and never kept; proxy arguments that change nothing;
//! bases never pulled by tag; push and fetch back by digest; every built ID keeps a
//! name; a context that stays inside the repository; the classic builder where asked.

use std::process::Command;

use crate::common::*;

/// The first stage of every recipe here: busybox, and a label unique to the test (so
/// the images a test leaves can be found by it).
pub(super) const BASE: &str =
    "FROM scratch AS base\nLABEL org.cibox.test.nonce=NONCE\nCOPY rootfs/ /\nENV PATH=/bin\n";

/// A project whose Dockerfile (`BASE` then `stages`, `NONCE` replaced) lives in
/// `docker/` and builds from the repository's root (`context: .`), with busybox in
/// `rootfs/`; `image_extra` goes under its image in the manifest. Returns it and its
/// nonce.
pub(super) fn project(stages: &str, image_extra: &str) -> (Project, String) {
    require_engine();
    let nonce = nonce();
    let p = Project::new(&format!(
        "version: 1\nproject: bk\nimages:\n  default:\n    locks: [\"docker/Dockerfile\", \"nonce\"]\n    dockerfile: docker/Dockerfile\n    context: .\n{image_extra}batches:\n  b: {{gpus: 0, timeout: 1m, run: [\"true\"]}}\n"
    ));
    p.write(
        "docker/Dockerfile",
        format!("{BASE}{stages}").replace("NONCE", &nonce),
    );
    p.write("nonce", &nonce);
    busybox_rootfs(&p.path().join("rootfs"));
    (p, nonce)
}

/// `cibox -v image build ARGS` with `envs`, under the image-store lock.
pub(super) fn build(p: &Project, args: &[&str], envs: &[(&str, &str)]) -> Run {
    let _store = image_store_lock(false);
    let mut c = cibox(p.path());
    c.args(["-v", "image", "build"]).args(args);
    for (k, v) in envs {
        c.env(k, v);
    }
    run(&mut c)
}

/// The ID a successful build printed, removed when the guard goes.
pub(super) fn built(r: &Run) -> ImageGuard {
    r.ok();
    let id = r.stdout.trim().to_string();
    assert!(id.starts_with("sha256:") && id.len() == 71, "{id}");
    ImageGuard(id)
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The names an image has.
fn names(id: &str) -> Vec<String> {
    serde_json::from_str(&docker(&["inspect", "--format", "{{json .RepoTags}}", id])).unwrap()
}

/// The images carrying this test's label.
pub(super) fn labelled(nonce: &str) -> Vec<String> {
    docker(&[
        "images",
        "-a",
        "-q",
        "--no-trunc",
        "--filter",
        &format!("label=org.cibox.test.nonce={nonce}"),
    ])
    .lines()
    .map(str::to_string)
    .collect::<std::collections::BTreeSet<_>>()
    .into_iter()
    .collect()
}

#[test]
fn a_multi_stage_recipe_with_a_cache_mount_builds_its_target_from_above_to_one_id() {
    // vLLM's shape: docker/Dockerfile, built from the repository's root for its `test`
    // stage, a `RUN --mount=type=cache` step, files from outside docker/, and a stage
    // the target does not need (it would fail).
    let (p, nonce) = project(
        "FROM base AS deps\nCOPY python/pyproject.toml /deps/\nRUN --mount=type=cache,id=NONCE,target=/cache \\\n    sh -c 'if [ -e /cache/seen ]; then echo CACHE-W\"\"ARM; else echo CACHE-C\"\"OLD; touch /cache/seen; fi; wc -c < /deps/pyproject.toml > /deps/size'\nFROM base AS test\nCOPY --from=deps /deps /deps\nCOPY nonce /nonce\nFROM base AS never\nRUN false\n",
        "    target: test\n",
    );
    p.write("python/pyproject.toml", "[project]\nname = \"x\"\n");
    let first = build(&p, &[], &[]);
    let img = built(&first);
    assert!(first.stderr.contains("CACHE-COLD"), "{}", first.stderr);
    assert!(
        first
            .stderr
            .contains("building: [deps 2/2] RUN --mount=type=cache"),
        "{}",
        first.stderr
    );
    assert!(!first.stderr.contains("RUN false"), "{}", first.stderr);
    // BuildKit leaves no image of a stage, and no raw build: the one image is all.
    assert_eq!(labelled(&nonce), std::slice::from_ref(&img.0));
    // Again: from the build cache, the same ID.
    let again = build(&p, &[], &[]);
    assert_eq!(again.stdout.trim(), img.0, "{}", again.stderr);
    assert!(again.stderr.contains("(cached)"), "{}", again.stderr);
    assert!(
        !again.stderr.contains("CACHE-COLD") && !again.stderr.contains("CACHE-WARM"),
        "{}",
        again.stderr
    );
    // Twice more without the build cache, where BuildKit gives each build an empty
    // cache mount (what it writes is kept for later builds): the same ID.
    let checked = build(&p, &["--check"], &[]);
    assert_eq!(checked.stdout.trim(), img.0, "{}", checked.stderr);
    assert_eq!(
        checked.stderr.matches("CACHE-COLD").count(),
        2,
        "{}",
        checked.stderr
    );
    assert!(
        checked
            .stderr
            .contains("built twice, reproducible, and verified"),
        "{}",
        checked.stderr
    );
    // What the target took from the stage above it, and from outside docker/.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "c=$(docker create {} /none) && docker export $c | tar -xO deps/size; docker rm $c >/dev/null",
            img.0
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "21");
    // A stage the Dockerfile does not have.
    let manifest = std::fs::read_to_string(p.path().join("cibox.yaml")).unwrap();
    p.write(
        "cibox.yaml",
        manifest.replace("target: test", "target: tset"),
    );
    build(&p, &[], &[]).fails_with(
        2,
        "target `tset`: the Dockerfile has no stage named `tset` (its stages: base, deps, test, never)",
    );
}

#[test]
fn a_build_context_carries_the_checkouts_git_config_without_its_token() {
    // actions/checkout's token header, and a token in a nested checkout's remote URL:
    // `COPY .git/config` (or `COPY . …`) must find them cleaned, as a batch does.
    let (p, _) = project(
        "FROM base\nCOPY .git/config /cfg\nCOPY deps/.git/config /deps-cfg\n",
        "",
    );
    let config = "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://github.com/o/r\n[http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic eC1hY2Nlc3MtdG9rZW46Z2hzX1NFQ1JFVDE=\n";
    p.write(".git/config", config);
    p.write(
        "deps/.git/config",
        "[remote \"origin\"]\n\turl = https://u:ghp_SECRET2@example.com/d\n",
    );
    let r = build(&p, &[], &[]);
    let img = built(&r);
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "c=$(docker create {} /none) && docker export $c | tar -xO cfg deps-cfg; docker rm $c >/dev/null",
            img.0
        ))
        .output()
        .unwrap();
    let copied = String::from_utf8_lossy(&out.stdout);
    assert!(copied.contains("https://github.com/o/r"), "{copied}");
    assert!(copied.contains("https://example.com/d"), "{copied}");
    for secret in ["extraheader", "eC1hY2Nlc3M", "SECRET2", "AUTHORIZATION"] {
        assert!(!copied.contains(secret), "{secret} in the image: {copied}");
    }
}

#[test]
fn a_secret_is_mounted_for_its_step_and_is_nowhere_in_the_image_or_the_log() {
    let (p, nonce) = project(
        // NONCE: the step is this test's own, never taken from another's cache (a
        // secret's value is not in BuildKit's cache keys).
        "RUN --mount=type=secret,id=tok,required=true sha256sum < /run/secrets/tok | cut -c1-16 | sed 's/^/SECRET-HASH /' && : NONCE\nCOPY nonce /nonce\n",
        "",
    );
    let value = format!("s3cret-value-{nonce}");
    let hash = {
        use sha2::Digest;
        let h = sha2::Sha256::digest(value.as_bytes());
        h.iter().map(|b| format!("{b:02x}")).collect::<String>()[..16].to_string()
    };
    // Not given: the line that mounts it, before anything is built.
    build(&p, &[], &[]).fails_with(
        2,
        "docker/Dockerfile:5: a step mounts secret `tok` (required); give it: cibox image build --secret id=tok",
    );
    let r = build(
        &p,
        &["--secret", "id=tok,env=CIBOX_TEST_TOKEN"],
        &[("CIBOX_TEST_TOKEN", &value)],
    );
    let img = built(&r);
    // The step read it (its hash is in the log), and the value is nowhere: not in the
    // log, not in any byte of the image.
    assert!(
        r.stderr.contains(&format!("SECRET-HASH {hash}")),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains(&value) && !r.stdout.contains(&value));
    let saved = p.path().join("saved.tar");
    docker(&["save", "-o", saved.to_str().unwrap(), &img.0]);
    let bytes = std::fs::read(&saved).unwrap();
    assert!(
        !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
        "the secret's value is in the saved image"
    );
    // A step that prints it and writes it into the image: masked in the log, and the
    // image refused and not kept.
    p.write(
        "docker/Dockerfile",
        format!(
            "{BASE}RUN --mount=type=secret,id=tok cat /run/secrets/tok; echo; cp /run/secrets/tok /leak; : NONCE\n"
        )
        .replace("NONCE", &nonce),
    );
    let before = labelled(&nonce);
    let r = build(
        &p,
        &["--secret", "id=tok,env=CIBOX_TEST_TOKEN"],
        &[("CIBOX_TEST_TOKEN", &value)],
    );
    r.fails_with(3, "a secret's value is in the built image; it was not kept");
    assert!(
        r.stderr.contains("secret `tok`: layer 2, leak"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("***"), "{}", r.stderr);
    assert!(!r.stderr.contains(&value) && !r.stdout.contains(&value));
    assert_eq!(labelled(&nonce), before, "the refused build left an image");
    // The classic builder mounts no secrets.
    build(
        &p,
        &["--secret", "id=tok,env=CIBOX_TEST_TOKEN"],
        &[("CIBOX_TEST_TOKEN", &value), ("DOCKER_BUILDKIT", "0")],
    )
    .fails_with(2, "secrets are mounted by BuildKit only");
}

#[test]
fn a_proxy_argument_changes_neither_the_id_nor_the_config() {
    // The step fails unless the proxies reach it; no ARG declares them.
    let (p, _) = project(
        "RUN test -n \"$HTTPS_PROXY\" && test -n \"$no_proxy\"\nCOPY nonce /nonce\n",
        "",
    );
    let with = |proxy: &str| {
        build(
            &p,
            &[],
            &[
                ("HTTPS_PROXY", &format!("http://ci:pw@{proxy}.invalid:3128")),
                ("no_proxy", "localhost"),
            ],
        )
    };
    let a = with("proxy-a");
    let img = built(&a);
    assert!(
        a.stderr.contains(
            "proxy arguments from the environment: HTTPS_PROXY, no_proxy (in neither the lockset nor the image)"
        ),
        "{}",
        a.stderr
    );
    let b = with("proxy-b");
    assert_eq!(b.stdout.trim(), img.0, "{}", b.stderr);
    let config = docker(&["inspect", &img.0]);
    let history = docker(&["history", "--no-trunc", &img.0]);
    for text in [&config, &history] {
        assert!(!text.contains("proxy-"), "{text}");
        assert!(!text.contains("ci:pw"), "{text}");
    }
    // Without them the step fails (run again, not taken from the cache, whose keys
    // leave proxies out too): they did reach it.
    build(&p, &["--check"], &[]).fails_with(3, "building the image");
    // A Dockerfile that declares one would put it in its history: refused, by line.
    p.write(
        "docker/Dockerfile",
        std::fs::read_to_string(p.path().join("docker/Dockerfile"))
            .unwrap()
            .replace("RUN test", "ARG HTTPS_PROXY\nRUN test"),
    );
    with("proxy-a").fails_with(
        2,
        "docker/Dockerfile:5: the Dockerfile declares `ARG HTTPS_PROXY`, and HTTPS_PROXY is set in the environment",
    );
}

#[test]
fn a_base_by_tag_is_refused_with_its_line_and_never_pulled() {
    let (p, nonce) = project("COPY nonce /nonce\n", "");
    let absent = format!("127.0.0.1:9/cibox-absent/{}", nonce.replace('-', ""));
    p.write(
        "docker/Dockerfile",
        format!("ARG T=v1\nFROM {absent}:${{T}} AS base\nCOPY nonce /nonce\n"),
    );
    let r = build(&p, &[], &[]);
    r.fails_with(
        3,
        &format!(
            "docker/Dockerfile:2: base `{absent}:v1` (written `{absent}:${{T}}`) is not present locally, and cibox never pulls by tag"
        ),
    );
    assert!(
        r.stderr.contains("pin it by digest (REPOSITORY@sha256:…)"),
        "{}",
        r.stderr
    );
    // A base cibox built, by the name it gave it: built on; by its bare ID (which
    // BuildKit would look up on Docker Hub): refused, pointing to that name.
    let (base, _) = project("COPY nonce /nonce\n", "");
    let base_img = built(&build(&base, &[], &[]));
    let own = format!("cibox/bk:id-{}", &base_img.0[7..]);
    assert!(
        names(&base_img.0).contains(&own),
        "{:?}",
        names(&base_img.0)
    );
    p.write(
        "docker/Dockerfile",
        format!("FROM {own}\nCOPY nonce /on-top\n"),
    );
    let r = build(&p, &[], &[]);
    let on_top = built(&r);
    assert!(
        r.stderr.contains(&format!(
            "FROM {own} (line 1): a tag, which names {}",
            base_img.0
        )),
        "{}",
        r.stderr
    );
    drop(on_top);
    p.write(
        "docker/Dockerfile",
        format!("FROM {}\nCOPY nonce /on-top\n", base_img.0),
    );
    build(&p, &[], &[]).fails_with(
        3,
        "is an image ID, which BuildKit reads as the Docker Hub image `sha256` and would pull",
    );
}

#[test]
fn a_pushed_image_comes_back_by_its_digest_to_the_same_id() {
    require_registry();
    let (p, nonce) = project("COPY nonce /nonce\n", "");
    let img = built(&build(&p, &[], &[]));
    let repo = format!("{REGISTRY}/cibox-test/push-{}", nonce.replace('-', ""));
    let r = p.cibox(&["image", "push", &img.0, "--to", &repo]);
    r.ok();
    let reference = r.stdout.trim().to_string();
    assert!(
        reference.starts_with(&format!("{repo}@sha256:")) && reference.len() == repo.len() + 72,
        "{reference}"
    );
    // The push's name is taken away again; the image keeps its own.
    assert!(
        !names(&img.0).iter().any(|n| n.starts_with(&repo)),
        "{:?}",
        names(&img.0)
    );
    assert!(remove_image(&img.0));
    let r = p.cibox(&["image", "fetch", &reference]);
    r.ok();
    assert_eq!(r.stdout.trim(), img.0, "{}", r.stderr);
    // Fetched, it is named as a build names it.
    assert!(
        names(&img.0).contains(&format!("cibox/bk:id-{}", &img.0[7..])),
        "{:?}",
        names(&img.0)
    );
    // Only a verified image, to a repository without a tag.
    p.cibox(&["image", "push", &img.0, "--to", &format!("{repo}:v1")])
        .fails_with(2, "carries a tag");
    p.write("nonce", "changed");
    p.cibox(&["image", "push", &img.0, "--to", &repo])
        .fails_with(3, "was built from different lock files");
}

#[test]
fn two_builds_from_the_same_locks_both_keep_a_name() {
    // `extra` is copied in but is not a lock file: another build of the same locks
    // gives another ID.
    let (p, _) = project("COPY nonce extra /\n", "");
    p.write("extra", "one");
    let first = built(&build(&p, &[], &[]));
    let lockset = p.cibox(&["image", "lockset"]);
    let digest = lockset
        .stdout
        .rsplit_once("digest: sha256:")
        .unwrap()
        .1
        .trim();
    let lockset_name = format!("cibox/bk:lockset-{}", &digest[..12]);
    assert!(names(&first.0).contains(&lockset_name));
    // Pinned to the first, a build that gives another ID is refused: it keeps its own
    // name, and takes the lockset's name from no one.
    let manifest = std::fs::read_to_string(p.path().join("cibox.yaml")).unwrap();
    p.write(
        "cibox.yaml",
        manifest.replace(
            "    context: .\n",
            &format!("    context: .\n    id: \"{}\"\n", first.0),
        ),
    );
    p.write("extra", "two");
    let r = build(&p, &[], &[]);
    r.fails_with(3, &format!("pins {}", first.0));
    let second_id = r
        .stderr
        .split("image `default` is ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap()
        .to_string();
    let second = ImageGuard(second_id);
    assert_ne!(second.0, first.0);
    assert_eq!(
        names(&second.0),
        [format!("cibox/bk:id-{}", &second.0[7..])]
    );
    assert!(names(&first.0).contains(&lockset_name));
    // Unpinned, it is the newest of those locks; the first keeps its own name.
    p.write("cibox.yaml", &manifest);
    assert_eq!(build(&p, &[], &[]).stdout.trim(), second.0);
    assert!(names(&second.0).contains(&lockset_name));
    assert_eq!(names(&first.0), [format!("cibox/bk:id-{}", &first.0[7..])]);
}

#[test]
fn a_build_context_stays_inside_the_repository() {
    // No engine is asked: each is refused before.
    let (p, _) = project("COPY nonce /nonce\n", "");
    let manifest = std::fs::read_to_string(p.path().join("cibox.yaml")).unwrap();
    let with = |context: &str| manifest.replace("context: .", &format!("context: {context}"));
    let no_engine = |p: &Project| {
        run(cibox(p.path())
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
            .args(["image", "build"]))
    };
    for (context, why) in [
        (
            "..",
            "images.default.context: `..` must be a folder inside the manifest's folder",
        ),
        (
            "docker/../..",
            "must be a folder inside the manifest's folder",
        ),
        ("/etc", "must be a folder inside the manifest's folder"),
    ] {
        p.write("cibox.yaml", with(context));
        no_engine(&p).fails_with(2, why);
    }
    // A .dockerignore that is a link out of the repository (to any file of the host) is
    // not read.
    p.write("cibox.yaml", &manifest);
    std::os::unix::fs::symlink("/etc/passwd", p.path().join(".dockerignore")).unwrap();
    no_engine(&p).fails_with(
        2,
        ".dockerignore: a link leading out of the manifest's folder (to /etc/passwd); a .dockerignore must be a file of the repository",
    );
    std::fs::remove_file(p.path().join(".dockerignore")).unwrap();
    // A link that leads out.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), p.path().join("out")).unwrap();
    p.write("cibox.yaml", with("out"));
    no_engine(&p).fails_with(2, "context `out` leads out of the manifest's folder");
    // The Dockerfile must be inside the context, and a plain file.
    p.write("cibox.yaml", with("python"));
    p.write("python/x", "x");
    no_engine(&p).fails_with(2, "is not inside the build context `python`");
    p.write("cibox.yaml", &manifest);
    std::fs::rename(
        p.path().join("docker/Dockerfile"),
        p.path().join("docker/real"),
    )
    .unwrap();
    std::os::unix::fs::symlink("real", p.path().join("docker/Dockerfile")).unwrap();
    no_engine(&p).fails_with(2, "a link; the Dockerfile must be a plain file");
    // And the manifest's other paths.
    p.write(
        "cibox.yaml",
        manifest.replace("dockerfile: docker/Dockerfile", "dockerfile: ../Dockerfile"),
    );
    no_engine(&p).fails_with(
        2,
        "images.default.dockerfile: `../Dockerfile` must be a relative path",
    );
}

#[test]
fn the_classic_builder_builds_where_asked_and_says_so_once() {
    let (p, _) = project("COPY nonce /nonce\n", "");
    let classic = build(&p, &[], &[("DOCKER_BUILDKIT", "0")]);
    let img = built(&classic);
    assert_eq!(
        classic
            .stderr
            .matches("the classic builder builds: DOCKER_BUILDKIT=0 asks for the classic builder")
            .count(),
        1,
        "{}",
        classic.stderr
    );
    assert!(classic.stderr.contains("Step 1/"), "{}", classic.stderr);
    // BuildKit records its steps otherwise, so the same recipe is another image.
    let kit = built(&build(&p, &[], &[]));
    assert_ne!(kit.0, img.0);
}
