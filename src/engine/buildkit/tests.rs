//! Reading BuildKit's progress: steps shown once, a failure's last lines, and what
//! is hidden masked before it is text.

use super::*;
use bollard_buildkit_proto::moby::buildkit::v1::{Vertex, VertexLog};

fn trace(status: StatusResponse) -> Vec<u8> {
    use base64::Engine as _;
    let bytes = prost::Message::encode_to_vec(&status);
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    format!("{{\"id\":\"moby.buildkit.trace\",\"aux\":\"{b64}\"}}\r\n").into_bytes()
}

fn vertex(digest: &str, name: &str, started: bool, error: &str) -> Vertex {
    Vertex {
        digest: digest.into(),
        name: name.into(),
        started: started.then(Default::default),
        error: error.into(),
        ..Default::default()
    }
}

#[test]
fn steps_are_shown_once_and_a_failure_names_its_step_and_last_lines() {
    let none = Masker::default();
    let mut p = Progress::new(&none);
    let mut seen = Vec::new();
    let mut on = |e: BuildEvent<'_>| match e {
        BuildEvent::Step { name, cached } => seen.push(format!("step {name} {cached}")),
        BuildEvent::Output(t) => seen.push(format!("out {t}")),
    };
    for status in [
        StatusResponse {
            vertexes: vec![
                vertex("a", "[internal] load build definition", true, ""),
                vertex("b", "[base 1/2] RUN make", true, ""),
            ],
            ..Default::default()
        },
        StatusResponse {
            vertexes: vec![vertex("b", "[base 1/2] RUN make", true, "")],
            logs: vec![VertexLog {
                vertex: "b".into(),
                msg: b"compiling\nfailed: x".to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        },
        StatusResponse {
            vertexes: vec![vertex("b", "[base 1/2] RUN make", true, "exit code: 2")],
            logs: vec![VertexLog {
                vertex: "b".into(),
                msg: b"yz\n".to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        },
    ] {
        p.message(&trace(status), &mut on).unwrap();
    }
    let err = p
        .message(
            b"{\"errorDetail\":{\"message\":\"executor failed running [/bin/sh -c make]: exit code: 2\"},\"error\":\"x\"}\r\n",
            &mut on,
        )
        .unwrap_err();
    assert_eq!(
        seen,
        [
            "step [base 1/2] RUN make false",
            "out compiling\nfailed: x",
            "out yz\n"
        ]
    );
    assert_eq!(
        err,
        "executor failed running [/bin/sh -c make]: exit code: 2\n  in step [base 1/2] RUN make; its last lines:\n    compiling\n    failed: xyz"
    );
}

#[test]
fn the_image_id_is_what_the_engine_names() {
    let none = Masker::default();
    let mut p = Progress::new(&none);
    p.message(
        b"{\"id\":\"moby.image.id\",\"aux\":{\"ID\":\"sha256:abc\"}}",
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(p.id.as_deref(), Some("sha256:abc"));
}

/// A step `b` that printed `pieces` (one message each) and then failed with
/// `error`: what was shown, and the failure.
fn printed(mask: &Masker, pieces: &[&[u8]], error: &str) -> (String, String) {
    let mut p = Progress::new(mask);
    let mut shown = String::new();
    let mut on = |e: BuildEvent<'_>| match e {
        BuildEvent::Step { name, .. } => shown.push_str(&format!("[{name}]")),
        BuildEvent::Output(t) => shown.push_str(t),
    };
    for (i, piece) in pieces.iter().enumerate() {
        let last = i + 1 == pieces.len();
        let status = StatusResponse {
            vertexes: vec![vertex(
                "b",
                "[1/1] RUN x",
                true,
                if last { error } else { "" },
            )],
            logs: vec![VertexLog {
                vertex: "b".into(),
                msg: piece.to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        };
        p.message(&trace(status), &mut on).unwrap();
    }
    let failure = if error.is_empty() {
        p.flush(&mut on);
        String::new()
    } else {
        p.message(
            format!("{{\"errorDetail\":{{\"message\":\"{error}\"}}}}").as_bytes(),
            &mut on,
        )
        .unwrap_err()
    };
    (shown, failure)
}

#[test]
fn a_secret_printed_in_two_pieces_is_masked() {
    let mask = Masker::new([b"split-secret-value".as_slice()]);
    let (shown, _) = printed(&mask, &[b"token: split-sec", b"ret-value\ndone\n"], "");
    assert_eq!(shown, "[[1/1] RUN x]token: ***\ndone\n");
    // Cut anywhere, the same.
    let text = b"a split-secret-value b split-secret-value\n";
    for cut in 0..text.len() {
        let (shown, _) = printed(&mask, &[&text[..cut], &text[cut..]], "");
        assert_eq!(shown, "[[1/1] RUN x]a *** b ***\n", "{cut}");
    }
}

#[test]
fn a_failed_steps_last_lines_hold_no_line_of_a_secret() {
    let key = b"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n-----END PRIVATE KEY-----\n";
    let mask = Masker::new([key.as_slice()]);
    // Printed in pieces that cut its lines, with other text around.
    let (shown, failure) = printed(
        &mask,
        &[
            b"key:\n-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg",
            &key[40..],
            b"bye\n",
        ],
        "exit code: 1",
    );
    for line in key.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let line = std::str::from_utf8(line).unwrap();
        assert!(
            !shown.contains(line) && !failure.contains(line),
            "{line}:\n{shown}\n{failure}"
        );
    }
    assert!(
        failure
            .starts_with("exit code: 1\n  in step [1/1] RUN x; its last lines:\n    key:\n    ***"),
        "{failure}"
    );
}

#[test]
fn a_secret_that_is_not_utf8_is_masked_before_it_is_text() {
    let value = b"\xff\xfenot-utf8-secret";
    let mask = Masker::new([value.as_slice()]);
    let piece = [b"v=".as_slice(), value, b"\n"].concat();
    let (shown, failure) = printed(&mask, &[&piece], "failed");
    assert_eq!(shown, "[[1/1] RUN x]v=***\n");
    assert!(!failure.contains("not-utf8-secret"), "{failure}");
}
