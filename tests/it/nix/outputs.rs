//! Every output of the flake evaluates against the stand-in nixpkgs: the outputs per
//! system, the shells and checks, the images and their labels, the apps, the CUDA package
//! set kept out of the demo, the unfree predicate, the tool's source, and Nix's own
//! `flake check`. Nothing is built.

use std::process::Command;

use super::stand_in::write_stand_in;
use super::{NIX_CONFIG, copy_tracked, manifest_lockset, nix_eval, require_nix, require_root};

/// The repository's flake, copied, with its nixpkgs input replaced by the stand-in.
struct FlakeUnderTest {
    copy: tempfile::TempDir,
    stand_in: tempfile::TempDir,
}

impl FlakeUnderTest {
    fn new() -> FlakeUnderTest {
        let copy = tempfile::tempdir().unwrap();
        copy_tracked(copy.path(), &[]);
        let stand_in = tempfile::tempdir().unwrap();
        write_stand_in(stand_in.path());
        FlakeUnderTest { copy, stand_in }
    }

    /// `nix eval` of `attr` (applying `apply` when given) in pure evaluation.
    fn eval(&self, attr: &str, apply: Option<&str>) -> Result<serde_json::Value, String> {
        let stand_in = format!("path:{}", self.stand_in.path().display());
        let mut extra = vec!["--override-input", "nixpkgs", stand_in.as_str()];
        if let Some(f) = apply {
            extra.extend(["--apply", f]);
        }
        nix_eval(
            &format!("path:{}#{attr}", self.copy.path().display()),
            &extra,
        )
    }

    fn ok(&self, attr: &str, apply: Option<&str>) -> serde_json::Value {
        self.eval(attr, apply)
            .unwrap_or_else(|e| panic!("nix eval {attr}: {e}"))
    }

    /// `nix flake check --no-build`: Nix's own check of the outputs' shapes.
    fn flake_check(&self) -> std::process::Output {
        Command::new("nix")
            .env("NIX_CONFIG", NIX_CONFIG)
            .args([
                "flake",
                "check",
                "--no-build",
                "--offline",
                "--no-update-lock-file",
            ])
            .arg("--override-input")
            .arg("nixpkgs")
            .arg(format!("path:{}", self.stand_in.path().display()))
            .arg(format!("path:{}", self.copy.path().display()))
            .output()
            .unwrap()
    }

    /// Turns a switch of the stand-in on (see its pkgs.nix) or off.
    fn switch(&self, name: &str, on: bool) {
        let p = self.stand_in.path().join(name);
        if on {
            std::fs::write(p, "").unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn every_flake_output_evaluates_against_a_stand_in_nixpkgs() {
    require_nix();
    require_root();
    let f = FlakeUnderTest::new();
    let systems = ["aarch64-linux", "x86_64-linux"];
    let images = ["cuda-torch", "demo"];
    outputs_per_system(&f, systems);
    shells_and_checks(&f, systems);
    images_and_their_labels(&f, systems, images);
    apps_run_what_the_readme_says(&f, images);
    the_demo_never_evaluates_cuda(&f);
    the_unfree_predicate_lets_only_cuda_through(&f);
    the_tools_source_is_its_own_files(&f);
    the_package_carries_git_and_tests_with_it(&f);
    nix_flake_check_passes(&f);
}

fn outputs_per_system(f: &FlakeUnderTest, systems: [&str; 2]) {
    // Outputs per system: the tool, one image per folder, one app per image.
    let names = "builtins.mapAttrs (_: builtins.attrNames)";
    for (output, expected) in [
        (
            "packages",
            vec!["cibox", "default", "image-cuda-torch", "image-demo"],
        ),
        (
            "apps",
            vec![
                "gpu-batch",
                "image-cuda-torch",
                "image-demo",
                "image-verify",
                "reproduce",
            ],
        ),
        ("checks", vec!["cibox"]),
        ("devShells", vec!["default"]),
    ] {
        let v = f.ok(output, Some(names));
        assert_eq!(keys(&v), systems, "{output}");
        for s in systems {
            assert_eq!(v[s], serde_json::json!(expected), "{output}.{s}");
        }
    }
}

fn shells_and_checks(f: &FlakeUnderTest, systems: [&str; 2]) {
    // The shells and checks evaluate too.
    for s in systems {
        let shell = f.ok(&format!("devShells.{s}.default.standIn.packages"), None);
        assert!(shell.as_array().is_some_and(|p| !p.is_empty()), "{shell}");
        let check = f.ok(&format!("checks.{s}.cibox.name"), None);
        assert!(
            check.as_str().is_some_and(|n| n.starts_with("cibox-")),
            "{check}"
        );
    }
}

fn images_and_their_labels(f: &FlakeUnderTest, systems: [&str; 2], images: [&str; 2]) {
    // Each image: a fixed creation time, and both labels exactly what cibox computes
    // for that image of the manifest; the base files every image gets; CUDA packages
    // only in cuda-torch.
    let manifest = f.copy.path().join("cibox.yaml");
    for s in systems {
        for name in images {
            let args = f.ok(&format!("packages.{s}.image-{name}.standIn"), None);
            assert_eq!(args["created"], "1970-01-01T00:00:01Z", "{name}");
            let (digest, text) = manifest_lockset(&manifest, Some(name)).unwrap();
            let labels = &args["config"]["Labels"];
            assert_eq!(labels["org.cibox.lockset"], digest.as_str(), "{name}");
            assert_eq!(labels["org.cibox.lockset.files"], text.as_str(), "{name}");
            assert_eq!(args["tag"], format!("lockset-{}", &digest[7..19]), "{name}");
            let contents = args["contents"].as_array().unwrap();
            let content_names: Vec<&str> = contents
                .iter()
                .map(|c| c["name"].as_str().unwrap())
                .collect();
            assert_eq!(
                content_names[..3],
                ["usr-bin-env", "ca-certificates", "fake-nss"],
                "{name}"
            );
            let cuda: Vec<bool> = contents[3..]
                .iter()
                .map(|c| c["cudaSupport"].as_bool().unwrap())
                .collect();
            assert!(!cuda.is_empty(), "{name}: no recipe contents");
            assert!(
                cuda.iter().all(|&c| c == (name == "cuda-torch")),
                "{name}: cudaSupport of its contents: {cuda:?}"
            );
            let env = args["config"]["Env"].as_array().unwrap();
            assert!(
                env.contains(&serde_json::json!(
                    "SSL_CERT_FILE=/etc/ssl/certs/ca-bundle.crt"
                )),
                "{name}: {env:?}"
            );
            // The manifest builds this image from the same attribute.
            assert!(
                std::fs::read_to_string(&manifest)
                    .unwrap()
                    .contains(&format!("nix: .#image-{name}\n")),
                "cibox.yaml does not name .#image-{name}"
            );
        }
    }
}

fn apps_run_what_the_readme_says(f: &FlakeUnderTest, images: [&str; 2]) {
    // The apps run what the README says, each image app only its own image.
    let paths = f.ok(
        "packages.x86_64-linux",
        Some("p: builtins.mapAttrs (_: d: d.outPath) p"),
    );
    let cibox_bin = format!("{}/bin/cibox", paths["cibox"].as_str().unwrap());
    let apps = f.ok("apps.x86_64-linux", None);
    let script = |app: &str| {
        assert_eq!(apps[app]["type"], "app", "{app}");
        let description = apps[app]["meta"]["description"].as_str().unwrap_or("");
        assert!(!description.is_empty(), "{app} has no meta.description");
        std::fs::read_to_string(apps[app]["program"].as_str().unwrap()).unwrap()
    };
    for (app, line) in [
        ("gpu-batch", format!("exec {cibox_bin} batch run \"$@\"")),
        (
            "image-verify",
            format!("exec {cibox_bin} image verify \"$@\""),
        ),
        ("reproduce", format!("exec {cibox_bin} reproduce \"$@\"")),
    ] {
        let text = script(app);
        assert!(text.contains(&line), "{app} runs:\n{text}");
    }
    for name in images {
        let text = script(&format!("image-{name}"));
        let stream = paths[format!("image-{name}")].as_str().unwrap();
        let line = format!("{stream} | {cibox_bin} image load --from - --name {name} \"$@\"");
        assert!(text.contains(&line), "image-{name} runs:\n{text}");
        for other in images.iter().filter(|o| **o != name) {
            let theirs = paths[format!("image-{other}")].as_str().unwrap();
            assert!(!text.contains(theirs), "image-{name} holds image-{other}");
        }
    }
}

fn the_demo_never_evaluates_cuda(f: &FlakeUnderTest) {
    // Building the demo never evaluates the CUDA package set.
    f.switch("poison-cuda", true);
    f.eval("apps.x86_64-linux.image-demo.program", None)
        .unwrap_or_else(|e| panic!("image-demo with the CUDA set poisoned: {e}"));
    let e = f
        .eval("apps.x86_64-linux.image-cuda-torch.program", None)
        .unwrap_err();
    assert!(e.contains("pkgsCuda was evaluated"), "{e}");
    f.switch("poison-cuda", false);
}

fn the_unfree_predicate_lets_only_cuda_through(f: &FlakeUnderTest) {
    // The unfree predicate lets the CUDA redistributables through (cuda_nvcc pulls in
    // libnvvm, libnvptxcompiler and cuda_cccl; torch cuDNN and cuSPARSELt), and
    // nothing else unfree.
    f.switch("unfree-dep", true);
    let e = f
        .eval(
            "packages.x86_64-linux.image-cuda-torch.standIn.contents",
            None,
        )
        .unwrap_err();
    assert!(
        e.contains(
            "Package ‘nvidia-x11-1.0’ in the stand-in nixpkgs has an unfree license (‘unfree’)"
        ),
        "{e}"
    );
    f.switch("unfree-dep", false);
}

fn the_tools_source_is_its_own_files(f: &FlakeUnderTest) {
    // The tool's source is Cargo.toml, Cargo.lock, build.rs, src/ and the workspace
    // member: an edit to the README does not change it.
    let src = "p: builtins.attrNames (builtins.readDir p.standIn.src)";
    assert_eq!(
        f.ok("packages.x86_64-linux.cibox", Some(src)),
        serde_json::json!(["Cargo.lock", "Cargo.toml", "build.rs", "src", "tests"])
    );
    assert_eq!(
        f.ok(
            "packages.x86_64-linux.cibox",
            Some("p: builtins.attrNames (builtins.readDir (p.standIn.src + \"/tests\"))")
        ),
        serde_json::json!(["nvml-double"])
    );
    let src = || f.ok("packages.x86_64-linux.cibox.standIn.src", None);
    let before = src();
    std::fs::write(f.copy.path().join("README.md"), "edited\n").unwrap();
    assert_eq!(src(), before, "a README edit changed the tool's source");
    std::fs::write(f.copy.path().join("src/edited.rs"), "\n").unwrap();
    assert_ne!(
        src(),
        before,
        "an edit under src/ left the tool's source as it was"
    );
}

fn the_package_carries_git_and_tests_with_it(f: &FlakeUnderTest) {
    // The check phase runs the binary's unit tests (the crate has no library), some of
    // which run git; the build sandbox's PATH has none, so git is a check input. At run
    // time cibox finds git through its wrapper, after the user's own.
    let args = f.ok("packages.x86_64-linux.cibox.standIn", None);
    assert_eq!(
        args["cargoTestFlags"],
        serde_json::json!(["--bins"]),
        "{args}"
    );
    // Derivations serialise as their store paths.
    let paths = |key: &str| -> Vec<String> {
        args[key]
            .as_array()
            .unwrap_or(&Vec::new())
            .iter()
            .map(|d| d.as_str().unwrap_or_default().to_string())
            .collect()
    };
    for tool in ["-git-1.0", "-util-linux-1.0"] {
        assert!(
            paths("nativeCheckInputs").iter().any(|p| p.ends_with(tool)),
            "{tool}: {args}"
        );
    }
    let post = args["postInstall"].as_str().unwrap_or_default();
    assert!(
        post.contains("wrapProgram $out/bin/cibox --suffix PATH :") && post.contains("-git-"),
        "{post}"
    );
}

fn nix_flake_check_passes(f: &FlakeUnderTest) {
    // Last: Nix 2.8's `flake check` reads sources the evaluations above added to the
    // store, without adding them itself ("path … is not valid" when run first).
    let out = f.flake_check();
    assert!(
        out.status.success(),
        "nix flake check --no-build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
