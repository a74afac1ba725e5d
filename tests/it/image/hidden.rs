//! Nothing the host gives a build stays in the image or is shown (issue 43): a secret
//! or a proxy's credentials a hostile Dockerfile writes into a file's name, a link's
//! target, an extended attribute, the config or the history is found and the image
//! refused, never kept; and a secret printed in pieces, line by line in a failed
//! step's error, as bytes that are not UTF-8, or in the name of a file that differs
//! between two builds is masked. The value is never in what cibox prints.

use std::process::Command;

use super::buildkit::{BASE, build, built, labelled, project};
use crate::common::*;

/// Asserts that `value` is nowhere in what the run printed.
fn never_shown(r: &Run, value: &[u8]) {
    for (name, text) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        assert!(
            !text.as_bytes().windows(value.len()).any(|w| w == value),
            "{name} shows {:?}:\n{text}",
            String::from_utf8_lossy(value)
        );
    }
}

/// Asserts that the refusal names each of `places`.
fn names(r: &Run, places: &[&str]) {
    for place in places {
        assert!(r.stderr.contains(place), "`{place}` missing:\n{}", r.stderr);
    }
}

/// The Dockerfile of project `p`: `BASE` and `stages`, `NONCE` replaced.
fn write_stages(p: &Project, nonce: &str, stages: &str) {
    p.write(
        "docker/Dockerfile",
        format!("{BASE}{stages}").replace("NONCE", nonce),
    );
}

#[test]
fn a_secret_in_a_name_or_a_link_target_is_found_and_the_image_refused() {
    let (p, nonce) = project("", "");
    let value = format!("n4me-{nonce}");
    write_stages(
        &p,
        &nonce,
        "RUN --mount=type=secret,id=tok ln -s \"$(cat /run/secrets/tok)\" /l && touch \"/a-$(cat /run/secrets/tok)\" && ln \"/a-$(cat /run/secrets/tok)\" /z && : NONCE\n",
    );
    let before = labelled(&nonce);
    let r = build(
        &p,
        &["--secret", "id=tok,env=CIBOX_TEST_TOKEN"],
        &[("CIBOX_TEST_TOKEN", &value)],
    );
    r.fails_with(3, "a secret's value is in the built image; it was not kept");
    names(
        &r,
        &[
            "secret `tok`: layer 2, a-*** (its name)",
            "secret `tok`: layer 2, l (its link target)",
            "secret `tok`: layer 2, z (its link target)",
        ],
    );
    never_shown(&r, value.as_bytes());
    assert_eq!(labelled(&nonce), before, "the refused build left an image");
}

/// Compiles `sx PATH NAME` into `rootfs/bin` of `p`: sets an extended attribute of
/// PATH to what its standard input holds (busybox has no `setfattr`).
fn setxattr_tool(p: &Project) {
    let src = p.write(
        "sx.c",
        "#include <sys/xattr.h>\n#include <unistd.h>\nint main(int c, char **v) { char b[4096]; ssize_t n = 0, r; if (c != 3) return 2; while ((r = read(0, b + n, sizeof b - n)) > 0) n += r; return lsetxattr(v[1], v[2], b, n, 0) ? 1 : 0; }\n",
    );
    let out = Command::new("cc")
        .args(["-static", "-Os", "-o"])
        .arg(p.path().join("rootfs/bin/sx"))
        .arg(&src)
        .output()
        .expect("cc, the C compiler Rust links with");
    assert!(
        out.status.success(),
        "cc -static: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_secret_in_an_extended_attribute_is_found_and_the_image_refused() {
    // Docker 20.10's layers keep one extended attribute, `security.capability`: 20
    // bytes the kernel checks only for their size and revision, 16 of them free.
    let (p, nonce) = project("", "");
    setxattr_tool(&p);
    let value = format!("xattr-{}", &nonce.replace('-', "")[..10]);
    assert_eq!(value.len(), 16);
    write_stages(
        &p,
        &nonce,
        "RUN --mount=type=secret,id=tok touch /f && { printf '\\000\\000\\000\\002'; cat /run/secrets/tok; } | sx /f security.capability && : NONCE\n",
    );
    let before = labelled(&nonce);
    let r = build(
        &p,
        &["--secret", "id=tok,env=CIBOX_TEST_TOKEN"],
        &[("CIBOX_TEST_TOKEN", &value)],
    );
    r.fails_with(3, "a secret's value is in the built image; it was not kept");
    names(
        &r,
        &["secret `tok`: layer 2, f (its extended attribute security.capability)"],
    );
    never_shown(&r, value.as_bytes());
    assert_eq!(labelled(&nonce), before, "the refused build left an image");
}

#[test]
fn a_secret_printed_in_pieces_as_bytes_or_in_an_error_is_masked() {
    let (p, nonce) = project("", "");
    // Printed in two writes a second apart (two pieces of BuildKit's progress), and a
    // value that is not UTF-8, under -v.
    let split = format!("split-{nonce}");
    let bytes = [b"\xff\xfe".as_slice(), format!("bytes-{nonce}").as_bytes()].concat();
    let file = p.write("bytes.secret", &bytes);
    write_stages(
        &p,
        &nonce,
        "RUN --mount=type=secret,id=tok --mount=type=secret,id=bin head -c 10 /run/secrets/tok; sleep 1; tail -c +11 /run/secrets/tok; echo; cat /run/secrets/bin; echo; : NONCE\n",
    );
    let r = build(
        &p,
        &[
            "--secret",
            "id=tok,env=CIBOX_TEST_TOKEN",
            "--secret",
            &format!("id=bin,src={}", file.display()),
        ],
        &[("CIBOX_TEST_TOKEN", &split)],
    );
    let _img = built(&r);
    assert!(r.stderr.contains("***"), "{}", r.stderr);
    never_shown(&r, split.as_bytes());
    never_shown(&r, &bytes[2..]);
    // A key of several lines, printed by a step that fails: the error quotes its last
    // lines, indented again.
    let key = format!(
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nbody-{nonce}\n-----END PRIVATE KEY-----\n"
    );
    let file = p.write("key.secret", &key);
    write_stages(
        &p,
        &nonce,
        "RUN --mount=type=secret,id=key cat /run/secrets/key; exit 1; : NONCE\n",
    );
    let r = build(
        &p,
        &["--secret", &format!("id=key,src={}", file.display())],
        &[],
    );
    r.fails_with(3, "building the image");
    assert!(r.stderr.contains("its last lines:"), "{}", r.stderr);
    for line in key.lines() {
        never_shown(&r, line.as_bytes());
    }
}

#[test]
fn a_file_named_after_a_secrets_line_is_masked_in_what_check_finds_differs() {
    // One line of a key in a name that differs on every build: not the value, so not
    // refused as holding it, but `--check` names the file, masked.
    let (p, nonce) = project("", "");
    let line = format!("line-one-{nonce}");
    let file = p.write("key.secret", format!("{line}\nline-two-{nonce}\n"));
    write_stages(
        &p,
        &nonce,
        "RUN --mount=type=secret,id=key touch \"/x-$(head -n 1 /run/secrets/key)-$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \\n')\" && : NONCE\n",
    );
    let r = build(
        &p,
        &[
            "--check",
            "--secret",
            &format!("id=key,src={}", file.display()),
        ],
        &[],
    );
    r.fails_with(3, "not reproducible");
    assert!(
        r.stderr.contains("layer 2: x-***-") && r.stderr.contains("(only in the first build)"),
        "{}",
        r.stderr
    );
    never_shown(&r, line.as_bytes());
}

/// The proxy of these tests: credentials unique to the test.
fn proxy(nonce: &str) -> (String, String) {
    let password = format!("pw-{nonce}");
    (
        format!("http://ci-user:{password}@proxy.invalid:3128"),
        password,
    )
}

#[test]
fn a_proxys_credentials_in_a_name_or_through_a_bases_onbuild_are_refused() {
    // A step writes the proxy it is given (no ARG needed) into a file's name.
    let (p, nonce) = project("", "");
    let (url, password) = proxy(&nonce);
    write_stages(
        &p,
        &nonce,
        "RUN touch \"/p-${HTTPS_PROXY#http://}\" && : NONCE\n",
    );
    let r = build(&p, &[], &[("HTTPS_PROXY", &url)]);
    r.fails_with(
        3,
        "a proxy's credentials are in the built image; it was not kept",
    );
    names(
        &r,
        &["the credentials of proxy variable HTTPS_PROXY: layer 2, p-*** (its name)"],
    );
    never_shown(&r, password.as_bytes());
    // A base whose ONBUILD triggers declare the ARG (no line of the Dockerfile does)
    // would put the value in ENV, LABEL and the history of the steps after it: such a
    // base is refused before anything is built (the config and history search that
    // would also refuse it is `normalise::scan`'s, unit-tested there).
    write_stages(
        &p,
        &nonce,
        "ONBUILD ARG HTTPS_PROXY\nONBUILD ENV LEAK=$HTTPS_PROXY\nONBUILD LABEL leak=$HTTPS_PROXY\nCOPY nonce /nonce\n",
    );
    let base = built(&build(&p, &[], &[]));
    p.write(
        "docker/Dockerfile",
        format!("FROM {}\nRUN true && : {nonce}\n", own_name("bk", &base.0)),
    );
    let before = labelled(&nonce);
    let r = build(&p, &[], &[("HTTPS_PROXY", &url)]);
    r.fails_with(3, "carries 3 ONBUILD trigger(s)");
    never_shown(&r, password.as_bytes());
    assert_eq!(labelled(&nonce), before, "the refused build left an image");
}

#[test]
fn a_proxy_without_credentials_and_no_proxy_are_nothing_to_refuse() {
    let (p, nonce) = project("", "");
    write_stages(
        &p,
        &nonce,
        "RUN echo \"$HTTPS_PROXY $no_proxy\" > /proxies && echo '127.0.0.1 localhost' > /hosts && : NONCE\n",
    );
    let r = build(
        &p,
        &[],
        &[
            ("HTTPS_PROXY", "http://proxy.invalid:3128"),
            ("no_proxy", "localhost,user:password@x"),
        ],
    );
    built(&r);
}

/// Issue 43, second attack: a refused build's step stays in the engine's build cache,
/// which does not key on a secret's value; a later build given no secret took it from
/// there, and its image held the first build's secret. The refused build's layers are
/// written down, and a build the cache gives one of them is refused.
#[test]
fn a_refused_builds_cached_step_is_never_kept_by_a_later_build() {
    let (p, nonce) = project("", "");
    let value = format!("c4ched-{nonce}");
    write_stages(
        &p,
        &nonce,
        "RUN --mount=type=secret,id=tok cp /run/secrets/tok /leak || true && : NONCE\n",
    );
    let before = labelled(&nonce);
    let r = build(
        &p,
        &["--secret", "id=tok,env=CIBOX_TEST_TOKEN"],
        &[("CIBOX_TEST_TOKEN", &value)],
    );
    r.fails_with(3, "a secret's value is in the built image; it was not kept");
    let again = build(&p, &[], &[]);
    again.fails_with(3, "the engine's build cache gave this build a layer");
    assert!(again.stderr.contains("(cached)"), "{}", again.stderr);
    never_shown(&again, value.as_bytes());
    assert_eq!(labelled(&nonce), before, "a refused build left an image");
}
