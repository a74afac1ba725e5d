#!/usr/bin/env python3
"""GPU contention, side by side in one run.

16 jobs of sizes 8,1,1,2,4,1,2,8,1,4,2,1,1,2,4,8, each holding its GPUs 2 s, started
together on 8 fixture GPUs:
  cibox   -- `cibox gpu exec --count N --wait 300s`, the fair queue
  naive   -- the old wrapper's loop: flock(LOCK_NB) per GPU scanning upwards, keep what
             it gets, release all and sleep 5*random() s when short (slime's script)
Prints makespan against the ideal (sum of size x 2 s / 8 = 12.5 s) and the overlaps.
cibox runs twice: spawned back to back (arrival order is then whatever order the 16
processes reach the queue) and spawned 20 ms apart (arrival in the listed order).
With a latency (seconds), every nvidia-smi call takes that long first, as a real one's
start-up does (the old wrapper never asks nvidia-smi).
Usage: bench/contention.py [path/to/cibox] [latency]   (default target/release/cibox, 0)
"""
import fcntl, os, random, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIBOX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/cibox")
LATENCY = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
SMI = os.path.join(ROOT, "tests/fixtures/nvidia-smi")
SIZES = [8, 1, 1, 2, 4, 1, 2, 8, 1, 4, 2, 1, 1, 2, 4, 8]
HOLD = 2.0
GPUS = 8
IDEAL = sum(SIZES) * HOLD / GPUS

NAIVE = r'''
import fcntl, os, random, sys, time
lock_dir, count, hold, log, tag = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
while True:
    held = []
    for gpu in range(8):
        f = open(os.path.join(lock_dir, f"gpu{gpu}.lock"), "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append((gpu, f))
            if len(held) == count:
                break
        except BlockingIOError:
            f.close()
    if len(held) == count:
        break
    for _, f in held:
        f.close()
    time.sleep(5 * random.random())
start = time.time(); time.sleep(hold); end = time.time()
with open(log, "a") as out:
    out.write(f"{tag} {start} {end} {','.join(str(g) for g, _ in held)}\n")
'''


def run(kind, work, stagger):
    log = os.path.join(work, f"{kind}-{stagger}.log")
    locks = os.path.join(work, f"{kind}-{stagger}-locks")
    os.makedirs(locks)
    env = dict(os.environ, CIBOX_NVIDIA_SMI=SMI, CIBOX_FAKE_SMI_STATE=work, CIBOX_GPU_LOCK_DIR=locks, CIBOX_LOG="error")
    t0 = time.time()
    procs = []
    for i, size in enumerate(SIZES):
        if kind == "cibox":
            script = f'python3 -c "import time; s=time.time(); time.sleep({HOLD}); e=time.time(); open(\'{log}\',\'a\').write(f\'job{i} {{s}} {{e}} $CUDA_VISIBLE_DEVICES\\n\')"'
            cmd = [CIBOX, "gpu", "exec", "--count", str(size), "--wait", "300s", "--", "sh", "-c", script]
        else:
            cmd = [sys.executable, "-c", NAIVE, locks, str(size), str(HOLD), log, f"job{i}"]
        procs.append(subprocess.Popen(cmd, env=env))
        time.sleep(stagger)
    for p in procs:
        if p.wait() != 0:
            sys.exit(f"{kind}: a job failed ({p.args})")
    jobs = []
    for line in open(log):
        tag, s, e, gpus = line.split()
        jobs.append((tag, float(s), float(e), set(gpus.split(","))))
    makespan = max(e for _, _, e, _ in jobs) - t0
    overlaps = sum(1 for i, a in enumerate(jobs) for b in jobs[i + 1:]
                   if a[1] < b[2] and b[1] < a[2] and a[3] & b[3])
    last8 = max(s for tag, s, _, g in jobs if len(g) == 8) - t0
    return makespan, overlaps, last8


def main():
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "gpus.csv"), "w") as f:
            for i in range(GPUS):
                f.write(f"{i}, GPU-11111111-2222-3333-4444-{i:012}, 0, 81559, 0\n")
        open(os.path.join(work, "apps.csv"), "w").close()
        with open(os.path.join(work, "latency"), "w") as f:
            f.write(f"{LATENCY}\n" if LATENCY else "")
        print(f"16 jobs, sizes {SIZES}, {HOLD:.0f} s each, {GPUS} GPUs; ideal makespan {IDEAL:.1f} s; "
              f"nvidia-smi latency {LATENCY:g} s per call")
        for kind, stagger, how in (("cibox", 0, "together"), ("cibox", 0.02, "in order"), ("naive", 0, "together")):
            makespan, overlaps, last8 = run(kind, work, stagger)
            print(f"{kind:6s} {how:8s} makespan {makespan:5.1f} s = {makespan / IDEAL:.2f} x ideal, "
                  f"last 8-GPU job started at {last8:4.1f} s, overlaps {overlaps}")


if __name__ == "__main__":
    main()
