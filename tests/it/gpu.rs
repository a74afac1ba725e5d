//! GPU probing, leases and `gpu exec`, driven by the fake nvidia-smi.

use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

#[test]
fn status_shows_idle_and_each_kind_of_busy() {
    let h = GpuHost::new(4);
    h.smi.set(
        "gpus.csv",
        &format!(
            "0, {}, 0, 81559, 0\n1, {}, 4096, 81559, 0\n2, {}, 0, 81559, 55\n3, {}, 10, 81559, 0\n",
            uuid(0),
            uuid(1),
            uuid(2),
            uuid(3)
        ),
    );
    h.smi.set("apps.csv", &format!("{}, 4242, 10\n", uuid(3)));
    let v = h.status();
    let verdicts: Vec<&str> = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts[0], "idle");
    assert!(
        verdicts[1].contains("4096 MiB used > 256 MiB"),
        "{verdicts:?}"
    );
    assert!(verdicts[2].contains("utilization 55% > 0%"), "{verdicts:?}");
    assert!(verdicts[3].contains("compute process 4242"), "{verdicts:?}");
    // Busy GPUs are never handed out: 1 idle of 4.
    h.run(&["gpu", "exec", "--count", "2", "--wait", "0s", "--", "true"])
        .fails_with(4, "could not lease 2 GPU(s)");
    let r = h.run(&[
        "gpu",
        "exec",
        "--count",
        "1",
        "--wait",
        "0s",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    r.ok();
    assert_eq!(r.stdout.trim(), uuid(0));
}

#[test]
fn probe_failures_fail_closed_with_exit_5() {
    let garbled = [
        (
            "gpus.csv",
            format!("0, {}, [N/A], 81559, 0\n", uuid(0)),
            "memory.used is `[N/A]`",
        ),
        (
            "gpus.csv",
            format!("0, {}, 0, 81559, [Not Supported]\n", uuid(0)),
            "utilization.gpu is `[Not Supported]`",
        ),
        (
            "gpus.csv",
            format!("0, {}, 0, 81559\n", uuid(0)),
            "expected 9 columns",
        ),
        (
            "gpus.csv",
            "0, GPU-zzzz, 0, 81559, 0\n".to_string(),
            "is not a GPU UUID",
        ),
        (
            "gpus.csv",
            format!("0, {}, 0, 81559, 0\n1, {}, 0, 81559, 0\n", uuid(0), uuid(0)),
            "appears twice",
        ),
        (
            "apps.csv",
            format!("{}, 12, 100\n", uuid(9)),
            "that the GPU list does not show",
        ),
        ("mode", "fail".to_string(), "exited with"),
        ("mode", "hang".to_string(), "did not answer within 2s"),
    ];
    for (file, contents, why) in garbled {
        let h = GpuHost::new(2);
        h.smi.set(file, &contents);
        h.run(&["gpu", "status"]).fails_with(5, why);
        h.run(&["gpu", "exec", "--count", "1", "--", "true"])
            .fails_with(5, why);
        h.smi.set("mode", "ok");
        h.smi.set(
            "gpus.csv",
            &format!("0, {}, 0, 81559, 0\n1, {}, 0, 81559, 0\n", uuid(0), uuid(1)),
        );
        h.smi.set("apps.csv", "");
        assert!(h.leased().is_empty(), "no lease kept after `{why}`");
    }
    let h = GpuHost::new(1);
    run(h
        .cmd(&["gpu", "status"])
        .env("CIBOX_NVIDIA_SMI", "/nonexistent/nvidia-smi"))
    .fails_with(5, "cannot run");
}

#[test]
fn exec_bad_input_is_exit_2_and_keeps_no_lease() {
    let h = GpuHost::new(4);
    let u1 = uuid(1);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--count", "0", "--", "true"],
            "--count must be at least 1",
        ),
        (vec!["--devices", "1,1", "--", "true"], "names GPU 1 twice"),
        (
            vec!["--devices", &u1, "--devices", "1", "--", "true"],
            "cannot be used multiple times",
        ),
        (
            vec!["--devices", "0,9", "--", "true"],
            "`9` is not a GPU on this host",
        ),
        (
            vec!["--devices", "GPU-nope", "--", "true"],
            "is not a GPU on this host",
        ),
        (
            vec!["--count", "1", "--devices", "1", "--", "true"],
            "cannot be used with",
        ),
        (vec!["--", "true"], "say how many GPUs"),
        (vec!["--count", "1"], "no command given"),
        (
            vec!["--count", "1", "--wait", "soon", "--", "true"],
            "invalid value 'soon' for '--wait <DUR>': bad duration `soon`",
        ),
        (
            vec!["--count", "1", "--env-name", "1X", "--", "true"],
            "is not a variable name",
        ),
        (
            vec!["--count", "1", "--", "/nonexistent/prog"],
            "cannot run `/nonexistent/prog`",
        ),
    ];
    for (args, why) in cases {
        let mut all = vec!["gpu", "exec"];
        all.extend(args);
        h.run(&all).fails_with(2, why);
    }
    let pool_cases = [
        ("0,zero", "`zero` is neither a GPU index"),
        ("0,7", "`7` is not a GPU on this host"),
        ("", "the GPU pool is empty"),
    ];
    for (pool, why) in pool_cases {
        run(h
            .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
            .env("CIBOX_GPU_POOL", pool))
        .fails_with(2, why);
    }
    run(h
        .cmd(&["gpu", "exec", "--devices", "3", "--", "true"])
        .env("CIBOX_GPU_POOL", "0,1"))
    .fails_with(2, "is not in the CI pool");
    let file = h.work.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    run(h
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_GPU_LOCK_DIR", file.join("locks")))
    .fails_with(2, "lock dir");
    run(h
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_GPU_LOCK_DIR", &file))
    .fails_with(2, "exists and is not a directory");
    assert!(h.leased().is_empty());
}

#[test]
fn exec_sets_the_environment_and_passes_the_exit_code() {
    let h = GpuHost::new(4);
    let r = h.run(&[
        "gpu",
        "exec",
        "--count",
        "2",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER",
    ]);
    r.ok();
    assert_eq!(
        r.stdout.trim(),
        format!("{},{} PCI_BUS_ID", uuid(0), uuid(1))
    );
    let r = h.run(&[
        "gpu",
        "exec",
        "--devices",
        "3,1",
        "--index",
        "--env-name",
        "MY_GPUS",
        "--",
        "sh",
        "-c",
        "echo $MY_GPUS",
    ]);
    r.ok();
    assert_eq!(r.stdout.trim(), "3,1");
    let r = h.run(&["gpu", "exec", "--count", "1", "--", "sh", "-c", "exit 7"]);
    assert_eq!(r.code, 7);
    let r = h.run(&[
        "gpu",
        "exec",
        "--count",
        "1",
        "--",
        "sh",
        "-c",
        "kill -KILL $$",
    ]);
    assert_eq!(r.code, 137);
    assert!(h.leased().is_empty());
}

#[test]
fn holders_are_shown_and_leases_released() {
    let h = GpuHost::new(2);
    let mut child = h
        .cmd(&["gpu", "exec", "--count", "1", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    assert!(wait_until(10, || h.leased() == [0]));
    let v = h.status();
    let holder = v["gpus"][0]["lease_holder"].as_str().unwrap();
    assert!(
        holder.contains(&format!("pid {}", child.id())) && holder.contains("`sleep 30`"),
        "{holder}"
    );
    unsafe { nix::libc::kill(child.id() as i32, nix::libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    assert!(h.leased().is_empty());
}

/// Starts `gpu exec` that records `start end uuids` (ns) into `log`.
fn timed_job(
    h: &GpuHost,
    count: usize,
    hold: &str,
    log: &std::path::Path,
    tag: &str,
) -> std::process::Child {
    let script = format!(
        "s=$(date +%s%N); sleep {hold}; e=$(date +%s%N); echo \"{tag} $s $e $CUDA_VISIBLE_DEVICES\" >> {}",
        log.display()
    );
    let count = count.to_string();
    h.cmd(&[
        "gpu", "exec", "--count", &count, "--wait", "300s", "--", "sh", "-c", &script,
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap()
}

struct Interval {
    tag: String,
    start: u128,
    end: u128,
    gpus: Vec<String>,
}

fn read_log(log: &std::path::Path) -> Vec<Interval> {
    std::io::BufReader::new(std::fs::File::open(log).unwrap())
        .lines()
        .map(|l| {
            let l = l.unwrap();
            let f: Vec<&str> = l.split(' ').collect();
            Interval {
                tag: f[0].to_string(),
                start: f[1].parse().unwrap(),
                end: f[2].parse().unwrap(),
                gpus: f[3].split(',').map(str::to_string).collect(),
            }
        })
        .collect()
}

/// A holds its GPUs; once it does, B queues; 200 ms later C queues. (size, hold) each.
fn three_jobs(h: GpuHost, a: (usize, &str), b: (usize, &str), c: (usize, &str)) -> Vec<Interval> {
    let log = h.work.path().join("three.log");
    let mut pa = timed_job(&h, a.0, a.1, &log, "A");
    assert!(wait_until(10, || h.leased().len() == a.0 && h.queued() == 0));
    let mut pb = timed_job(&h, b.0, b.1, &log, "B");
    std::thread::sleep(Duration::from_millis(200));
    let mut pc = timed_job(&h, c.0, c.1, &log, "C");
    for p in [&mut pa, &mut pb, &mut pc] {
        assert!(p.wait().unwrap().success());
    }
    read_log(&log)
}

#[test]
fn a_hundred_concurrent_leases_never_share_a_gpu() {
    let h = GpuHost::new(8);
    let log = h.work.path().join("intervals.log");
    // Sizes from a fixed pseudo-random sequence (reproducible failures).
    let mut x: u32 = 12345;
    let mut children = Vec::new();
    for i in 0..120 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        let size = [1, 1, 1, 2, 2, 3, 4, 8][(x >> 16) as usize % 8];
        children.push(timed_job(&h, size, "0.02", &log, &format!("job{i}")));
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let jobs = read_log(&log);
    assert_eq!(jobs.len(), 120);
    let mut overlaps = Vec::new();
    for (i, a) in jobs.iter().enumerate() {
        for b in &jobs[i + 1..] {
            let overlap = a.start < b.end && b.start < a.end;
            if overlap && a.gpus.iter().any(|g| b.gpus.contains(g)) {
                overlaps.push(format!("{} and {}", a.tag, b.tag));
            }
        }
    }
    assert!(
        overlaps.is_empty(),
        "GPUs shared by overlapping holders: {overlaps:?}"
    );
    assert!(h.leased().is_empty());
}

#[test]
fn the_queue_is_first_come_first_served() {
    // A holds one GPU; B wants both and queues; C wants one (which is free) and queues
    // behind B: C must not overtake B.
    let jobs = three_jobs(GpuHost::new(2), (1, "1"), (2, "0.2"), (1, "0.2"));
    let at = |t: &str| jobs.iter().find(|j| j.tag == t).unwrap();
    assert!(at("B").start >= at("A").end, "B started before A released");
    assert!(at("C").start >= at("B").end, "C overtook B");
}

#[test]
fn a_big_request_of_a_burst_goes_first_but_not_one_that_came_later() {
    // A holds all 8. B wants 1; C wants 8 right behind it (a burst: C's 0.7 s head
    // start puts it ahead); D wants 8 a second after B, past its head start: behind B.
    let h = GpuHost::new(8);
    let log = h.work.path().join("burst.log");
    let mut a = timed_job(&h, 8, "2", &log, "A");
    assert!(wait_until(10, || h.leased().len() == 8 && h.queued() == 0));
    let mut b = timed_job(&h, 1, "0.3", &log, "B");
    assert!(wait_until(10, || h.queued() == 1));
    let mut c = timed_job(&h, 8, "0.3", &log, "C");
    std::thread::sleep(Duration::from_millis(1000));
    let mut d = timed_job(&h, 8, "0.3", &log, "D");
    for p in [&mut a, &mut b, &mut c, &mut d] {
        assert!(p.wait().unwrap().success());
    }
    let jobs = read_log(&log);
    let at = |t: &str| jobs.iter().find(|j| j.tag == t).unwrap();
    assert!(at("C").start >= at("A").end, "C started before A released");
    assert!(
        at("B").start >= at("C").end,
        "B went before the big request of its burst"
    );
    assert!(
        at("D").start >= at("B").end,
        "D, a second later, overtook B"
    );
}

#[test]
fn a_dead_waiter_leaves_the_queue() {
    let h = GpuHost::new(1);
    let mut holder = h
        .cmd(&["gpu", "exec", "--count", "1", "--", "sleep", "1"])
        .spawn()
        .unwrap();
    assert!(wait_until(10, || h.leased() == [0]));
    let mut dead = h
        .cmd(&["gpu", "exec", "--count", "1", "--wait", "60s", "--", "true"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    dead.kill().unwrap();
    dead.wait().unwrap();
    // The next waiter is not stuck behind the dead one's ticket.
    let r = h.run(&["gpu", "exec", "--count", "1", "--wait", "20s", "--", "true"]);
    r.ok();
    assert!(holder.wait().unwrap().success());
    let queue = h.locks.path().join("queue");
    let left: Vec<_> = std::fs::read_dir(queue)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        left.iter().all(|n| n.to_string_lossy().starts_with('.')),
        "tickets left: {left:?}"
    );
}

#[test]
fn waiting_is_logged_with_holders() {
    let h = GpuHost::new(1);
    let mut holder = h
        .cmd(&["gpu", "exec", "--count", "1", "--", "sleep", "1"])
        .spawn()
        .unwrap();
    // Leased and out of the queue: a hand-out keeps its place until its probe says the
    // GPUs are idle.
    assert!(wait_until(10, || h.leased() == [0] && h.queued() == 0));
    let r = h.run(&["gpu", "exec", "--count", "1", "--wait", "30s", "--", "true"]);
    r.ok();
    // Its place in the queue, who holds the GPU, and when the wait gives up.
    let line = r
        .stderr
        .lines()
        .find(|l| l.contains("waiting 0.0s for 1 GPU(s): "))
        .unwrap_or_else(|| panic!("no wait line:\n{}", r.stderr));
    assert!(
        line.contains("GPU(s): queue position 1, leased: GPU 0 by pid"),
        "{line}"
    );
    assert!(line.contains("; gives up in 30s, at "), "{line}");
    holder.wait().unwrap();
}

#[test]
fn small_requests_fill_gpus_the_head_cannot_use_without_delaying_it() {
    // A holds 3 of 4 for 1 s. B wants 2 and must wait for A. C wants 1: the free GPU is
    // of no use to B yet, and B still gets its 2 the moment A ends, so C may go first.
    let jobs = three_jobs(GpuHost::new(4), (3, "1"), (2, "0.2"), (1, "2"));
    let at = |t: &str| jobs.iter().find(|j| j.tag == t).unwrap();
    assert!(at("C").start < at("A").end, "C did not use the idle GPU");
    assert!(at("B").start >= at("A").end, "B started before A released");
    assert!(at("B").start < at("C").end, "B was delayed by C");
}

#[test]
fn a_request_waiting_on_its_own_users_gpus_holds_back_others_only_for_a_while() {
    // One user holds a GPU and asks for all eight: its request, at the head, can never
    // be served while its own lease lives. The seven idle GPUs go to others once it
    // has waited 30 s (SELF_BLOCK_LIMIT), not when that user lets go.
    let h = GpuHost::new(8);
    let mut holder = h
        .cmd(&["gpu", "exec", "--count", "1", "--", "sleep", "300"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(20, || h.leased() == [0] && h.queued() == 0));
    let mut all = h
        .cmd(&[
            "gpu", "exec", "--count", "8", "--wait", "300s", "--", "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(20, || h.queued_with_pool() == 1));
    let r = h.run(&["gpu", "exec", "--count", "1", "--wait", "60s", "--", "true"]);
    let all_still_waits = all.try_wait().unwrap().is_none();
    let _ = all.kill();
    let _ = holder.kill();
    all.wait().unwrap();
    holder.wait().unwrap();
    r.ok();
    assert!(all_still_waits, "the 8-GPU request was served");
}

#[test]
fn another_user_shares_the_lease_dir() {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        nix::unistd::getuid().is_root(),
        "this test switches to user nobody with setpriv and must run as root (CI does)"
    );
    let h = GpuHost::new(1);
    for d in [h.locks.path(), h.smi.state.path(), h.work.path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let locks = h.locks.path().join("shared");
    // The checkout may sit where nobody cannot reach: give nobody its own copies.
    let bin = h.work.path().join("cibox");
    let smi = h.work.path().join("nvidia-smi");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::copy(FakeSmi::program(), &smi).unwrap();
    let as_nobody = |args: &[&str]| {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(args);
        c.env("CIBOX_NVIDIA_SMI", &smi)
            .env("CIBOX_FAKE_SMI_STATE", h.smi.state.path())
            .env("CIBOX_GPU_LOCK_DIR", &locks)
            .current_dir(h.work.path());
        run(&mut c)
    };
    // root creates the lease dir and the GPU's lock file ...
    run(h
        .cmd(&["gpu", "exec", "--count", "1", "--", "true"])
        .env("CIBOX_GPU_LOCK_DIR", &locks))
    .ok();
    let mode = std::fs::metadata(&locks).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o1777, "lease dir mode");
    let file_mode = std::fs::metadata(locks.join(format!("{}.lock", uuid(0))))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(file_mode, 0o666, "lock file mode");
    // ... and another user leases the same GPU through it, and sees root's holder.
    let r = as_nobody(&["gpu", "exec", "--count", "1", "--", "id", "-u"]);
    r.ok();
    assert_eq!(r.stdout.trim(), "65534");
    let mut root_holder = h
        .cmd(&["gpu", "exec", "--count", "1", "--", "sleep", "2"])
        .env("CIBOX_GPU_LOCK_DIR", &locks)
        .spawn()
        .unwrap();
    assert!(wait_until(10, || !as_nobody(&["gpu", "status", "--json"])
        .stdout
        .contains("\"lease_holder\": null")));
    as_nobody(&["gpu", "exec", "--count", "1", "--wait", "0s", "--", "true"])
        .fails_with(4, "by pid");
    assert!(root_holder.wait().unwrap().success());
}

/// Runs `cibox ARGS` on a fresh pseudo-terminal (Python's `pty`), types `input`, and
/// returns what the terminal showed, or panics when it has not ended within 20 s.
fn on_a_terminal(base: &std::process::Command, input: &str) -> String {
    const DRIVER: &str = r#"
import os, pty, select, signal, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
os.write(fd, sys.argv[1].encode())
out, deadline = b"", time.time() + 20
while time.time() < deadline:
    if select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
# The terminal closes a moment before the process can be reaped.
done, status = os.waitpid(pid, os.WNOHANG)
while not done and time.time() < deadline:
    time.sleep(0.05)
    done, status = os.waitpid(pid, os.WNOHANG)
if not done:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print("TIMED OUT")
sys.stdout.write(out.decode(errors="replace"))
print("EXIT", os.waitstatus_to_exitcode(status) if done else "none")
"#;
    let mut c = std::process::Command::new("python3");
    c.arg("-c")
        .arg(DRIVER)
        .arg(input)
        .arg(base.get_program())
        .args(base.get_args());
    for (k, v) in base.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(d) = base.get_current_dir() {
        c.current_dir(d);
    }
    let out = c.output().expect("python3 runs the terminal driver");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!text.contains("TIMED OUT"), "hung on the terminal: {text}");
    text
}

#[test]
fn an_interactive_command_gets_the_terminal() {
    // On a terminal the command is the foreground job, so it can read the terminal (a
    // REPL, a breakpoint) instead of being stopped by SIGTTIN for good.
    let h = GpuHost::new(1);
    let shown = on_a_terminal(
        &h.cmd(&[
            "gpu",
            "exec",
            "--count",
            "1",
            "--",
            "sh",
            "-c",
            "read x; echo got:$x; exit 3",
        ]),
        "hello\n",
    );
    assert!(shown.contains("got:hello"), "{shown}");
    assert!(shown.contains("EXIT 3"), "{shown}");
    assert!(h.leased().is_empty());
}

#[test]
fn a_head_waiting_on_a_gpu_busy_outside_cibox_does_not_hold_up_others() {
    // GPU 0 runs a process cibox does not know. A waits for exactly GPU 0; B, behind
    // it, wants any one GPU: GPUs 1-3 are of no use to A, so B must not wait for A.
    let h = GpuHost::new(4);
    h.smi.set("apps.csv", &format!("{}, 4242, 100\n", uuid(0)));
    let mut a = h
        .cmd(&[
            "gpu",
            "exec",
            "--devices",
            "0",
            "--wait",
            "8s",
            "--",
            "true",
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(10, || h.queued_with_pool() == 1));
    let b = h.run(&["gpu", "exec", "--count", "1", "--wait", "5s", "--", "true"]);
    b.ok();
    assert_eq!(
        a.wait().unwrap().code(),
        Some(4),
        "A got GPU 0 while it was busy"
    );
}

#[test]
fn the_two_nvidia_smi_queries_of_a_probe_run_at_once() {
    // A real nvidia-smi spends most of a call starting up: two in a row cost twice that.
    let h = GpuHost::new(2);
    h.smi.set("latency", "0.3");
    h.smi.set("calls.log", "");
    h.run(&["gpu", "status"]).ok();
    let calls = std::fs::read_to_string(h.smi.state.path().join("calls.log")).unwrap();
    let kinds: Vec<&str> = calls.lines().filter_map(|l| l.split(' ').next()).collect();
    // The probe's two; what the GPUs are (the MODEL column) is asked after it.
    assert_eq!(
        kinds[..4],
        ["start", "start", "end", "end"],
        "both queries start before either answers:\n{calls}"
    );
}

#[test]
fn a_gpu_found_busy_after_it_was_locked_is_let_go_and_another_taken() {
    // GPU 0 runs a process cibox does not know. Nothing has probed yet, so the first
    // choice may fall on it: the hand-out's own probe (after the lock) must catch that,
    // let it go, and take GPU 1 instead; and GPU 0 must not stay leased.
    let h = GpuHost::new(2);
    h.smi.set("apps.csv", &format!("{}, 4242, 100\n", uuid(0)));
    let r = h.run(&[
        "gpu",
        "exec",
        "--count",
        "1",
        "--wait",
        "5s",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    r.ok();
    assert_eq!(r.stdout.trim(), uuid(1));
    assert!(h.leased().is_empty());
    // Both busy: the wait ends in exit 4, nothing kept.
    h.smi.set(
        "apps.csv",
        &format!("{}, 4242, 100\n{}, 4243, 100\n", uuid(0), uuid(1)),
    );
    h.run(&["gpu", "exec", "--count", "1", "--wait", "1s", "--", "true"])
        .fails_with(4, "could not lease");
    assert!(h.leased().is_empty());
}

#[test]
fn nobody_overtakes_a_head_while_it_checks_the_gpus_it_locked() {
    // GPU 2 of 4 is busy outside cibox and nothing has probed yet. A (the head) wants
    // 3: it may lock 0,1,2 first and find 2 busy only with its probe. B, behind it,
    // wants 1: taking GPU 3 meanwhile would leave A short, so B must wait for A.
    let h = GpuHost::new(4);
    h.smi.set("apps.csv", &format!("{}, 4242, 100\n", uuid(2)));
    h.smi.set("latency", "0.3");
    let log = h.work.path().join("head.log");
    let mut a = timed_job(&h, 3, "1", &log, "A");
    assert!(wait_until(10, || h.queued() == 1));
    let mut b = timed_job(&h, 1, "0.1", &log, "B");
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    let jobs = read_log(&log);
    let at = |t: &str| jobs.iter().find(|j| j.tag == t).unwrap();
    assert!(!at("A").gpus.contains(&uuid(2)), "A got the busy GPU");
    assert!(
        at("B").start >= at("A").start,
        "B overtook A while A checked its GPUs"
    );
}

#[test]
fn one_try_takes_an_idle_gpu_after_finding_another_busy() {
    // GPU 0 runs a process cibox does not know, GPU 1 is idle, and nothing has probed
    // yet: a wait of 0s is one try, and that try must go on to GPU 1 once the probe
    // finds GPU 0 busy, not give up with an idle GPU unleased.
    let h = GpuHost::new(2);
    h.smi.set("apps.csv", &format!("{}, 4242, 100\n", uuid(0)));
    let r = h.run(&[
        "gpu",
        "exec",
        "--count",
        "1",
        "--wait",
        "0s",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    r.ok();
    assert_eq!(r.stdout.trim(), uuid(1));
    assert!(h.leased().is_empty());
    // Both busy: one try still ends in exit 4, nothing kept.
    h.smi.set(
        "apps.csv",
        &format!("{}, 4242, 100\n{}, 4243, 100\n", uuid(0), uuid(1)),
    );
    h.run(&["gpu", "exec", "--count", "1", "--wait", "0s", "--", "true"])
        .fails_with(4, "busy outside cibox");
    assert!(h.leased().is_empty());
}

#[test]
fn exec_asking_more_gpus_than_the_pool_is_capacity_like_a_batch() {
    // A batch asking for more GPUs than the pool ends in 4 (capacity, docs §2); gpu
    // exec asking the same is the same case, not a usage error.
    let h = GpuHost::new(4);
    h.run(&["gpu", "exec", "--count", "5", "--", "true"])
        .fails_with(4, "--count 5 needs 5 GPUs; the pool has 4");
    run(h
        .cmd(&["gpu", "exec", "--count", "3", "--", "true"])
        .env("CIBOX_GPU_POOL", "0,1"))
    .fails_with(4, "needs 3 GPUs; the pool has 2");
    assert!(h.leased().is_empty());
    assert_eq!(h.queued(), 0, "no ticket left in the queue");
}
