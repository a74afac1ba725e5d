#!/usr/bin/env python3
"""Hand-off delay: one holder of a fixture GPU exits, one queued waiter starts.

Measures, N times, the time from the holder's command finishing (its last timestamp)
to the waiter's command starting (its first timestamp), through
`cibox gpu exec --devices 0`. Prints the median and the spread.
With a latency (seconds), every nvidia-smi call first sleeps that long (the fixture's
`latency` file), as a real one's start-up does.
Usage: bench/handoff.py [path/to/cibox] [rounds] [latency]
"""
import os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIBOX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/cibox")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 20
LATENCY = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
SMI = os.path.join(ROOT, "tests/fixtures/nvidia-smi")


def main():
    delays = []
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "gpus.csv"), "w") as f:
            f.write("0, GPU-11111111-2222-3333-4444-000000000000, 0, 81559, 0\n")
        open(os.path.join(work, "apps.csv"), "w").close()
        with open(os.path.join(work, "latency"), "w") as f:
            f.write(f"{LATENCY}\n" if LATENCY else "")
        env = dict(os.environ, CIBOX_NVIDIA_SMI=SMI, CIBOX_FAKE_SMI_STATE=work,
                   CIBOX_GPU_LOCK_DIR=os.path.join(work, "locks"), CIBOX_LOG="error")
        for r in range(ROUNDS):
            rel, got = os.path.join(work, f"rel{r}"), os.path.join(work, f"got{r}")
            holder = subprocess.Popen([CIBOX, "gpu", "exec", "--devices", "0", "--", "sh", "-c",
                                       f"sleep 0.4; date +%s%N > {rel}"], env=env)
            time.sleep(0.2)
            waiter = subprocess.Popen([CIBOX, "gpu", "exec", "--devices", "0", "--wait", "30s", "--",
                                       "sh", "-c", f"date +%s%N > {got}"], env=env)
            if holder.wait() or waiter.wait():
                sys.exit("a job failed")
            delays.append((int(open(got).read()) - int(open(rel).read())) / 1e6)
    delays.sort()
    print(f"nvidia-smi latency {LATENCY:g} s; hand-off over {ROUNDS} rounds: median {statistics.median(delays):.1f} ms, "
          f"min {delays[0]:.1f} ms, max {delays[-1]:.1f} ms (target: median <= 100 ms)")


if __name__ == "__main__":
    main()
