#!/usr/bin/env python3
"""SIGKILL of cibox at random moments: does anything of the workload outlive it?

  gpu exec   -- on 2 fixture GPUs, a command whose worker forks, calls setsid and closes
                every inherited descriptor (Python's subprocess, start_new_session), then
                sleeps; cibox is SIGKILLed 0.1-1.5 s after it starts.
  batch run  -- a busybox batch whose workers fork and setsid inside the container;
                cibox is SIGKILLed 0.2-3 s after it starts (before, while and after its
                container is made).
Within 5 s of each kill: is any process (gpu exec) or container (batch run) of the
killed workload alive, and can its GPUs be leased again? For gpu exec also: was a GPU
ever held by two live workloads (the killed one's worker and the next lease)?
Usage: bench/kill.py [path/to/cibox] [rounds]   (run as root, engine up; default 20;
       KILL_ONLY=gpu or KILL_ONLY=batch runs one half)
"""
import os, random, signal, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIBOX = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "--check" else os.path.join(ROOT, "target/release/cibox")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 20
SMI = os.path.join(ROOT, "tests/fixtures/nvidia-smi")
sys.path.insert(0, os.path.join(ROOT, "bench"))
rng = random.Random(int(os.environ.get("KILL_SEED", "7")))

WORKER = r'''
import os, subprocess, sys, time
subprocess.Popen(["sleep", sys.argv[1]], start_new_session=True, close_fds=True)
time.sleep(600)
'''


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def workload(tag):
    """Host PIDs of the live processes of one round's workload, found by the tag in
    their arguments (the workload may run in a PID namespace, where its own idea of its
    PIDs means nothing here)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        # Exactly the worker and its sleeper: not the checker, nor cibox's own
        # processes, whose arguments hold the tag too.
        args = [a for a in args if a]
        ours = len(args) >= 2 and args[-1] == tag.encode() and (
            args[-2] == b"sleep" or args[-2].endswith(b"worker.py"))
        if ours and alive(int(name)):
            found.append(int(name))
    return found


def gpu_exec_rounds(work):
    with open(os.path.join(work, "gpus.csv"), "w") as f:
        for i in range(2):
            f.write(f"{i}, GPU-11111111-2222-3333-4444-{i:012d}, 0, 81559, 0\n")
    open(os.path.join(work, "apps.csv"), "w").close()
    env = dict(os.environ, CIBOX_NVIDIA_SMI=SMI, CIBOX_FAKE_SMI_STATE=work,
               CIBOX_GPU_LOCK_DIR=os.path.join(work, "locks"), CIBOX_LOG="error")
    worker = os.path.join(work, "worker.py")
    open(worker, "w").write(WORKER)
    clean = leasable = overlaps = 0
    for r in range(ROUNDS):
        tag = str(900000 + r)
        c = subprocess.Popen([CIBOX, "gpu", "exec", "--count", "2", "--", "python3", worker, tag],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.1, 1.5))
        c.send_signal(signal.SIGKILL)
        c.wait()
        killed_at = time.time()
        while time.time() - killed_at < 5 and workload(tag):
            time.sleep(0.05)
        if not workload(tag):
            clean += 1
        # The next lease looks, the moment it holds the GPUs, for what is left of the
        # killed workload (as a subreaper, so it sees host PIDs).
        got = subprocess.run([CIBOX, "gpu", "exec", "--count", "2", "--wait", "5s", "--",
                              "python3", os.path.abspath(__file__), "--check", tag],
                             env=dict(env, CIBOX_CONFINE="subreaper"), capture_output=True)
        if got.returncode in (0, 9):
            leasable += 1
        if got.returncode == 9:
            overlaps += 1  # the next lease got GPUs the killed workload still ran on
        for pid in workload(tag):
            os.kill(pid, signal.SIGKILL)
    print(f"gpu exec, {ROUNDS} kills: nothing of the workload alive within 5 s {clean}/{ROUNDS}; "
          f"GPUs leasable again {leasable}/{ROUNDS}; occupancy overlaps {overlaps}")


def batch_rounds(work):
    from batch import project, batch_cmd, containers
    manifest, image = project(work, (
        "  work: {gpus: 0, timeout: 10m, allow_empty: true, run: "
        "[\"for i in 1 2 3; do setsid sh -c 'sleep 600' & done; sleep 600\"]}\n"))
    src = os.path.join(work, "src")
    os.makedirs(src, exist_ok=True)
    clean = 0
    for r in range(ROUNDS):
        scope = f"kill-{r}"
        c = subprocess.Popen(batch_cmd(manifest, image, work, "work", src, scope),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 3.0))
        c.send_signal(signal.SIGKILL)
        c.wait()
        killed_at = time.time()
        while time.time() - killed_at < 5 and containers(scope):
            time.sleep(0.1)
        if not containers(scope):
            clean += 1
        else:
            subprocess.run(["docker", "rm", "-f", *containers(scope)], capture_output=True)
    print(f"batch run, {ROUNDS} kills: no container of the killed run within 5 s {clean}/{ROUNDS}")


def main():
    if sys.argv[1:2] == ["--check"]:
        sys.exit(9 if workload(sys.argv[2]) else 0)
    only = os.environ.get("KILL_ONLY")
    if only in (None, "gpu"):
        with tempfile.TemporaryDirectory() as work:
            gpu_exec_rounds(work)
    if only in (None, "batch"):
        with tempfile.TemporaryDirectory() as work:
            batch_rounds(work)


if __name__ == "__main__":
    main()
