//! `cibox image build` of a Nix recipe with the Nix Debian 12 installs (2.8, which lacks
//! `--print-out-paths`), offline: a flake with no inputs whose image is an archive this
//! test saved (nixpkgs cannot be fetched here), built by a plain `/bin/sh` derivation.

use std::process::Command;

use super::{build, image_project};
use crate::common::*;

#[test]
fn a_nix_recipe_builds_with_debians_nix() {
    require_engine();
    assert!(
        Command::new("nix")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "this test needs Nix (Debian's nix-bin): run `bash .ci/run`, which installs it"
    );
    assert!(
        nix::unistd::getuid().is_root(),
        "building with Nix without a daemon needs root (CI runs as root)"
    );
    // The image, made by a Dockerfile build from the same lock files, saved as the
    // archive the Nix recipe "builds".
    let p = image_project(&["image/Dockerfile", "image/nonce"]);
    let img = build(&p);
    let archive = p.path().join("image.tar");
    p.cibox(&["image", "save", &img.0, "--to", archive.to_str().unwrap()])
        .ok();
    assert!(remove_image(&img.0));
    p.write(
        "flake.nix",
        "{\n  outputs = {self}: {\n    image = builtins.derivation {\n      name = \"image.tar\";\n      system = \"x86_64-linux\";\n      builder = \"/bin/sh\";\n      args = [\"-c\" \"/bin/cp ${./image.tar} $out\"];\n    };\n  };\n}\n",
    );
    p.write(
        "flake.lock",
        r#"{"nodes":{"root":{}},"root":"root","version":7}"#,
    );
    p.write(
        "cibox.yaml",
        "version: 1\nproject: t\nimage:\n  locks: [\"image/Dockerfile\", \"image/nonce\"]\n  nix: path:.#image\nbatches:\n  unit: {gpus: 0, timeout: 1m, run: [\"true\"]}\n",
    );
    // A host without nix.conf: cibox switches the features on itself. No sandbox, no
    // build users, no substituters: a fresh machine's root without a daemon.
    let r = run(cibox(p.path()).args(["image", "build"]).env(
        "NIX_CONFIG",
        "sandbox = false\nbuild-users-group =\nsubstituters =\n",
    ));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let built = ImageGuard(r.stdout.trim().to_string());
    assert_eq!(built.0, img.0, "the archive's image, loaded and verified");
}
