//! What another local user can plant in the shared lock dir, and hostile manifests:
//! cibox refuses with one line and exit 2, never follows, never hangs past `--wait`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

/// Runs `cmd`, failing the test if it has not ended within `secs` (a hang detector:
/// the bound is far above what the command is allowed to take).
fn run_within(cmd: &mut std::process::Command, secs: u64) -> Run {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "cibox hung for {secs} s; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
}

fn must_be_root() {
    assert!(
        nix::unistd::getuid().is_root(),
        "this test plants files as another user and must run as root (CI does)"
    );
}

#[test]
fn a_lock_dir_made_by_another_user_is_refused() {
    must_be_root();
    let h = GpuHost::new(1);
    let dir = h.locks.path().join("planted");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    nix::unistd::chown(&dir, Some(65534.into()), Some(65534.into())).unwrap();
    let r = run(h
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_GPU_LOCK_DIR", &dir));
    r.fails_with(2, "is owned by uid 65534 (nobody)");
    // Nothing was made in it.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    // A symlink to a trusted folder is refused as well, and so is a folder anyone may
    // write without the sticky bit.
    let link = h.locks.path().join("link");
    std::os::unix::fs::symlink(h.locks.path(), &link).unwrap();
    run(h
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_GPU_LOCK_DIR", &link))
    .fails_with(2, "is a symbolic link");
    let open = h.locks.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    run(h
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_GPU_LOCK_DIR", &open))
    .fails_with(2, "not sticky");
}

#[test]
fn a_symlink_planted_as_a_lock_file_is_never_followed() {
    must_be_root();
    let h = GpuHost::new(1);
    // The lock dir exists (a first run made it); then someone plants a link.
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
    let victim = h.work.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let lock = h.locks.path().join(format!("{}.lock", uuid(0)));
    std::fs::remove_file(&lock).unwrap();
    std::os::unix::fs::symlink(&victim, &lock).unwrap();
    let r = run_within(
        &mut h.cmd(&["gpu", "exec", "--count", "1", "--wait", "2s", "--", "true"]),
        30,
    );
    r.fails_with(2, "is a symbolic link");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    // A dangling one does not spin either.
    std::fs::remove_file(&lock).unwrap();
    std::os::unix::fs::symlink(h.work.path().join("nowhere"), &lock).unwrap();
    run_within(
        &mut h.cmd(&["gpu", "exec", "--count", "1", "--wait", "2s", "--", "true"]),
        30,
    )
    .fails_with(2, "is a symbolic link");
    assert!(!h.work.path().join("nowhere").exists());
}

#[test]
fn fifos_planted_in_the_lock_dir_do_not_block() {
    must_be_root();
    let h = GpuHost::new(1);
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
    let lock = h.locks.path().join(format!("{}.lock", uuid(0)));
    std::fs::remove_file(&lock).unwrap();
    mkfifo(&lock);
    run_within(
        &mut h.cmd(&["gpu", "exec", "--count", "1", "--wait", "2s", "--", "true"]),
        30,
    )
    .fails_with(2, "not a plain file");
    // gpu status reads lease states: it must not block on the FIFO either.
    let r = run_within(&mut h.cmd(&["gpu", "status"]), 30);
    assert_ne!(r.code, 0, "a planted FIFO is no lease state:\n{}", r.stderr);
    std::fs::remove_file(&lock).unwrap();
    let seq = h.locks.path().join("queue.seq");
    std::fs::remove_file(&seq).unwrap();
    mkfifo(&seq);
    run_within(
        &mut h.cmd(&["gpu", "exec", "--count", "1", "--wait", "2s", "--", "true"]),
        30,
    )
    .fails_with(2, "not a plain file");
}

#[test]
fn a_held_decision_lock_bounds_the_wait_and_yields_to_signals() {
    let h = GpuHost::new(1);
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
    // Another process holds select.lock and never lets go.
    let select = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(h.locks.path().join("select.lock"))
        .unwrap();
    select.lock().unwrap();
    run_within(
        &mut h.cmd(&["gpu", "exec", "--count", "1", "--wait", "1s", "--", "true"]),
        20,
    )
    .fails_with(
        4,
        &format!(
            "select.lock in {} stays locked by pid {}",
            h.locks.path().display(),
            std::process::id()
        ),
    );
    // SIGTERM while it waits for that lock ends it with 143.
    let child = h
        .cmd(&["gpu", "exec", "--count", "1", "--wait", "60s", "--", "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut child = child;
    assert!(
        wait_until(20, || child.try_wait().unwrap().is_some()),
        "cibox ignored SIGTERM while waiting for select.lock"
    );
    assert_eq!(child.wait().unwrap().code(), Some(143));
    drop(select);
}

/// `PROGRAM ARGS` as user nobody, in `h`'s work folder (made reachable for it).
fn as_nobody(h: &GpuHost, program: &Path, args: &[&str]) -> std::process::Command {
    for d in [h.locks.path(), h.smi.state.path(), h.work.path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut c = std::process::Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(program)
        .args(args)
        .current_dir(h.work.path());
    c
}

#[test]
fn a_decision_lock_held_by_another_users_orphan_names_its_holder() {
    must_be_root();
    let h = GpuHost::new(1);
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
    // Another user locks select.lock (anyone may open it where `host setup` has not
    // run), hands it to a child and exits: the kernel's table names only the exited pid.
    let select = h.locks.path().join("select.lock");
    let script = format!(
        "import fcntl, os, time\nf = open({:?})\nfcntl.flock(f, fcntl.LOCK_EX)\npid = os.fork()\nif pid:\n    print(os.getpid(), pid, flush=True)\n    os._exit(0)\nos.close(1)\nos.close(2)\ntime.sleep(60)\n",
        select.display().to_string()
    );
    let out = as_nobody(&h, Path::new("/usr/bin/python3"), &["-c", &script])
        .output()
        .unwrap();
    let pids = String::from_utf8(out.stdout).unwrap();
    let (parent, child) = pids.trim().split_once(' ').expect("two pids");
    let r = run_within(
        &mut h.cmd(&["gpu", "exec", "--count", "1", "--wait", "1s", "--", "true"]),
        20,
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.parse().unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    );
    r.fails_with(
        4,
        &format!(
            "select.lock in {} stays locked by pid {child} (uid 65534 (nobody)), which inherited it from pid {parent} (exited)",
            h.locks.path().display()
        ),
    );
}

#[test]
fn after_host_setup_only_root_can_hold_the_decision_lock_and_everyone_leases() {
    use std::os::unix::fs::MetadataExt;
    must_be_root();
    let h = GpuHost::new(1);
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
    let select = h.locks.path().join("select.lock");
    assert_eq!(std::fs::metadata(&select).unwrap().mode() & 0o777, 0o666);
    let dir = h.locks.path().display().to_string();
    h.run(&["host", "setup", "--lock-dir", &dir]).ok();
    let md = std::fs::metadata(&select).unwrap();
    assert_eq!(
        (md.uid(), md.mode() & 0o777),
        (0, 0o600),
        "select.lock after setup"
    );
    // Nobody else can open it, so nobody else can hold it ...
    let r = run(&mut as_nobody(
        &h,
        Path::new("/bin/sh"),
        &["-c", &format!("exec 3< {}", select.display())],
    ));
    assert!(
        r.code != 0 && r.stderr.contains("Permission denied"),
        "another user opened select.lock: {}",
        r.stderr
    );
    // ... and another user still leases (deciding without it), as root does with it.
    let bin = h.work.path().join("cibox");
    let smi = h.work.path().join("nvidia-smi");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::copy(FakeSmi::program(), &smi).unwrap();
    let mut c = as_nobody(&h, &bin, &["gpu", "exec", "--count", "1", "--", "id", "-u"]);
    c.env("CIBOX_NVIDIA_SMI", &smi)
        .env("CIBOX_FAKE_SMI_STATE", h.smi.state.path())
        .env("CIBOX_GPU_LOCK_DIR", h.locks.path());
    let r = run(&mut c);
    r.ok();
    assert_eq!(r.stdout.trim(), "65534");
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
}

#[test]
fn manifest_aliases_and_nesting_are_bounded() {
    // A few hundred bytes that would expand to 2^30 values.
    let mut text = String::from("version: 1\nproject: p\nx0: &a0 [x, x]\n");
    for i in 1..30 {
        text.push_str(&format!("x{i}: &a{i} [*a{p}, *a{p}]\n", p = i - 1));
    }
    let p = Project::new(&text);
    let r = run_within(&mut p_cmd(&p, &["batch", "list"]), 30);
    r.fails_with(2, "too large");
    // 50,000 levels of nesting: one line and exit 2, not a stack overflow.
    let deep = format!(
        "version: 1\nproject: {}{}\n",
        "[".repeat(50_000),
        "]".repeat(50_000)
    );
    let p = Project::new(&deep);
    run_within(&mut p_cmd(&p, &["batch", "list"]), 30).fails_with(2, "cibox.yaml");
}

/// Runs `cibox ARGS` in `p` with at most `mib` MiB of address space (and at most 60 s):
/// a bomb that would need gigabytes aborts there rather than taking the host's memory.
fn within_memory(p: &Project, args: &[&str], mib: u64) -> Run {
    use std::os::unix::process::CommandExt;
    let mut c = p_cmd(p, args);
    let limit = nix::libc::rlimit {
        rlim_cur: mib << 20,
        rlim_max: mib << 20,
    };
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(move || {
            if nix::libc::setrlimit(nix::libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    run_within(&mut c, 60)
}

#[test]
fn manifest_and_template_bombs_are_refused_within_bounded_memory() {
    const MIB: u64 = 1024;
    // A 3 MiB default under a test list of 3,000 entries: 9 GiB once laid into each.
    let big = "x".repeat(3 << 20);
    let entries: String = (0..3000)
        .map(|i| format!("      - {{file: tests/t{i}.py}}\n"))
        .collect();
    let p = Project::new(&format!(
        "version: 1\nproject: p\nimage: {{locks: [x]}}\ndefaults:\n  timeout: 1m\n  env: {{BIG: \"{big}\"}}\nbatches:\n  fam:\n    gpus: 0\n    run: [x]\n    each:\n{entries}"
    ));
    let r = within_memory(&p, &["batch", "list"], MIB);
    r.fails_with(
        2,
        "cibox.yaml:8:3: batches.fam: laid into its batches, the manifest comes to 8.8 GiB of text",
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    // 2,500 layers of `all` over 10,000 batches: 25 million names.
    let mut text = String::from(
        "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1m, gpus: 0, run: [x]}\nbatches:\n",
    );
    for i in 0..10_000 {
        text.push_str(&format!("  b{i}: {{}}\n"));
    }
    text.push_str("layers:\n");
    for i in 0..2500 {
        text.push_str(&format!("  l{i}: {{batches: all}}\n"));
    }
    let p = Project::new(&text);
    within_memory(&p, &["batch", "list"], MIB).fails_with(
        2,
        "layers.l100.batches: the layers up to this one name 1010000 batches",
    );
    // A committed output beside its template of 48 million lines (96 MiB): `--check`
    // neither reads nor diffs it all.
    let p = Project::new(
        "version: 1\nproject: p\nimage: {locks: [x]}\nbatches:\n  b: {gpus: 0, timeout: 1m, run: [x]}\n",
    );
    p.write(".github/workflows/w.yml.j2", "on: push\njobs: {}\n");
    p.write(".github/workflows/w.yml", "a\n".repeat(48 << 20));
    let r = within_memory(&p, &["workflow", "render", "--check"], MIB);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stdout
            .contains("-(larger than 1 MiB, the most a render writes: not shown)"),
        "{}",
        r.stdout
    );
    // Templates: a loop of 10^10 steps, one printing a 1 MB string a million times, and
    // one doubling a value forty times. Each refused, nothing written.
    let meta = "x".repeat(1 << 20);
    let p = Project::new(&format!(
        "version: 1\nproject: p\nimage: {{locks: [x]}}\nbatches:\n  b: {{gpus: 0, timeout: 1m, run: [x], meta: {{big: \"{meta}\"}}}}\n"
    ));
    let big = "<< batches[0].meta.big >>";
    for (template, want) in [
        (
            "<% for a in range(100000) %><% for b in range(100000) %><% endfor %><% endfor %>".to_string(),
            "loop.yml.j2: ran out of its instruction budget",
        ),
        (
            format!("<% for c in batches[0].meta.big %>{big}<% endfor %>"),
            "loop.yml.j2: rendered output over 1 MiB",
        ),
        (
            "<% set ns = namespace(x=batches[0].meta.big) %><% for i in range(40) %><% set ns.x = ns.x ~ ns.x %><% endfor %>".to_string(),
            "loop.yml.j2: ran out of its instruction budget",
        ),
        // A list doubled with `+`: minijinja charges no fuel for it; the render's own
        // process runs out of what it may use (issue 33, second attack).
        (
            "<% set ns = namespace(s=[1]) %><% for i in range(40) %><% set ns.s = ns.s + ns.s %><% endfor %>".to_string(),
            "loop.yml.j2: went over what a render may use",
        ),
    ] {
        p.write(".github/workflows/loop.yml.j2", format!("on: push\n{template}"));
        let r = within_memory(&p, &["workflow", "render"], MIB);
        r.fails_with(2, want);
        assert!(
            !p.path().join(".github/workflows/loop.yml").exists(),
            "a refused render wrote its output"
        );
    }
}

fn p_cmd(p: &Project, args: &[&str]) -> std::process::Command {
    let mut c = cibox(p.path());
    c.args(args);
    c
}

#[test]
fn what_a_pull_request_wrote_reaches_the_terminal_shown_not_sent() {
    // A description, and a committed workflow beside its template, holding a title
    // change (OSC 0), a clipboard write (OSC 52), an 8-bit CSI and an override.
    let p = Project::new(
        "version: 1\nproject: p\nimage: {locks: [x]}\nbatches:\n  b: {gpus: 0, timeout: 1m, run: [\"true\"], description: \"d\\e]0;pwned\\a\\e]52;c;Y3VybCBldmls\\a\\x9b2J\\u202e\"}\n",
    );
    p.write(".github/workflows/w.yml.j2", "on: push\njobs: {}\n");
    p.write(
        ".github/workflows/w.yml",
        "on: push\n# \u{1b}]52;c;Y3VybCBldmls\u{7}\u{9b}2J\u{202e}\njobs: {}\n",
    );
    let raw = |text: &str| -> Vec<char> {
        text.chars()
            .filter(|c| *c != '\n' && (c.is_control() || ('\u{202a}'..='\u{202e}').contains(c)))
            .collect()
    };
    for args in [
        &["batch", "list"][..],
        &["--json", "batch", "list"],
        &["workflow", "render", "--check"],
        &["--json", "workflow", "render", "--check"],
    ] {
        let r = p.cibox(args);
        assert!(r.code == 0 || r.code == 1, "{args:?}: {}", r.stderr);
        let found = raw(&format!("{}{}", r.stdout, r.stderr));
        assert!(found.is_empty(), "{args:?}: {found:?} in {:?}", r.stdout);
    }
    let r = p.cibox(&["batch", "list"]);
    assert!(
        r.stdout
            .contains("d\\u{1b}]0;pwned\\u{7}\\u{1b}]52;c;Y3VybCBldmls\\u{7}\\u{9b}2J\\u{202e}"),
        "{}",
        r.stdout
    );
    let v: serde_json::Value =
        serde_json::from_str(&p.cibox(&["--json", "batch", "list"]).stdout).unwrap();
    assert_eq!(
        v["batches"][0]["description"],
        "d\u{1b}]0;pwned\u{7}\u{1b}]52;c;Y3VybCBldmls\u{7}\u{9b}2J\u{202e}",
        "the JSON says what the manifest says"
    );
}

#[test]
fn values_quoted_in_errors_cannot_forge_lines_or_drive_the_terminal() {
    let p = Project::new(
        "version: 1\nproject: p\nimage: {locks: [x]}\nbatches:\n  \"a\\nb\\u001b[2J\": {gpus: 0, timeout: 1m, run: [\"true\"]}\n",
    );
    let r = p.cibox(&["batch", "list"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(!r.stderr.contains('\u{1b}'), "{:?}", r.stderr);
    assert_eq!(
        r.stderr.lines().count(),
        1,
        "one line, whatever the value holds: {:?}",
        r.stderr
    );
}

#[test]
fn the_batch_sees_the_checkout_without_git_credentials() {
    let p = busybox_project(
        "  peek:\n    gpus: 0\n    timeout: 1m\n    allow_empty: true\n    run: [\"cat /src/.git/config /src/.git/modules/sub/config > $CIBOX_REPORTS/config.txt; grep -rl SECRET /src/.git /src/deps/x/.git > $CIBOX_REPORTS/found.txt || true\"]\n",
        "",
    );
    let dir = p.project.path();
    git(dir, &["init", "-q"]);
    git(
        dir,
        &[
            "config",
            "http.https://github.com/.extraheader",
            "AUTHORIZATION: basic SECRETHEADER",
        ],
    );
    git(
        dir,
        &[
            "remote",
            "add",
            "origin",
            "https://x-access-token:SECRETTOKEN@github.com/o/r",
        ],
    );
    git(
        dir,
        &["config", "credential.helper", "store --file /SECRETPATH"],
    );
    let sub = dir.join(".git/modules/sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(
        sub.join("config"),
        "[core]\n\tbare = false\n[http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic SECRETSUB\n",
    )
    .unwrap();
    // A second checkout inside the source, as `actions/checkout` with `path:` makes.
    let nested = dir.join("deps/x");
    std::fs::create_dir_all(&nested).unwrap();
    git(&nested, &["init", "-q"]);
    git(
        &nested,
        &[
            "config",
            "http.https://github.com/.extraheader",
            "AUTHORIZATION: basic SECRETNESTED",
        ],
    );
    p.run(&["batch", "run", "peek"]).ok();
    let seen = std::fs::read_to_string(p.reports().join("peek/config.txt")).unwrap();
    assert!(!seen.contains("SECRET"), "the batch read:\n{seen}");
    assert!(seen.contains("https://github.com/o/r"), "{seen}");
    let found = std::fs::read_to_string(p.reports().join("peek/found.txt")).unwrap();
    assert!(
        found.trim().is_empty(),
        "credentials found under /src/.git: {found}"
    );
    // The checkout itself is untouched.
    let config = std::fs::read_to_string(dir.join(".git/config")).unwrap();
    assert!(config.contains("SECRETHEADER"));
}

#[test]
fn a_checkout_nested_deep_in_the_source_is_masked_too() {
    // A repository checked out five folders down (past the depth cibox used to look):
    // its .git/config token must not reach the batch either.
    let p = busybox_project(
        "  peek:\n    gpus: 0\n    timeout: 1m\n    allow_empty: true\n    run: [\"cat /src/a/b/c/d/e/.git/config > $CIBOX_REPORTS/config.txt\"]\n",
        "",
    );
    let nested = p.project.path().join("a/b/c/d/e");
    std::fs::create_dir_all(&nested).unwrap();
    git(&nested, &["init", "-q"]);
    git(
        &nested,
        &[
            "config",
            "http.https://github.com/.extraheader",
            "AUTHORIZATION: basic SECRETDEEP",
        ],
    );
    p.run(&["batch", "run", "peek"]).ok();
    let seen = std::fs::read_to_string(p.reports().join("peek/config.txt")).unwrap();
    assert!(!seen.contains("SECRETDEEP"), "the batch read:\n{seen}");
    assert!(seen.contains("[core]"), "{seen}");
}

/// What the bomb batch runs: 25,000 cases (beyond the 20,000 kept), a failing case
/// whose name tries to forge a summary row, and a 70 MB report (beyond the 64 MiB read
/// per file).
const JUNIT_BOMB: &str = r#"
i=0
{
  echo '<testsuite>'
  while [ $i -lt 25000 ]; do echo "<testcase classname='c' name='t$i'/>"; i=$((i+1)); done
  echo "<testcase classname='c' name='x&#10;| forged | row |'><failure message='boom'/></testcase>"
  echo '</testsuite>'
} > "$CIBOX_REPORTS/a.xml"
head -c 73400320 /dev/zero > "$CIBOX_REPORTS/big.xml"
"#;

#[test]
fn junit_bombs_and_forged_markdown_stay_bounded() {
    let p = busybox_project(
        "  bomb:\n    gpus: 0\n    timeout: 2m\n    run: [\"sh /src/bomb.sh\"]\n",
        "",
    );
    p.project.write("bomb.sh", JUNIT_BOMB);
    let r = p.run(&["batch", "run", "bomb"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let rec = p.result("bomb");
    assert_eq!(rec["tests"]["total"], 25001, "every case is counted");
    assert_eq!(rec["cases_left_out"], 5001);
    assert!(
        rec["message"].as_str().unwrap().contains("64 MiB"),
        "{}",
        rec["message"]
    );
    let summary = std::fs::read_to_string(p.reports().join("summary.md")).unwrap();
    assert!(!summary.contains("\n| forged | row |"), "{summary}");
    assert!(summary.len() < 600 * 1024);
    let junit = std::fs::metadata(p.reports().join("junit.xml"))
        .unwrap()
        .len();
    assert!(junit < 16 << 20, "merged junit.xml is {junit} bytes");
}

#[test]
fn a_list_where_a_mapping_belongs_is_refused() {
    let p = Project::new(
        "version: 1\nproject: p\nimage: {locks: [x]}\ncontainer: [0.5, 256m, 1g, 64, host]\nbatches:\n  a: {gpus: 0, timeout: 1m, run: [\"true\"]}\n",
    );
    p.cibox(&["batch", "list"])
        .fails_with(2, "`container` must be a mapping");
    let p = Project::new(
        "version: 1\nproject: p\nimage: {locks: [x]}\ncontainer: {cpus: 1e-10}\nbatches:\n  a: {gpus: 0, timeout: 1m, run: [\"true\"]}\n",
    );
    p.cibox(&["batch", "list"])
        .fails_with(2, "between 0.01 and 4096");
}

/// What a hostile batch leaves in its reports folder.
const LEAVINGS: &str = r#"
id -u > "$CIBOX_REPORTS/uid.txt"
cp /bin/busybox "$CIBOX_REPORTS/sh" && chmod 4755 "$CIBOX_REPORTS/sh"
ln -s / "$CIBOX_REPORTS/hostroot"
ln -s /etc/shadow "$CIBOX_REPORTS/x.xml"
mkfifo "$CIBOX_REPORTS/pipe"
mkdir "$CIBOX_REPORTS/shut" && echo '<testsuite/>' > "$CIBOX_REPORTS/shut/r.xml" && chmod 000 "$CIBOX_REPORTS/shut"
mkdir -p "$CIBOX_REPORTS/result.json/x" "$CIBOX_REPORTS/.result.json.partial"
"#;

#[test]
fn a_batch_is_never_host_root_and_its_leavings_are_cleaned() {
    must_be_root();
    let p = busybox_project(
        "  leave:\n    gpus: 0\n    timeout: 1m\n    allow_empty: true\n    run: [\"sh /src/leave.sh\"]\n  after:\n    gpus: 0\n    timeout: 1m\n    allow_empty: true\n    run: [\"true\"]\n",
        "",
    );
    p.project.write("leave.sh", LEAVINGS);
    let r = p.run(&["batch", "run", "leave", "after"]);
    assert_eq!(
        r.code, 0,
        "a folder named result.json stops nothing:\n{}",
        r.stderr
    );
    let dir = p.reports().join("leave");
    assert_eq!(
        std::fs::read_to_string(dir.join("uid.txt")).unwrap().trim(),
        "65534",
        "cibox runs as root here; its batch must not"
    );
    use std::os::unix::fs::MetadataExt;
    let mode = std::fs::metadata(dir.join("sh")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o755, "no setuid program is left on the host");
    for gone in ["hostroot", "x.xml", "pipe"] {
        assert!(
            std::fs::symlink_metadata(dir.join(gone)).is_err(),
            "{gone} is still there"
        );
    }
    assert_eq!(
        std::fs::metadata(dir.join("shut")).unwrap().mode() & 0o777,
        0o755
    );
    assert_eq!(p.result("leave")["status"], "passed");
    assert_eq!(p.result("after")["status"], "passed");
    assert!(p.reports().join("summary.md").exists());
    // The next run replaces the folder, whatever it held.
    p.run(&["batch", "run", "leave"]).ok();
}

#[test]
fn a_source_batches_cannot_read_is_refused_before_anything_runs() {
    must_be_root();
    let p = busybox_project(
        "  a:\n    gpus: 0\n    timeout: 1m\n    allow_empty: true\n    run: [\"true\"]\n",
        "",
    );
    let shut = p.project.path().join("shut-src");
    std::fs::create_dir(&shut).unwrap();
    std::fs::set_permissions(&shut, std::fs::Permissions::from_mode(0o700)).unwrap();
    let r = p.run(&["batch", "run", "a", "--source", &shut.display().to_string()]);
    r.fails_with(2, "cannot read the source");
    assert!(p.containers().is_empty(), "no container was made");
}

#[test]
fn a_stopped_waiter_does_not_freeze_the_queue() {
    let h = GpuHost::new(8);
    let holder = h
        .cmd(&["gpu", "exec", "--count", "8", "--", "sleep", "2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Leased and out of the queue (a hand-out keeps its ticket until its probe).
    assert!(wait_until(20, || h.leased().len() == 8 && h.queued() == 0));
    // The head of the queue waits for all 8 ... and is stopped (Ctrl-Z, SIGSTOP).
    let mut head = h
        .cmd(&[
            "gpu", "exec", "--count", "8", "--wait", "120s", "--", "true",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(20, || h.queued() == 1));
    let head_pid = nix::unistd::Pid::from_raw(head.id() as i32);
    nix::sys::signal::kill(head_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let mut holder = holder;
    assert!(holder.wait().unwrap().success());
    // All 8 are free; a 1-GPU request behind the stopped head still gets one.
    let r = run_within(
        &mut h.cmd(&["gpu", "exec", "--count", "1", "--wait", "60s", "--", "true"]),
        90,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The head keeps its place and, once resumed, gets its GPUs.
    nix::sys::signal::kill(head_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(wait_until(60, || head.try_wait().unwrap().is_some()));
    assert_eq!(head.wait().unwrap().code(), Some(0));
}

#[test]
fn an_engine_that_cannot_be_asked_fails_closed_when_a_run_died() {
    let h = GpuHost::new(2);
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
    // The record of a run whose cibox was killed: its containers may hold GPUs.
    std::fs::write(
        h.locks.path().join("runs/0123456789abcdef.lock"),
        r#"{"project":"p","scope":"s"}"#,
    )
    .unwrap();
    run(h
        .cmd(&["gpu", "exec", "--count", "1", "--wait", "1s", "--", "true"])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock"))
    .fails_with(5, "engine cannot be asked");
    run(h
        .cmd(&["gpu", "status"])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock"))
    .fails_with(5, "engine cannot be asked");
}

#[test]
fn another_users_word_in_runs_does_not_stop_gpu_exec() {
    must_be_root();
    let h = GpuHost::new(2);
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
    let no_engine = |args: &[&str]| {
        run(h
            .cmd(args)
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock"))
    };
    // Anyone can write into the 1777 runs/: a well-formed record of a "dead run" written
    // by nobody, and garbage (a run that died before it made any container).
    let planted = h.locks.path().join("runs/0123456789abcdef.lock");
    std::fs::write(&planted, r#"{"project":"p","scope":"s"}"#).unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    std::fs::write(h.locks.path().join("runs/fedcba9876543210.lock"), "garbage").unwrap();
    let r = no_engine(&["gpu", "exec", "--count", "1", "--wait", "1s", "--", "true"]);
    r.ok();
    assert!(
        r.stderr.contains("another user's record of a dead run") && r.stderr.lines().count() == 1,
        "one warning: {}",
        r.stderr
    );
    // The same record written by root (or by the caller) is more than a word: it fails
    // closed.
    std::os::unix::fs::chown(&planted, Some(0), Some(0)).unwrap();
    no_engine(&["gpu", "exec", "--count", "1", "--wait", "1s", "--", "true"])
        .fails_with(5, "engine cannot be asked");
}

#[test]
fn queue_and_runs_folders_made_by_another_user_are_refused_until_host_setup() {
    must_be_root();
    let h = GpuHost::new(1);
    let dir = h.locks.path().join("shared");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    // Another user ran cibox first: queue/ and runs/ are theirs (sticky, as cibox
    // makes them), so they could remove anyone's ticket or run record.
    for sub in ["queue", "runs"] {
        let p = dir.join(sub);
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777)).unwrap();
        nix::unistd::chown(&p, Some(65534.into()), Some(65534.into())).unwrap();
    }
    run(h
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_GPU_LOCK_DIR", &dir))
    .fails_with(
        2,
        "queue/ is owned by uid 65534 (nobody), not by root or the lock dir's owner",
    );
    // The one-time setup takes them over; then leases work.
    run(&mut h.cmd(&["host", "setup", "--lock-dir", &dir.display().to_string()])).ok();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(dir.join("queue")).unwrap().uid(), 0);
    run(h
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_GPU_LOCK_DIR", &dir))
    .ok();
}

#[test]
fn reports_are_collected_not_shared_and_what_a_batch_grows_is_capped() {
    must_be_root();
    let p = busybox_project(
        concat!(
            "  grow:\n    gpus: 0\n    timeout: 1m\n    allow_empty: true\n    run:\n",
            "      - \"touch $CIBOX_REPORTS/started; echo started; sleep 2\"\n",
            // /tmp and /work are capped by container.disk: these writes must fail.
            "      - \"! head -c 20000000 /dev/zero > /tmp/big\"\n",
            "      - \"! head -c 20000000 /dev/zero > /work/big\"\n",
            // /reports by container.reports_size: this one stops at the cap.
            "      - \"! head -c 20000000 /dev/zero > $CIBOX_REPORTS/big\"\n",
        ),
        "  disk: 8m\n  reports_size: 4m\n",
    );
    let mut child = p.spawn(&["batch", "run", "grow"]);
    let dir = p.reports().join("grow");
    assert!(wait_until(30, || std::fs::read_to_string(
        dir.join("log.txt")
    )
    .is_ok_and(|l| l.contains("started"))));
    // The batch writes its own /reports, not a host folder.
    assert!(
        !dir.join("started").exists(),
        "a file the batch is writing showed up on the host"
    );
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(&dir).unwrap();
    assert_eq!(
        (md.mode() & 0o7777, md.uid()),
        (0o755, 0),
        "cibox's own folder"
    );
    assert!(child.wait().unwrap().success());
    let result = p.result("grow");
    assert_eq!(result["status"], "passed", "{result}");
    assert_eq!(result["reports"]["files"], 2, "{result}");
    assert!(dir.join("started").is_file());
    let big = std::fs::metadata(dir.join("big")).unwrap().len();
    assert!(
        big > 0 && big <= 4 << 20,
        "{big} bytes came out of a 4m /reports"
    );
}

#[test]
fn a_planted_ticket_at_the_head_of_the_queue_freezes_nobody() {
    let h = GpuHost::new(2);
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
    // A ticket ahead of everyone, locked, kept alive, that is no request (and unreadable
    // to anyone but root).
    let planted = h
        .locks
        .path()
        .join("queue/00000000000000000001-00000000000000000000-1");
    std::fs::write(&planted, "not a request").unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o000)).unwrap();
    let ticket = std::fs::File::open(&planted).unwrap();
    ticket.lock().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beat = {
        let (stop, planted) = (stop.clone(), planted.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::File::options()
                    .write(true)
                    .open(&planted)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    let r = run_within(
        &mut h.cmd(&["gpu", "exec", "--count", "1", "--wait", "20s", "--", "true"]),
        40,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    beat.join().unwrap();
    drop(ticket);
    r.ok();
}

#[test]
fn a_well_formed_planted_ticket_freezes_nobody_either() {
    let h = GpuHost::new(2);
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
    // Tickets that read as requests, locked and kept alive, standing ahead of everyone:
    // one asks more than any pool could give; one claims to have arrived long before it
    // was made.
    let queue = h.locks.path().join("queue");
    let request = |need: usize| {
        format!(
            "{{\"need\":{need},\"pool\":[\"{}\",\"{}\"],\"devices\":null,\"holder\":{{\"pid\":1,\"host\":\"h\",\"user\":\"mallory\"}}}}",
            uuid(0),
            uuid(1)
        )
    };
    let mut held = Vec::new();
    for (name, need) in [
        ("00000000000000000001-00000000000000000000-1", 3),
        ("00000000000000000002-00000000000000000000-2", 1),
    ] {
        let path = queue.join(name);
        std::fs::write(&path, request(need)).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        f.lock().unwrap();
        held.push((path, f));
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beat = {
        let stop = stop.clone();
        let paths: Vec<_> = held.iter().map(|(p, _)| p.clone()).collect();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for p in &paths {
                    let _ = std::fs::File::options()
                        .write(true)
                        .open(p)
                        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    let r = run_within(
        &mut h.cmd(&["gpu", "exec", "--count", "1", "--wait", "20s", "--", "true"]),
        40,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    beat.join().unwrap();
    drop(held);
    r.ok();
}

#[test]
fn a_second_name_for_a_lock_file_stops_no_lease() {
    must_be_root();
    let h = GpuHost::new(1);
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
    let dir = h.locks.path().display().to_string();
    h.run(&["host", "setup", "--lock-dir", &dir]).ok();
    // Anyone may hard-link a file they may write, elsewhere: root's 0666 lock files too.
    let elsewhere = h.work.path().join("x");
    std::fs::hard_link(h.locks.path().join(format!("{}.lock", uuid(0))), &elsewhere).unwrap();
    std::fs::hard_link(h.locks.path().join("select.lock"), h.work.path().join("s")).unwrap();
    h.run(&["gpu", "exec", "--count", "1", "--", "true"]).ok();
}
