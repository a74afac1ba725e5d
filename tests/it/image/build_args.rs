//! Build arguments (issue 24): a file of `NAME=VALUE` lines that is one of the image's
//! lock files, so another set of arguments is another lockset and another ID; names the
//! Dockerfile does not declare, and a file outside the locks, are refused.

use crate::common::*;

fn project(args_in_locks: bool) -> Project {
    let nonce = nonce();
    let locks = if args_in_locks {
        "[\"image/Dockerfile\", \"image/nonce\", \"image/args.env\"]"
    } else {
        "[\"image/Dockerfile\", \"image/nonce\"]"
    };
    let p = Project::new(&format!(
        "version: 1\nproject: ba\nimages:\n  default:\n    locks: {locks}\n    dockerfile: image/Dockerfile\n    build_args: image/args.env\nbatches:\n  b: {{gpus: 0, timeout: 1m, run: [x]}}\n"
    ));
    p.write(
        "image/Dockerfile",
        format!("ARG FLAVOUR=cpu\nFROM scratch\nARG FLAVOUR\nLABEL org.cibox.test.nonce={nonce} flavour=$FLAVOUR\nCOPY nonce /nonce\n"),
    );
    p.write("image/nonce", &nonce);
    p
}

fn build(p: &Project) -> Run {
    let _store = image_store_lock(false);
    p.cibox(&["image", "build"])
}

fn label(id: &str) -> String {
    let out = std::process::Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{index .Config.Labels \"flavour\"}}",
            id,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn build_arguments_are_locked_and_give_another_id() {
    require_engine();
    let p = project(true);
    p.write("image/args.env", "# the CPU build\nFLAVOUR=cpu\n");
    let r = build(&p);
    r.ok();
    let cpu = ImageGuard(r.stdout.trim().to_string());
    assert_eq!(label(&cpu.0), "cpu");
    p.write("image/args.env", "FLAVOUR=cu130\n");
    let r = build(&p);
    r.ok();
    let cuda = ImageGuard(r.stdout.trim().to_string());
    assert_ne!(cpu.0, cuda.0);
    assert_eq!(label(&cuda.0), "cu130");
    // The arguments are in the lockset the image carries.
    let r = p.cibox(&["image", "verify", &cuda.0]);
    r.ok();
    // A name the Dockerfile does not declare.
    p.write("image/args.env", "FLAVOR=cu130\n");
    build(&p).fails_with(
        2,
        "line 1: `FLAVOR` is not declared by an `ARG` of the Dockerfile (it declares FLAVOUR)",
    );
}

#[test]
fn build_arguments_outside_the_locks_are_refused() {
    let p = project(false);
    p.write("image/args.env", "FLAVOUR=cu130\n");
    build(&p).fails_with(2, "is not one of the image's lock files");
    // And only a Dockerfile recipe takes them.
    let p = Project::new(
        "version: 1\nproject: ba\nimages:\n  default:\n    locks: [x]\n    nix: .#image\n    build_args: args.env\nbatches:\n  b: {gpus: 0, timeout: 1m, run: [x]}\n",
    );
    p.cibox(&["batch", "list"])
        .fails_with(2, "build arguments are for a `dockerfile` recipe");
}
