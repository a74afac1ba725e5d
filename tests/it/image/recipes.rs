//! What the real recipes do (issue 44): vLLM's optional secret mount, SGLang's
//! `.dockerignore` that is a link to its `.gitignore`, a `context:` that is not a folder
//! of the repository, and a failed step's message as lines, not one line of `\n`.

use crate::common::*;

use super::buildkit::{BASE, build, built, labelled, project};

#[test]
fn an_optional_secret_mount_without_the_secret_builds_and_the_step_sees_no_file() {
    // vLLM's `--mount=type=secret,id=aws-credentials,…,required=false`, no --secret:
    // built as `docker build` builds it, the step finding nothing at the target.
    let (p, nonce) = project(
        "RUN --mount=type=secret,id=aws-credentials,target=/root/.aws/credentials,required=false \\\n    if [ -e /root/.aws/credentials ]; then echo CRED-FO\"\"UND; else echo CRED-AB\"\"SENT; fi && : NONCE\nCOPY nonce /nonce\n",
        "",
    );
    let r = build(&p, &[], &[]);
    let img = built(&r);
    assert!(r.stderr.contains("CRED-ABSENT"), "{}", r.stderr);
    assert!(!r.stderr.contains("CRED-FOUND"), "{}", r.stderr);
    assert_eq!(labelled(&nonce), std::slice::from_ref(&img.0));
    // Given, the step reads it (a step of its own: a secret is not in the cache key);
    // required and not given stays refused before the build.
    p.write(
        "docker/Dockerfile",
        format!("{BASE}RUN --mount=type=secret,id=aws-credentials,target=/c,required=false \\\n    if [ -e /c ]; then echo CRED-FO\"\"UND; fi && : NONCE given\nCOPY nonce /nonce\n")
            .replace("NONCE", &nonce),
    );
    let given = build(
        &p,
        &["--secret", "id=aws-credentials,env=CIBOX_TEST_AWS"],
        &[("CIBOX_TEST_AWS", &format!("creds-{nonce}"))],
    );
    assert!(given.stderr.contains("CRED-FOUND"), "{}", given.stderr);
    let _given = built(&given);
    p.write(
        "docker/Dockerfile",
        format!("{BASE}RUN --mount=type=secret,id=aws-credentials,required=true true\n")
            .replace("NONCE", &nonce),
    );
    build(&p, &[], &[]).fails_with(
        2,
        "docker/Dockerfile:5: a step mounts secret `aws-credentials` (required)",
    );
}

#[test]
fn a_failed_step_says_its_last_lines_as_lines_under_the_headline() {
    let (p, _) = project(
        "RUN echo LAST-W\"\"ORDS-NONCE && echo second-line && false\n",
        "",
    );
    let r = build(&p, &[], &[]);
    r.fails_with(3, "building the image (BuildKit)");
    assert!(!r.stderr.contains("\\n"), "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.starts_with("cibox: error:"))
        .unwrap();
    let under = &lines[head + 1..];
    assert!(
        under.iter().any(|l| l.starts_with("  in step ")),
        "{}",
        r.stderr
    );
    assert!(
        under
            .iter()
            .any(|l| l.starts_with("    ") && l.trim() == "second-line"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_dockerignore_that_is_a_link_to_the_gitignore_is_followed() {
    // SGLang's root: `.dockerignore -> .gitignore`. What it excludes is not sent.
    let (p, _) = project(
        "COPY sub/ /sub/\nRUN test -e /sub/kept.txt && test ! -e /sub/ignored.txt && echo IGNORE-O\"\"K && : NONCE\n",
        "",
    );
    p.write("sub/kept.txt", "k");
    p.write("sub/ignored.txt", "i");
    p.write(".gitignore", "# as git ignores\nsub/ignored.txt\n");
    std::os::unix::fs::symlink(".gitignore", p.path().join(".dockerignore")).unwrap();
    let r = build(&p, &[], &[]);
    let _img = built(&r);
    assert!(r.stderr.contains("IGNORE-OK"), "{}", r.stderr);
}

#[test]
fn a_context_that_is_a_url_is_refused_at_its_line_by_every_command() {
    // Not only at build time, as a folder that is missing: `batch list` reads it too.
    let p = Project::new(
        "version: 1\nproject: bk\nimages:\n  default:\n    locks: [\"docker/Dockerfile\"]\n    dockerfile: docker/Dockerfile\n    context: https://github.com/sgl-project/sglang.git#main\nbatches:\n  b: {gpus: 0, timeout: 1m, run: [\"true\"]}\n",
    );
    p.write("docker/Dockerfile", "FROM scratch\n");
    for args in [&["batch", "list"][..], &["image", "build"][..]] {
        run(cibox(p.path())
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
            .args(args))
        .fails_with(
            2,
            "cibox.yaml:7:14: images.default.context: `https://github.com/sgl-project/sglang.git#main` is a URL; a build context is a folder of the repository",
        );
    }
}
