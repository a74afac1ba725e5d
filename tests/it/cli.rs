//! The command line and the manifest, end to end through the binary.

use crate::common::*;

const GOOD: &str = r#"version: 1
project: demo
image:
  locks: [flake.lock]
batches:
  cpu:
    description: CPU-only unit tests
    gpus: 0
    timeout: 15m
    run: ["pytest -q tests/cpu"]
  "4a":
    gpus: 1
    timeout: 30m
    run: ["pytest -q tests/fp8"]
layers:
  "1": {batches: [cpu]}
  "3": {batches: all, fast: false}
"#;

#[test]
fn help_lists_every_spec_command() {
    let r = run(cibox(std::env::temp_dir().as_path()).arg("--help"));
    r.ok();
    for cmd in [
        "image",
        "doctor",
        "gpu",
        "batch",
        "layer",
        "cleanup",
        "capacity",
        "changed",
        "workflow",
        "reproduce",
    ] {
        assert!(r.stdout.contains(cmd), "--help lacks {cmd}:\n{}", r.stdout);
    }
    let r = run(cibox(std::env::temp_dir().as_path()).args(["image", "--help"]));
    for cmd in ["lockset", "verify", "load", "build", "qualify", "save"] {
        assert!(r.stdout.contains(cmd), "image --help lacks {cmd}");
    }
}

#[test]
fn bad_flag_is_one_line_exit_2() {
    let p = Project::new(GOOD);
    let r = p.cibox(&["batch", "list", "--frobnicate"]);
    r.fails_with(2, "--frobnicate");
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
}

#[test]
fn errors_are_json_under_json() {
    let p = Project::new(GOOD);
    // A flag that does not parse: `--json` was still asked for.
    let r = p.cibox(&["--json", "batch", "list", "--frobnicate"]);
    r.fails_with(2, "--frobnicate");
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["error"]["exit_code"], 2, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--frobnicate")
    );
    // A bad manifest.
    p.write("cibox.yaml", "version: 1\nproject: demo\nbatchez: {}\n");
    let r = p.cibox(&["batch", "list", "--json"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("batchez"),
        "{v}"
    );
    // Without --json, stdout stays empty.
    assert!(p.cibox(&["batch", "list"]).stdout.is_empty());
}

#[test]
fn batch_list_text_and_json() {
    let p = Project::new(GOOD);
    let r = p.cibox(&["batch", "list"]);
    r.ok();
    let rows = r.rows();
    for row in [
        "BATCH GPUS TIMEOUT DESCRIPTION",
        "cpu 0 15m CPU-only unit tests",
        "4a 1 30m",
        "3 no all (cpu, 4a)",
    ] {
        assert!(
            rows.iter().any(|r| r == row),
            "no row `{row}` in:\n{}",
            r.stdout
        );
    }
    let r = p.cibox(&["batch", "list", "--json"]);
    r.ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["batches"][1]["name"], "4a");
    assert_eq!(v["batches"][1]["gpus"], 1);
    assert_eq!(v["batches"][1]["timeout_s"], 1800);
    assert_eq!(v["layers"][1]["batches"], serde_json::json!(["cpu", "4a"]));
}

#[test]
fn batch_list_takes_batches_and_families_by_name() {
    let p = Project::new(&GOOD.replace(
        "layers:",
        "  suite:\n    gpus: 2\n    timeout: 1h\n    description: the suite\n    run: [\"pytest $CIBOX_TEST_FILE\"]\n    each:\n      - {file: tests/test_a.py}\n      - {file: tests/b.py, name: b-slow, gpus: 8}\nlayers:",
    ));
    let r = p.cibox(&["batch", "list", "suite"]);
    r.ok();
    assert_eq!(
        r.rows(),
        [
            "BATCH GPUS TIMEOUT DESCRIPTION",
            "suite-test_a 2 1h the suite",
            "b-slow 8 1h the suite",
        ],
        "{}",
        r.stdout
    );
    // Names and families together, each batch once, in manifest order; no layers.
    let r = p.cibox(&["batch", "list", "b-slow", "cpu", "suite", "--json"]);
    r.ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let names: Vec<&str> = v["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cpu", "suite-test_a", "b-slow"], "{v}");
    assert_eq!(v["layers"], serde_json::json!([]), "{v}");
    assert_eq!(v["batches"][0]["family"], serde_json::Value::Null, "{v}");
    assert_eq!(v["batches"][0]["test_file"], serde_json::Value::Null, "{v}");
    assert_eq!(v["batches"][2]["family"], "suite", "{v}");
    assert_eq!(v["batches"][2]["test_file"], "tests/b.py", "{v}");
    // Every batch says its family in the full listing too.
    let r = p.cibox(&["batch", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.ok().stdout).unwrap();
    assert_eq!(v["batches"][2]["family"], "suite", "{v}");
    assert_eq!(v["batches"][2]["test_file"], "tests/test_a.py", "{v}");
    p.cibox(&["batch", "list", "suit"])
        .fails_with(2, "unknown batch `suit`; did you mean `suite`?");
}

#[test]
fn manifest_found_upwards_and_by_env() {
    let p = Project::new(GOOD);
    std::fs::create_dir_all(p.path().join("a/b")).unwrap();
    run(cibox(&p.path().join("a/b")).args(["batch", "list"])).ok();
    let elsewhere = tempfile::tempdir().unwrap();
    run(cibox(elsewhere.path())
        .env("CIBOX_MANIFEST", p.path().join("cibox.yaml"))
        .args(["batch", "list"]))
    .ok();
}

#[test]
fn no_manifest_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(".git")).unwrap();
    run(cibox(dir.path()).args(["batch", "list"])).fails_with(2, "no cibox.yaml");
}

fn bad(manifest: &str, needle: &str) {
    let p = Project::new(manifest);
    let r = p.cibox(&["batch", "list"]);
    r.fails_with(2, needle);
    assert!(r.stdout.is_empty(), "nothing on stdout: {}", r.stdout);
}

#[test]
fn manifest_syntax_error_names_line() {
    bad(&GOOD.replace("layers:", "layers: [oops"), "cibox.yaml:");
    bad(&GOOD.replace("layers:", "layers: [oops"), "YAML syntax");
}

#[test]
fn manifest_unknown_key_suggests() {
    bad(
        &GOOD.replace("    timeout: 30m", "    timout: 30m"),
        "cibox.yaml:13:5: batches.4a.timout: unknown key `timout`; did you mean `timeout`?",
    );
}

#[test]
fn manifest_wrong_type() {
    bad(
        &GOOD.replace("gpus: 1", "gpus: [1]"),
        "batches.4a.gpus: wrong type",
    );
    bad(
        &GOOD.replace("gpus: 1", "gpus: -2"),
        "batches.4a.gpus: must be 0 or more, got -2",
    );
}

#[test]
fn manifest_duplicate_batch() {
    bad(
        &GOOD.replace(
            "layers:",
            "  cpu:\n    gpus: 0\n    timeout: 1m\n    run: [x]\nlayers:",
        ),
        "duplicate key `cpu` (first defined at line 6)",
    );
}

#[test]
fn manifest_semantic_errors() {
    bad(
        &GOOD.replace("[cpu]", "[gpu]"),
        "layers.1.batches.0: batch `gpu` is not defined",
    );
    bad(
        &GOOD.replace("15m", "15"),
        "batches.cpu.timeout: bad duration `15`",
    );
    bad(
        &GOOD.replace("project: demo", "project: My Project"),
        "project: `My Project` is not a valid project name",
    );
    bad(
        &GOOD.replace("version: 1", "version: 2"),
        "version 2 is not supported",
    );
    bad(
        &format!("{GOOD}container: {{memory: 8 gigs}}\n"),
        "container.memory: bad size",
    );
    bad(
        &format!("{GOOD}container: {{network: brige}}\n"),
        "did you mean `bridge`?",
    );
    bad("", "the manifest is empty");
}

#[test]
fn bad_env_override_names_variable() {
    let p = Project::new(GOOD);
    run(cibox(p.path())
        .env("CIBOX_GPU_POOL", "0,zero")
        .args(["batch", "list"]))
    .fails_with(2, "CIBOX_GPU_POOL: `zero` is neither a GPU index");
}

#[test]
fn version_names_the_commit_and_completions_and_the_manual_are_generated() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(cibox(dir.path()).arg("--version"));
    r.ok();
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert!(
        r.stdout.starts_with("cibox ") && r.stdout.contains(&format!("(commit {head}")),
        "{} (HEAD {head})",
        r.stdout
    );
    for shell in ["bash", "zsh", "fish"] {
        let r = run(cibox(dir.path()).args(["completions", shell]));
        r.ok();
        assert!(
            r.stdout.contains("batch") && r.stdout.contains("image"),
            "{shell}"
        );
    }
    let r = run(cibox(dir.path()).arg("man"));
    r.ok();
    assert!(
        r.stdout.starts_with(".ie") || r.stdout.contains(".TH cibox 1"),
        "{}",
        &r.stdout[..200.min(r.stdout.len())]
    );
    // Every page the manual names is one `--dir` writes.
    let pages = tempfile::tempdir().unwrap();
    run(cibox(dir.path()).args(["man", "--dir"]).arg(pages.path())).ok();
    let top = std::fs::read_to_string(pages.path().join("cibox.1")).unwrap();
    let named = regex::Regex::new(r"(cibox(?:\\-[a-z]+)+)\(1\)").unwrap();
    let mut seen = 0;
    for c in named.captures_iter(&top) {
        let page = c[1].replace("\\-", "-") + ".1";
        assert!(
            pages.path().join(&page).exists(),
            "{page} is named but not written"
        );
        seen += 1;
    }
    assert!(seen > 5, "{top}");
    assert!(pages.path().join("cibox-batch-run.1").exists());
    run(cibox(dir.path()).args(["completions", "tcsh"])).fails_with(2, "tcsh");
}

#[test]
fn the_gpus_a_batch_sees_are_not_the_manifests_to_set() {
    // Which GPUs a batch sees is its lease's (the UUIDs cibox sets, or none): a manifest
    // that sets or passes CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES is refused with
    // the position, wherever it says so.
    let gpu = "  \"4a\":\n    gpus: 1\n";
    for (with, needle) in [
        (
            GOOD.replace(
                gpu,
                &format!("{gpu}    env: {{CUDA_VISIBLE_DEVICES: \"0\"}}\n"),
            ),
            "cibox.yaml:13:11: batches.4a.env.CUDA_VISIBLE_DEVICES: is cibox's to set",
        ),
        (
            GOOD.replace(
                gpu,
                &format!("{gpu}    fast_env: {{NVIDIA_VISIBLE_DEVICES: all}}\n"),
            ),
            "batches.4a.fast_env.NVIDIA_VISIBLE_DEVICES: is cibox's to set",
        ),
        (
            format!("{GOOD}container: {{env: {{CUDA_VISIBLE_DEVICES: \"\"}}}}\n"),
            "container.env.CUDA_VISIBLE_DEVICES: is cibox's to set",
        ),
        (
            GOOD.replace(
                gpu,
                &format!("{gpu}    container: {{pass_env: [HOME_X, CUDA_VISIBLE_DEVICES]}}\n"),
            ),
            "batches.4a.container.pass_env.1: `CUDA_VISIBLE_DEVICES` is cibox's to set",
        ),
    ] {
        bad(&with, needle);
    }
}

#[test]
fn ulimits_no_kernel_can_set_are_refused_with_the_manifest() {
    // Open files are capped by fs.nr_open, which is never unlimited and at most
    // 2147483584: asking more is known to fail before any engine is asked.
    bad(
        &format!("{GOOD}container: {{ulimits: {{nofile: unlimited}}}}\n"),
        "container.ulimits.nofile: open files cannot be unlimited",
    );
    bad(
        &format!("{GOOD}container: {{ulimits: {{nofile: {{soft: 1024, hard: 4294967296}}}}}}\n"),
        "container.ulimits.nofile: 4294967296 is more open files than any kernel allows",
    );
}

#[test]
fn a_mistyped_flag_gets_clap_s_suggestion_and_colour_only_where_asked() {
    let p = Project::new(GOOD);
    run(cibox(p.path()).args(["batch", "run", "cpu", "--imgae", "x"])).fails_with(
        2,
        "unexpected argument '--imgae' found; a similar argument exists: '--image'",
    );
    // No colour when stderr is no terminal (here), nor with NO_COLOR; forced, it has it.
    let plain = run(cibox(p.path()).args(["batch", "run", "nosuch"]));
    assert!(!plain.stderr.contains('\x1b'), "{:?}", plain.stderr);
    let forced = run(cibox(p.path())
        .env("CLICOLOR_FORCE", "1")
        .args(["batch", "run", "nosuch"]));
    assert!(forced.stderr.contains(RED_ERROR), "{:?}", forced.stderr);
}

/// `error:` as cibox paints it: bold red.
const RED_ERROR: &str = "\x1b[1m\x1b[31merror:\x1b[0m";

/// What cibox writes on stderr when that is a terminal (a pseudo-terminal, as in tmux),
/// with `env` set and `TERM=xterm` unless `env` says otherwise.
fn stderr_on_a_terminal(dir: &std::path::Path, env: &[(&str, &str)], args: &[&str]) -> String {
    use std::io::Read;
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let mut cmd = cibox(dir);
    cmd.env_remove("NO_COLOR")
        .env_remove("CLICOLOR")
        .env_remove("CLICOLOR_FORCE")
        .env("TERM", "xterm")
        .envs(env.iter().copied())
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::from(pty.slave));
    cmd.status().expect("run cibox");
    // The command keeps its copy of the terminal's other end until it is replaced:
    // then reading ends (EIO) once what cibox wrote is read.
    cmd.stderr(std::process::Stdio::null());
    let mut master = std::fs::File::from(pty.master);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = master.read(&mut buf) {
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn colour_on_a_terminal_follows_term_no_color_clicolor_and_clicolor_force() {
    let p = Project::new(GOOD);
    let args = ["batch", "run", "nosuch"];
    let on_terminal = |env: &[(&str, &str)]| stderr_on_a_terminal(p.path(), env, &args);
    let coloured = on_terminal(&[]);
    assert!(coloured.contains(RED_ERROR), "{coloured:?}");
    assert!(!coloured.contains("\\u{1b}"), "{coloured:?}");
    for off in [
        &[("NO_COLOR", "1")][..],
        &[("TERM", "dumb")],
        &[("CLICOLOR", "0")],
        &[("CLICOLOR_FORCE", "0"), ("NO_COLOR", "1")],
    ] {
        let plain = on_terminal(off);
        assert!(plain.contains("error:"), "{off:?}: {plain:?}");
        assert!(!plain.contains('\x1b'), "{off:?}: {plain:?}");
    }
    // Set but empty is unset (no-color.org); CLICOLOR_FORCE forces it even over NO_COLOR.
    for on in [
        &[("NO_COLOR", "")][..],
        &[("NO_COLOR", "1"), ("CLICOLOR_FORCE", "1")],
        &[("CLICOLOR", "1")],
    ] {
        let coloured = on_terminal(on);
        assert!(coloured.contains(RED_ERROR), "{on:?}: {coloured:?}");
    }
}

#[test]
fn a_mistyped_subcommand_gets_a_suggestion_and_help_says_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    run(cibox(dir.path()).args(["batch", "rnu"]))
        .fails_with(2, "a similar subcommand exists: 'run'");
    run(cibox(dir.path()).args(["imgae", "build"]))
        .fails_with(2, "a similar subcommand exists: 'image'");
    let r = run(cibox(dir.path()).args(["batch", "run", "--help"]));
    r.ok();
    assert!(r.stdout.contains("default: cibox-reports"), "{}", r.stdout);
    assert!(
        r.stdout.contains("default: the manifest's gpu.wait"),
        "{}",
        r.stdout
    );
}

#[test]
fn a_git_checkout_without_a_git_to_ask_is_refused_naming_git() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(".git")).unwrap();
    std::fs::write(
        dir.path().join("cibox.yaml"),
        "version: 1\nproject: p\nimage: {locks: [cibox.yaml]}\nbatches:\n  a: {gpus: 0, timeout: 1m, run: [\"true\"]}\n",
    )
    .unwrap();
    let r = run(cibox(dir.path())
        .args(["batch", "run", "a", "--source", ".", "--image"])
        .arg(format!("sha256:{}", "0".repeat(64)))
        .env("PATH", "/nonexistent"));
    r.fails_with(2, "is a git checkout (it holds .git), and cannot run git");
    assert!(!r.stderr.contains("is not a git checkout"), "{}", r.stderr);
    assert!(!dir.path().join("cibox-reports").exists());
}

#[test]
fn what_this_host_cannot_give_a_batch_is_refused_at_its_line() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(".git")).unwrap();
    let manifest = |batch: &str| {
        std::fs::write(
            dir.path().join("cibox.yaml"),
            format!(
                "version: 1\nproject: p\nimage: {{locks: [cibox.yaml]}}\nbatches:\n  a:\n    gpus: 0\n    timeout: 1m\n    run: [\"true\"]\n{batch}"
            ),
        )
        .unwrap();
    };
    let image = format!("sha256:{}", "0".repeat(64));
    manifest(&format!("    container: {{cpus: {}}}\n", cpus * 4));
    let r = run(cibox(dir.path()).args(["batch", "run", "a", "--source", ".", "--image", &image]));
    r.fails_with(2, "cibox.yaml:9:23: batch a: container.cpus is");
    r.fails_with(2, "the engine would refuse its container; ask for at most");
    manifest("    nodes: 2\n    container: {network: host}\n");
    let policy = HostPolicyFile::new("version: 1\ngrants: {network: [host]}\n");
    let r = run(cibox(dir.path())
        .args(["batch", "run", "a", "--source", ".", "--image", &image])
        .env("CIBOX_HOST_POLICY", policy.path()));
    r.fails_with(
        2,
        "cibox.yaml:9:12: batch a asks for 2 nodes, and this host runs batches itself",
    );
    assert!(!dir.path().join("cibox-reports").exists());
}

/// The build script does not watch git's index (a `git status` rewrote it and recompiled
/// the crate), and watches only paths that exist (cargo reruns a script on every build
/// while one it watches is missing, as `.git/HEAD` is in a worktree).
#[test]
fn the_build_script_watches_the_commit_not_gits_index() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/it-… → target/<profile>/build/cibox-*/output
    let build = exe.parent().unwrap().parent().unwrap().join("build");
    let newest = std::fs::read_dir(&build)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", build.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("cibox-"))
        .map(|e| e.path().join("output"))
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("no build script output under {}", build.display()));
    let output = std::fs::read_to_string(&newest).unwrap();
    let watched: Vec<&str> = output
        .lines()
        .filter_map(|l| l.strip_prefix("cargo:rerun-if-changed="))
        .collect();
    assert!(watched.iter().any(|w| w.ends_with("HEAD")), "{output}");
    assert!(watched.contains(&"src"), "{output}");
    for w in &watched {
        assert!(
            !w.ends_with("index"),
            "the build script watches git's index: {output}"
        );
        assert!(
            root.join(w).exists(),
            "the build script watches {w}, which is missing"
        );
    }
}

/// A bad image ID from the environment is refused naming the variable it came from.
#[test]
fn a_bad_cibox_image_is_refused_naming_the_variable() {
    let p = Project::new(GOOD);
    for args in [&["batch", "run", "cpu"][..], &["image", "verify"][..]] {
        let r = run(cibox(p.path()).env("CIBOX_IMAGE", "latest").args(args));
        r.fails_with(3, "`latest` is a tag or name, not an image ID");
        assert!(
            r.stderr.contains("(from CIBOX_IMAGE)"),
            "{args:?}: {}",
            r.stderr
        );
    }
    let r = run(cibox(p.path()).args(["batch", "run", "cpu", "--image", "latest"]));
    assert!(r.stderr.contains("(from --image)"), "{}", r.stderr);
}
