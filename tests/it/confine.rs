//! `gpu exec` confinement: every process of a workload dies with its cibox, whatever it
//! does (fork, `setsid`, closing its descriptors), and the GPUs are free only once none
//! is left. Each test runs in the confinements this host gives: a PID namespace (as
//! root), one inside a user namespace (as `nobody`), and the subreaper (asked for).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::common::*;

#[derive(Debug, Clone, Copy)]
enum Mode {
    Root,
    Nobody,
    Subreaper,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Root, Mode::Nobody, Mode::Subreaper];

    /// What `-v` says the command runs confined by.
    fn confinement(self) -> &'static str {
        match self {
            Mode::Root => "pid-namespace",
            Mode::Nobody => "user-namespace",
            Mode::Subreaper => "subreaper",
        }
    }

    /// Numbers that make each mode's `sleep` workers unique on the host.
    fn tag(self, n: u32) -> String {
        let base = match self {
            Mode::Root => 710_000,
            Mode::Nobody => 720_000,
            Mode::Subreaper => 730_000,
        };
        (base + n).to_string()
    }
}

/// A GPU host whose lock dir, fake nvidia-smi and cibox binary user `nobody` can use too.
struct Host {
    h: GpuHost,
    locks: PathBuf,
    bin: PathBuf,
    smi: PathBuf,
}

impl Host {
    fn new(gpus: usize) -> Host {
        assert!(
            nix::unistd::getuid().is_root(),
            "the confinement tests switch to user nobody with setpriv and must run as root (CI does)"
        );
        let h = GpuHost::new(gpus);
        for d in [h.locks.path(), h.smi.state.path(), h.work.path()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let bin = h.work.path().join("cibox");
        let smi = h.work.path().join("nvidia-smi");
        std::fs::copy(BIN, &bin).unwrap();
        std::fs::copy(FakeSmi::program(), &smi).unwrap();
        let host = Host {
            locks: h.locks.path().join("shared"),
            h,
            bin,
            smi,
        };
        // root makes the shared lease dir (mode 1777) and the lock files, once, as a
        // host's admin would: only root's lock files are trusted.
        let dir = host.locks.display().to_string();
        run(&mut host.cmd(Mode::Root, &["host", "setup", "--lock-dir", &dir])).ok();
        run(&mut host.cmd(Mode::Root, &["gpu", "exec", "--count", "1", "--", "true"])).ok();
        host
    }

    fn cmd(&self, mode: Mode, args: &[&str]) -> Command {
        let mut c = match mode {
            Mode::Nobody => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                    .arg(&self.bin);
                c
            }
            Mode::Root | Mode::Subreaper => Command::new(&self.bin),
        };
        c.args(args)
            .env("CIBOX_NVIDIA_SMI", &self.smi)
            .env("CIBOX_FAKE_SMI_STATE", self.h.smi.state.path())
            .env("CIBOX_GPU_LOCK_DIR", &self.locks)
            .env("CIBOX_PROBE_TIMEOUT", "2s")
            .env_remove("CIBOX_CONFINE")
            .current_dir(self.h.work.path())
            .stdin(Stdio::null());
        if let Mode::Subreaper = mode {
            c.env("CIBOX_CONFINE", "subreaper");
        }
        c
    }

    /// `gpu exec` of `sh -c script` on `gpus` GPUs.
    fn exec(&self, mode: Mode, gpus: &str, script: &str) -> Command {
        self.cmd(
            mode,
            &["gpu", "exec", "--count", gpus, "--", "sh", "-c", script],
        )
    }

    /// Leases `gpus` GPUs as soon as they are free (up to 20 s) and reports whether any
    /// of `pids` still existed at that moment; run in the subreaper so it sees host PIDs.
    fn lease_finds_none_of(&self, gpus: usize, pids: &[i32]) -> Run {
        let list: Vec<String> = pids.iter().map(i32::to_string).collect();
        let check = format!(
            "for p in {}; do [ -e /proc/$p ] && echo alive $p && exit 9; done; exit 0",
            list.join(" ")
        );
        run(&mut self.cmd(
            Mode::Subreaper,
            &[
                "gpu",
                "exec",
                "--count",
                &gpus.to_string(),
                "--wait",
                "20s",
                "--",
                "sh",
                "-c",
                &check,
            ],
        ))
    }
}

/// A command whose workers cover every way out of a process group: a background
/// child, a worker in its own session with every inherited descriptor closed (as
/// Python's `subprocess` does by default), and the command itself; all `sleep`s tagged.
fn escaping_workload(mode: Mode, case: u32) -> (String, [String; 3]) {
    let tags = [1, 2, 3].map(|k| mode.tag(case * 10 + k));
    let script = format!(
        "sleep {} & /usr/bin/python3 -c 'import subprocess; subprocess.Popen([\"sleep\", \"{}\"], start_new_session=True, close_fds=True)'; exec sleep {}",
        tags[0], tags[1], tags[2]
    );
    (script, tags)
}

fn worker_pids(tags: &[String]) -> Option<Vec<i32>> {
    let mut pids = Vec::new();
    for t in tags {
        match pids_running(&["sleep", t]).as_slice() {
            [pid] => pids.push(*pid),
            _ => return None,
        }
    }
    Some(pids)
}

#[test]
fn sigkill_of_cibox_kills_every_worker_before_the_gpus_are_free() {
    let host = Host::new(2);
    for mode in Mode::ALL {
        let (script, tags) = escaping_workload(mode, 1);
        let log = host.h.work.path().join(format!("{mode:?}.stderr"));
        let mut cibox = host
            .cmd(
                mode,
                &[
                    "-v", "gpu", "exec", "--count", "2", "--", "sh", "-c", &script,
                ],
            )
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        assert!(
            wait_until(20, || worker_pids(&tags).is_some()),
            "{mode:?}: the workers did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let pids = worker_pids(&tags).unwrap();
        let said = std::fs::read_to_string(&log).unwrap();
        assert!(
            said.contains(&format!("runs confined by {}", mode.confinement())),
            "{mode:?}: not confined as expected: {said}"
        );
        // While they run, nobody else gets a GPU.
        run(&mut host.cmd(
            Mode::Root,
            &["gpu", "exec", "--count", "1", "--wait", "0s", "--", "true"],
        ))
        .fails_with(4, "could not lease");
        cibox.kill().unwrap();
        cibox.wait().unwrap();
        // The next lease comes only once every worker is gone.
        let next = host.lease_finds_none_of(2, &pids);
        assert_eq!(
            next.code, 0,
            "{mode:?}: the GPUs were free while a worker lived: {}{}",
            next.stdout, next.stderr
        );
        assert!(
            wait_until(20, || pids.iter().all(|p| !pid_alive(*p))),
            "{mode:?}: a worker outlived its cibox"
        );
    }
}

#[test]
fn workers_that_leave_the_group_are_gone_before_gpu_exec_returns() {
    let host = Host::new(1);
    for mode in Mode::ALL {
        let (script, tags) = escaping_workload(mode, 2);
        // The command itself exits 3 once its workers are started.
        let script = script.replace(&format!("exec sleep {}", tags[2]), "exit 3");
        let r = run(&mut host.exec(mode, "1", &script));
        assert_eq!(r.code, 3, "{mode:?}: {}", r.stderr);
        for t in &tags[..2] {
            assert!(
                pids_running(&["sleep", t]).is_empty(),
                "{mode:?}: worker `sleep {t}` outlived its gpu exec and its lease"
            );
        }
        let leased = run(&mut host.cmd(Mode::Root, &["gpu", "status", "--json"]));
        assert!(
            leased.stdout.contains("\"lease_holder\": null"),
            "{mode:?}: {}",
            leased.stdout
        );
    }
}

#[test]
fn a_worker_that_keeps_forking_cannot_outrun_the_kill() {
    // A fork loop in its own session: a look at the process tree is always one child
    // behind it, so the kill must go on until nothing is left.
    let host = Host::new(1);
    for mode in [Mode::Root, Mode::Subreaper] {
        let tag = mode.tag(90);
        let script = format!(
            "setsid sh -c 'while :; do sleep {tag} & sleep 0.003; done' & exec sleep {}",
            mode.tag(91)
        );
        let mut cibox = host.exec(mode, "1", &script).spawn().unwrap();
        assert!(wait_until(20, || pids_running(&["sleep", &tag]).len() > 10));
        cibox.kill().unwrap();
        cibox.wait().unwrap();
        let next = host.lease_finds_none_of(1, &[]);
        assert_eq!(next.code, 0, "{mode:?}: {}", next.stderr);
        assert!(
            pids_running(&["sleep", &tag]).is_empty(),
            "{mode:?}: the forker's children outlived the lease"
        );
    }
}

#[test]
fn signals_are_forwarded_to_every_worker_and_end_the_run_with_128_plus_n() {
    let host = Host::new(1);
    let cases = [
        (Mode::Root, nix::libc::SIGINT, 130),
        (Mode::Root, nix::libc::SIGTERM, 143),
        (Mode::Root, nix::libc::SIGHUP, 129),
        (Mode::Nobody, nix::libc::SIGTERM, 143),
        (Mode::Subreaper, nix::libc::SIGTERM, 143),
    ];
    for (i, (mode, sig, code)) in cases.into_iter().enumerate() {
        let (script, tags) = escaping_workload(mode, 3 + i as u32);
        let mut cibox = host.exec(mode, "1", &script).spawn().unwrap();
        assert!(wait_until(20, || worker_pids(&tags).is_some()), "{mode:?}");
        let pids = worker_pids(&tags).unwrap();
        unsafe { nix::libc::kill(cibox.id() as i32, sig) };
        let status = cibox.wait().unwrap();
        assert_eq!(status.code(), Some(code), "{mode:?}: signal {sig}");
        for p in pids {
            assert!(!pid_alive(p), "{mode:?}: worker {p} survived signal {sig}");
        }
    }
}

#[test]
fn a_bad_confinement_is_refused_with_exit_2_before_any_lease() {
    let host = Host::new(1);
    let r = run(host
        .cmd(Mode::Root, &["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_CONFINE", "jail\x1b[31m"));
    r.fails_with(
        2,
        "CIBOX_CONFINE: `jail\\u{1b}[31m` is not `auto` or `subreaper`",
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
}

#[test]
fn doctor_says_how_gpu_exec_confines() {
    let host = Host::new(1);
    for mode in Mode::ALL {
        let r = run(&mut host.cmd(mode, &["doctor"]));
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with("gpu exec confinement"))
            .unwrap_or_else(|| panic!("{mode:?}: no confinement line: {}", r.stdout))
            .to_string();
        assert!(line.contains(mode.confinement()), "{mode:?}: {line}");
        let status = if let Mode::Subreaper = mode {
            "warn"
        } else {
            "ok"
        };
        assert!(
            line.split_whitespace().nth(3) == Some(status),
            "{mode:?}: {line}"
        );
    }
}

/// Runs `command` from an interactive bash on a fresh pseudo-terminal, stops it with
/// Ctrl-Z once it printed `ready` (a cue its echoed text must not hold), continues it with `fg`, then types `hello`; returns
/// what the terminal showed (Python's `pty`; each step waits up to 20 s for its cue).
fn stopped_and_continued(command: &str) -> String {
    const DRIVER: &str = r#"
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp("bash", ["bash", "--norc", "--noprofile", "-i"])
seen = b""
def until(cue):
    global seen
    end = time.time() + 20
    while cue not in seen and time.time() < end:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    if cue not in seen:
        print("NO CUE", cue, seen.decode(errors="replace"))
        sys.exit(1)
os.write(fd, sys.argv[1].encode() + b"\n")
until(b"ready")
os.write(fd, b"\x1a")
until(b"Stopped")
os.write(fd, b"fg\n")
os.write(fd, b"hello\n")
until(b"got:hello")
os.write(fd, b"echo STATUS=$?; exit\n")
until(b"STATUS=3")
time.sleep(0.2)
print(seen.decode(errors="replace"))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(DRIVER)
        .arg(command)
        .output()
        .expect("python3 runs the terminal driver");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn ctrl_z_stops_the_job_and_fg_gives_the_command_its_terminal_back() {
    let host = Host::new(1);
    for mode in Mode::ALL {
        let base = host.cmd(mode, &[]);
        let mut line: Vec<String> = base
            .get_envs()
            .filter_map(|(k, v)| Some(format!("{}={}", k.to_str()?, v?.to_str()?)))
            .collect();
        if let Mode::Nobody = mode {
            line.push("setpriv --reuid=65534 --regid=65534 --clear-groups".into());
        }
        line.push(format!(
            "{} gpu exec --count 1 -- sh -c 'printf \"rea%s\\n\" dy; read x; echo got:$x; exit 3'",
            host.bin.display()
        ));
        let shown = stopped_and_continued(&format!(
            "cd {} && {}",
            host.h.work.path().display(),
            line.join(" ")
        ));
        assert!(shown.contains("got:hello"), "{mode:?}: {shown}");
        assert!(shown.contains("STATUS=3"), "{mode:?}: {shown}");
    }
}

#[test]
fn a_gpu_is_never_handed_out_twice_whatever_another_user_does_to_the_lock_dir() {
    let host = Host::new(2);
    let lock = |i: usize| host.locks.join(format!("{}.lock", uuid(i)));
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args)
            .status()
            .unwrap()
    };
    // Another user can neither remove nor replace a lock file that setup made root's.
    let path = lock(0).display().to_string();
    assert!(!as_nobody(&["rm", "-f", &path]).success());
    assert!(!as_nobody(&["mv", &path, "/tmp/taken"]).success());
    assert!(lock(0).exists());
    // Workload A holds GPU 0; B, asking for exactly GPU 0 at once, does not get it.
    let mut a = host
        .cmd(
            Mode::Root,
            &["gpu", "exec", "--devices", "0", "--", "sleep", "30"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let leased = || {
        let r = run(&mut host.cmd(Mode::Root, &["gpu", "status", "--json"]));
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_default();
        v["gpus"]
            .as_array()
            .map(|g| g.iter().filter(|g| !g["lease_holder"].is_null()).count())
            .unwrap_or(0)
    };
    assert!(wait_until(20, || leased() == 1), "A never got GPU 0");
    let b = run(&mut host.cmd(
        Mode::Root,
        &[
            "gpu",
            "exec",
            "--devices",
            "0",
            "--wait",
            "0s",
            "--",
            "true",
        ],
    ));
    assert_eq!(b.code, 4, "B got GPU 0 while A held it:\n{}", b.stderr);
    let _ = a.kill();
    let _ = a.wait();
    // A lock file another user made is refused, naming them; one that is missing, the
    // other user may not make.
    std::fs::remove_file(lock(1)).unwrap();
    std::fs::write(lock(1), "").unwrap();
    nix::unistd::chown(&lock(1), Some(65534.into()), Some(65534.into())).unwrap();
    run(&mut host.cmd(Mode::Root, &["gpu", "exec", "--devices", "1", "--", "true"])).fails_with(
        2,
        "is owned by uid 65534 (nobody), not by root or the lock dir's owner",
    );
    std::fs::remove_file(lock(1)).unwrap();
    run(&mut host.cmd(
        Mode::Nobody,
        &["gpu", "exec", "--devices", "1", "--", "true"],
    ))
    .fails_with(
        2,
        "only root or the lock dir's owner (uid 0 (root)) may make it",
    );
    assert!(!lock(1).exists());
    // Setup makes it root's again, and everyone may lease it.
    let dir = host.locks.display().to_string();
    run(&mut host.cmd(Mode::Root, &["host", "setup", "--lock-dir", &dir])).ok();
    run(&mut host.cmd(
        Mode::Nobody,
        &["gpu", "exec", "--devices", "1", "--", "true"],
    ))
    .ok();
}

#[test]
fn host_setup_moves_another_users_folders_aside_and_follows_no_link() {
    let host = Host::new(1);
    // Another user made a lock dir before the admin (anyone may, in a sticky /run/lock),
    // with `queue` a link to a root-only file: setup must not chmod through it.
    let parent = host.h.work.path().join("run-lock");
    std::fs::create_dir(&parent).unwrap();
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = host.h.work.path().join("shadow");
    std::fs::write(&victim, "secret").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let dir = parent.join("cibox");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("queue")).unwrap();
    for p in [&dir, &dir.join("queue")] {
        std::os::unix::fs::lchown(p, Some(65534), Some(65534)).unwrap();
    }
    let shown = dir.display().to_string();
    let r = run(&mut host.cmd(Mode::Root, &["host", "setup", "--lock-dir", &shown]));
    r.ok();
    assert!(r.stdout.contains("aside"), "{}", r.stdout);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&victim).unwrap().mode() & 0o7777, 0o600);
    for p in [dir.clone(), dir.join("queue"), dir.join("runs")] {
        let md = std::fs::symlink_metadata(&p).unwrap();
        assert!(md.is_dir() && md.uid() == 0, "{}", p.display());
    }
    // Under a parent another user owns, nothing can be made root's for good.
    let theirs = host.h.work.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    nix::unistd::chown(&theirs, Some(65534.into()), Some(65534.into())).unwrap();
    let shown = theirs.join("cibox").display().to_string();
    run(&mut host.cmd(Mode::Root, &["host", "setup", "--lock-dir", &shown]))
        .fails_with(2, "cannot be made root's");
}

/// Issue 48: under CPU load, workers that escaped with `setsid`, closed their
/// descriptors and have children of their own (which are reparented to the subreaper
/// while the teardown walks the tree) are all gone when `gpu exec` returns, round after
/// round: the lease outlives every process of its workload.
#[test]
fn escaped_workers_with_children_are_gone_when_gpu_exec_returns_under_load() {
    let host = Host::new(1);
    // A CPU load this test makes (four busy loops per core), ended with the test.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut load: Vec<std::process::Child> = (0..4 * cores)
        .map(|_| {
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap()
        })
        .collect();
    let mut left = Vec::new();
    for round in 0..4 {
        let pids = host.h.work.path().join(format!("pids-{round}"));
        // 12 escapers, each in a session of its own with every descriptor closed, each
        // with 3 children that hold memory (slow to exit once killed); the command ends
        // at once, so the teardown kills them all together.
        // 12 escapers, each in a session of its own with every descriptor closed,
        // holding memory (slow to exit once killed), each with 2 children that ignore
        // SIGTERM: while the teardown walks the tree, the escapers die and their children
        // move to the subreaper.
        let script = format!(
            "for i in $(seq 12); do setsid /usr/bin/python3 -c '
import os, signal, subprocess, sys
child = \"import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); open(\\\"{p}\\\", \\\"a\\\").write(str(os.getpid()) + \\\"\\\\n\\\"); time.sleep(600)\"
for _ in range(2):
    subprocess.Popen([sys.executable, \"-c\", child], close_fds=True)
b = bytearray(128 << 20)
os.closerange(0, 1024)
os.wait()
' & done; sleep 2",
            p = pids.display()
        );
        let r = run(&mut host.exec(Mode::Subreaper, "1", &script));
        assert_eq!(r.code, 0, "round {round}: {}", r.stderr);
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        let started: Vec<i32> = text.lines().filter_map(|l| l.parse().ok()).collect();
        assert!(!started.is_empty(), "round {round}: no worker started");
        for pid in started {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if let Some((_, rest)) = stat.rsplit_once(')')
                && !rest.trim_start().starts_with(['Z', 'X'])
            {
                left.push((round, pid));
            }
        }
    }
    for c in &mut load {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(
        left.is_empty(),
        "workers still alive when gpu exec returned (round, pid): {left:?}"
    );
}
