//! Every wait on a helper program is bounded by a wall clock, whatever its children
//! hold (issue 43): a GPU probe or a `buildkite-agent` that exits leaving a child with
//! its pipes, and a probe whose answer is endless. Bounds here are generous against a
//! child that sleeps 300 s: behaviours, not timings.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;

/// An executable shell script `name` in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Kills the processes whose PIDs `file` lists (one a line); says whether any lived.
fn kill_listed(file: &Path) -> bool {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut any = false;
    for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        let pid = nix::unistd::Pid::from_raw(pid);
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        });
        if alive {
            any = true;
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
    any
}

/// `gpu exec --wait 2s` (probe timeout 2 s) with nvidia-smi wrapped in `wrapper`
/// (`REAL` the fake, `PIDS` a file for the PIDs of what it leaves).
fn exec_with_probe(wrapper: &str) -> (Run, Duration, bool) {
    let h = GpuHost::new(2);
    let bin = tempfile::tempdir().unwrap();
    let pids = bin.path().join("pids");
    let body = wrapper
        .replace("REAL", &FakeSmi::program().display().to_string())
        .replace("PIDS", &pids.display().to_string());
    let smi = script(bin.path(), "nvidia-smi", &body);
    let started = Instant::now();
    let r = run(h
        .cmd(&["gpu", "exec", "--count", "1", "--wait", "2s", "--", "true"])
        .env("CIBOX_NVIDIA_SMI", &smi));
    let took = started.elapsed();
    let left = kill_listed(&pids);
    (r, took, left)
}

#[test]
fn a_probe_that_leaves_a_child_holding_its_pipe_answers_within_the_wait() {
    // The child stays in the probe's group: killed once the probe exits, the answer
    // whole at once, the GPU leased.
    let (r, took, left) = exec_with_probe("sleep 300 &\necho $! >> PIDS\nexec REAL \"$@\"\n");
    r.ok();
    assert!(took < Duration::from_secs(60), "{took:?}: {}", r.stderr);
    assert!(!left, "the probe's child outlived it");
    // One that leaves the group: the answer is given up at the probe's deadline, and
    // the probe fails closed.
    let (r, took, _) =
        exec_with_probe("setsid sh -c 'echo $$ >> PIDS; exec sleep 300' &\nexec REAL \"$@\"\n");
    r.fails_with(5, "did not answer within 2s");
    assert!(took < Duration::from_secs(60), "{took:?}: {}", r.stderr);
}

#[test]
fn a_probe_answer_past_its_bound_is_refused_unread() {
    let (r, took, _) = exec_with_probe("REAL \"$@\"\nhead -c 600000000 /dev/zero | tr '\\0' 'x'\n");
    r.fails_with(5, "the answer is over 4 MiB");
    assert!(took < Duration::from_secs(120), "{took:?}");
    // Read in part, never whole: the most any child of this test held is far below it.
    // SAFETY: getrusage fills the struct it is given.
    let max_rss_kib = unsafe {
        let mut usage: nix::libc::rusage = std::mem::zeroed();
        assert_eq!(
            nix::libc::getrusage(nix::libc::RUSAGE_CHILDREN, &mut usage),
            0
        );
        usage.ru_maxrss
    };
    assert!(
        max_rss_kib < 300 * 1024,
        "a child of this test held {max_rss_kib} KiB"
    );
}

#[test]
fn an_agent_that_leaves_a_child_holding_its_stderr_does_not_hold_the_run() {
    let p = busybox_project(
        &format!("  unit:\n    gpus: 0\n    timeout: 1m\n    run: [{JUNIT_OK:?}]\n"),
        "",
    );
    let bin = tempfile::tempdir().unwrap();
    let pids = bin.path().join("pids");
    script(
        bin.path(),
        "buildkite-agent",
        &format!(
            "cat > /dev/null\nsleep 300 &\necho $! >> {}\nexit 0\n",
            pids.display()
        ),
    );
    let started = Instant::now();
    let r = run(p
        .batch_cmd(&["batch", "run", "unit"])
        .env("BUILDKITE", "true")
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.path().display(),
                std::env::var("PATH").unwrap()
            ),
        ));
    let took = started.elapsed();
    let left = kill_listed(&pids);
    r.ok();
    assert!(
        !r.stderr.contains("annotate"),
        "the annotation is made: {}",
        r.stderr
    );
    assert!(took < Duration::from_secs(150), "{took:?}");
    assert!(!left, "the agent's child outlived it");
}
