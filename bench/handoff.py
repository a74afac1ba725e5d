#!/usr/bin/env python3
"""Hand-off delay, side by side: one holder of GPU 0 finishes, one queued waiter starts.

Measures, ROUNDS times each, the time from the holder's command finishing (its last
timestamp) to the waiter's command starting (its first timestamp):
  naive       -- the old wrapper's loop: flock(LOCK_NB), else sleep 5*random() s
  nvidia-smi  -- `cibox gpu exec --devices 0` through the nvidia-smi fixture, every call
                 of which first sleeps SMI_LATENCY (a real nvidia-smi's start-up)
  nvml        -- the same through the NVML double (init NVML_INIT, each call NVML_CALL)
Prints the median and the spread of each, against the targets: one nvidia-smi call +
50 ms, and 50 ms with NVML.
Usage: bench/handoff.py [path/to/cibox] [ROUNDS] [SMI_LATENCY] [NVML_INIT] [NVML_CALL]
       (defaults: target/release/cibox, 10, 0.3, 0.3, 0)
"""
import os, statistics, subprocess, sys, tempfile, time

from doubles import ROOT, build_double, env_for, state, take_calls

CIBOX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/cibox")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
SMI_LATENCY = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
NVML_INIT = float(sys.argv[4]) if len(sys.argv) > 4 else 0.3
NVML_CALL = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
# Long enough that the waiter has started, probed and queued before the holder ends.
HOLD = 1.5 + 2 * max(SMI_LATENCY, NVML_INIT)

NAIVE = r'''
import fcntl, random, sys, time
lock, hold, stamp = sys.argv[1], float(sys.argv[2]), sys.argv[3]
f = open(lock, "w")
while True:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
    except BlockingIOError:
        time.sleep(5 * random.random())
if hold:
    time.sleep(hold)
open(stamp, "w").write(str(time.time_ns()))
'''


def rounds(kind, work, double):
    locks = os.path.join(work, f"{kind}-locks")
    os.makedirs(locks)
    env = env_for(kind, work, locks, double)
    take_calls(work)
    delays = []
    for r in range(ROUNDS):
        rel, got = os.path.join(work, f"{kind}-rel{r}"), os.path.join(work, f"{kind}-got{r}")
        if kind == "naive":
            lock = os.path.join(locks, "gpu0.lock")
            holder = subprocess.Popen([sys.executable, "-c", NAIVE, lock, str(HOLD), rel], env=env)
            time.sleep(0.2)
            waiter = subprocess.Popen([sys.executable, "-c", NAIVE, lock, "0", got], env=env)
        else:
            holder = subprocess.Popen([CIBOX, "gpu", "exec", "--devices", "0", "--", "sh", "-c",
                                       f"sleep {HOLD}; date +%s%N > {rel}"], env=env)
            time.sleep(0.2)
            waiter = subprocess.Popen([CIBOX, "gpu", "exec", "--devices", "0", "--wait", "60s", "--",
                                       "sh", "-c", f"date +%s%N > {got}"], env=env)
        if holder.wait() or waiter.wait():
            sys.exit(f"{kind}: a job failed")
        delays.append((int(open(got).read()) - int(open(rel).read())) / 1e6)
    return sorted(delays), take_calls(work)


def main():
    with tempfile.TemporaryDirectory() as work:
        double = build_double(work)
        state(work, 1, SMI_LATENCY, NVML_INIT, NVML_CALL)
        print(f"hand-off of one GPU, {ROUNDS} rounds each; nvidia-smi {SMI_LATENCY:g} s per call; "
              f"NVML init {NVML_INIT:g} s, {NVML_CALL:g} s per call")
        targets = {"naive": None, "nvidia-smi": SMI_LATENCY * 1000 + 50, "nvml": 50}
        medians = {}
        for kind in ("naive", "nvidia-smi", "nvml"):
            d, (smi, inits, probes) = rounds(kind, work, double)
            medians[kind] = statistics.median(d)
            target = f" (target <= {targets[kind]:.0f} ms)" if targets[kind] else ""
            calls = {"naive": "", "nvidia-smi": f", {smi} nvidia-smi calls",
                     "nvml": f", {inits} NVML inits, {probes} NVML probes"}[kind]
            print(f"{kind:10s} median {medians[kind]:7.1f} ms, min {d[0]:7.1f} ms, max {d[-1]:7.1f} ms"
                  f"{target}{calls}")
        for kind in ("nvidia-smi", "nvml"):
            print(f"{kind:10s} hand-off {medians['naive'] / medians[kind]:.1f} x faster than naive")


if __name__ == "__main__":
    main()
