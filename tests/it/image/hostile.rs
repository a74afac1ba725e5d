//! Image builds a pull request cannot turn against the host (issue 43): the Dockerfile
//! is read exactly as the engine's BuildKit reads it or refused, it never picks its
//! frontend, and every image the build reads is the one cibox checked.

use crate::common::*;

/// A project whose Dockerfile (`text`, `NONCE` replaced) builds from `docker/` over a
/// busybox root; `args` is its build arguments file, when given.
fn project(text: &str, args: Option<&str>) -> (Project, String) {
    require_engine();
    let nonce = nonce();
    let build_args = if args.is_some() {
        "    build_args: docker/args.env\n"
    } else {
        ""
    };
    let p = Project::new(&format!(
        "version: 1\nproject: hb\nimages:\n  default:\n    locks: [\"docker/Dockerfile\", \"docker/args.env\", \"nonce\"]\n    dockerfile: docker/Dockerfile\n    context: .\n{build_args}batches:\n  b: {{gpus: 0, timeout: 1m, run: [\"true\"]}}\n"
    ));
    p.write("docker/Dockerfile", text.replace("NONCE", &nonce));
    p.write("docker/args.env", args.unwrap_or(""));
    p.write("nonce", &nonce);
    busybox_rootfs(&p.path().join("rootfs"));
    (p, nonce)
}

fn build(p: &Project, envs: &[(&str, &str)]) -> Run {
    let _store = image_store_lock(false);
    let mut c = cibox(p.path());
    c.args(["-v", "image", "build"]);
    for (k, v) in envs {
        c.env(k, v);
    }
    run(&mut c)
}

/// Nothing was asked of a registry or built: the refusal came first.
fn nothing_built(r: &Run) {
    for s in ["resolve image config", "building:"] {
        assert!(
            !r.stderr.contains(s) && !r.stdout.contains(s),
            "{s}: {}",
            r.stderr
        );
    }
}

const BASE: &str = "FROM scratch\nLABEL org.cibox.test.nonce=NONCE\nCOPY rootfs/ /\n";

#[test]
fn a_dockerfile_never_picks_its_frontend() {
    for head in [
        "# syntax=127.0.0.1:5000/cibox-frontend:1\n",
        "#syntax = 127.0.0.1:5000/cibox-frontend:1\n",
        "# check=skip=all\n# syntax=127.0.0.1:5000/cibox-frontend:1\n",
    ] {
        let (p, _) = project(&format!("{head}{BASE}"), None);
        let r = build(&p, &[]);
        r.fails_with(
            2,
            "asks for the frontend image `127.0.0.1:5000/cibox-frontend:1`",
        );
        nothing_built(&r);
    }
    // Nor through a build argument, given or declared.
    let (p, _) = project(
        &format!("{BASE}ARG X\n"),
        Some("BUILDKIT_SYNTAX=127.0.0.1:5000/cibox-frontend:1\n"),
    );
    let r = build(&p, &[]);
    r.fails_with(
        2,
        "`BUILDKIT_SYNTAX`: BUILDKIT_* arguments are options of the builder's frontend",
    );
    nothing_built(&r);
    let (p, _) = project(
        &format!("ARG BUILDKIT_SYNTAX=127.0.0.1:5000/f:1\n{BASE}"),
        None,
    );
    build(&p, &[]).fails_with(2, "docker/Dockerfile:1: ARG BUILDKIT_SYNTAX");
}

#[test]
fn a_proxy_argument_split_by_a_continuation_is_still_the_proxy() {
    let (p, _) = project(&format!("{BASE}ARG HTTP_PRO\\\nXY\nRUN true\n"), None);
    let r = build(&p, &[("HTTP_PROXY", "http://user:s3cretpw@127.0.0.1:9")]);
    r.fails_with(
        2,
        "docker/Dockerfile:4: the Dockerfile declares `ARG HTTP_PROXY`",
    );
    assert!(
        !r.stderr.contains("s3cretpw") && !r.stdout.contains("s3cretpw"),
        "{}",
        r.stderr
    );
    nothing_built(&r);
}

#[test]
fn flags_a_reader_could_misread_are_refused() {
    for (step, says) in [
        (
            "COPY --fr\"om\"=127.0.0.1:5000/cibox-q:1 /bin/sh /x\n",
            "a quote inside the flag",
        ),
        (
            "COPY --fr\\\nom=127.0.0.1:5000/cibox-q:1 /bin/sh /x\n",
            "split by a line continuation",
        ),
        (
            "RUN --mount=type=bind,f\"rom\"=127.0.0.1:5000/cibox-q:1,target=/m true\n",
            "a quote inside the flag",
        ),
        (
            "RUN --mount=type=bind,from=$Q,target=/m true\n",
            "BuildKit versions differ",
        ),
        ("RUN --network=host true\n", "RUN --network=host"),
        ("RUN --security=insecure true\n", "sandbox"),
    ] {
        let (p, _) = project(&format!("{BASE}{step}"), None);
        let r = build(&p, &[]);
        r.fails_with(2, says);
        nothing_built(&r);
    }
    // The same with the quotes around the CSV field (BuildKit drops them before its CSV
    // reader sees the value): refused as well, never taken for a field of another name.
    let (p, _) = project(
        &format!("{BASE}RUN --mount=type=bind,\"from=127.0.0.1:5000/cibox-q:1\",target=/m true\n"),
        None,
    );
    let r = build(&p, &[]);
    r.fails_with(2, "a quote inside the flag");
    nothing_built(&r);
}

#[test]
fn a_local_base_for_another_platform_is_refused() {
    let (base, _) = project(BASE, None);
    let r = build(&base, &[]);
    r.ok();
    let base_img = ImageGuard(r.stdout.trim().to_string());
    let own = format!("cibox/hb:id-{}", &base_img.0[7..]);
    let other = if std::env::consts::ARCH == "aarch64" {
        "linux/amd64"
    } else {
        "linux/arm64"
    };
    let (p, _) = project(
        &format!("FROM --platform={other} {own}\nCOPY nonce /n\n"),
        None,
    );
    let r = build(&p, &[]);
    r.fails_with(3, &format!("docker/Dockerfile:1: base `{own}` is taken for --platform={other}, but the local image is linux/"));
    nothing_built(&r);
    // Its own platform, said or not, builds.
    let (p, _) = project(
        &format!("ARG P=$BUILDPLATFORM\nFROM --platform=$P {own}\nCOPY nonce /n\n"),
        None,
    );
    let r = build(&p, &[]);
    r.ok();
    drop(ImageGuard(r.stdout.trim().to_string()));
}

/// Issue 43, second attack: a build arguments file that sets one of BuildKit's platform
/// arguments would have the builder take another base than cibox checks.
#[test]
fn a_platform_argument_is_never_a_build_argument() {
    let (p, _) = project(
        "ARG TARGETARCH\nFROM 127.0.0.1:5000/cibox-q-${TARGETARCH}:1\nARG TARGETARCH\n",
        Some("TARGETARCH=evil\n"),
    );
    let r = build(&p, &[]);
    r.fails_with(2, "`TARGETARCH` is one of BuildKit's platform arguments");
    nothing_built(&r);
}
