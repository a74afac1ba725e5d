#!/usr/bin/env python3
"""Partitions by expected time against a split by count and against the bound.

SGLang's per-commit CUDA suites (bench/data/sglang-est-times.json: the 618 GPU entries
of its test registry, their GPU counts and estimated times, 73.6 GPU-hours) as one
cibox layer, split over N runners of 8 GPUs each:

  - cibox:    `cibox batch list --layer gpu --partition K/N --json`, for every K: the
              split cibox itself makes (expected work, longest first onto the lightest);
  - by count: round-robin in the registry's order (what a split by count gives, as
              nextest's `count:K/N`);
  - bound:    the GPU-seconds bound, total GPU-seconds / (8 N), or the longest single
              batch when that is more.

Each runner's part is then played out as `cibox layer run --parallel` runs it: every
batch arriving at once in the order cibox starts them (the widest first, then the
longest expected), in cibox's lease queue with its overtaking rule (below); the run
takes as long as its slowest runner (the time a pull request waits). Printed per N:
the split's own balance (its heaviest part's GPU-seconds over 8, against the bound),
each side's makespan and its ratio to the bound (target for cibox: <= 1.02), and the
makespan had a parallel run started the longest first instead.

Usage: bench/partition.py [path/to/cibox] [N ...]   (default N: 1 2 4 8; no engine needed)
"""
import heapq, json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = sys.argv[1:]
CIBOX = ARGS[0] if ARGS and not ARGS[0].isdigit() else os.path.join(ROOT, "target/release/cibox")
COUNTS = [int(a) for a in ARGS if a.isdigit()] or [1, 2, 4, 8]
GPUS_PER_RUNNER = 8


def entries():
    with open(os.path.join(ROOT, "bench/data/sglang-est-times.json")) as f:
        data = json.load(f)
    return [e for e in data["entries"] if e["gpus"] > 0]


def manifest(work, items):
    lines = ["version: 1", "project: sglang-like", "image: {locks: [cibox.yaml]}",
             "defaults: {timeout: 2h, run: [\"python3 $CIBOX_TEST_FILE\"]}", "batches:"]
    for i, e in enumerate(items):
        lines.append(f"  t{i:04d}: {{gpus: {e['gpus']}, est_time: {int(e['est_time_s'] * 1000)}ms}}")
    lines += ["layers:", "  gpu: {batches: all}"]
    path = os.path.join(work, "cibox.yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def cibox_parts(path, n):
    parts = []
    for k in range(1, n + 1):
        out = subprocess.run([CIBOX, "--manifest", path, "--json", "batch", "list", "--layer", "gpu",
                              "--partition", f"{k}/{n}"], check=True, capture_output=True, text=True).stdout
        parts.append([b["name"] for b in json.loads(out)["batches"]])
    return parts


def widest_first(b):
    return (-b[0], -b[1])


def longest_first(b):
    return -b[1]


def makespan(batches, order_key=widest_first):
    """One runner's part as `layer run --parallel` plays it: every batch arrives at
    once, in the order `order` gives (cibox's: the widest first, then the longest
    expected), in cibox's lease queue (docs/interface.md §11): the
    head takes GPUs as soon as enough are free; a waiter behind it takes free GPUs only
    when no waiter ahead could be served now and, for every waiter ahead, the GPUs held
    by batches that overtook it plus its own still leave it room."""
    order = sorted(batches, key=order_key)
    waiting = list(range(len(order)))
    running = []  # (end, gpus, index)
    now, free = 0.0, GPUS_PER_RUNNER
    while waiting or running:
        started = True
        while started:
            started = False
            for pos, i in enumerate(waiting):
                need = order[i][0]
                if need > free:
                    continue
                ahead = waiting[:pos]
                if ahead:
                    if any(order[j][0] <= free for j in ahead):
                        continue
                    if any(GPUS_PER_RUNNER - sum(g for _, g, k in running if k > j) - need < order[j][0]
                           for j in ahead):
                        continue
                heapq.heappush(running, (now + order[i][1], need, i))
                free -= need
                waiting.pop(pos)
                started = True
                break
        if running:
            end, g, _ = heapq.heappop(running)
            now, free = end, free + g
    return now


def main():
    items = entries()
    by_name = {f"t{i:04d}": (e["gpus"], e["est_time_s"]) for i, e in enumerate(items)}
    gpu_seconds = sum(g * s for g, s in by_name.values())
    longest = max(s for _, s in by_name.values())
    print(f"{len(items)} GPU entries, {gpu_seconds / 3600:.1f} GPU-hours, runners of {GPUS_PER_RUNNER} GPUs")
    with tempfile.TemporaryDirectory() as work:
        path = manifest(work, items)
        for n in COUNTS:
            bound = max(gpu_seconds / (GPUS_PER_RUNNER * n), longest)
            ours = cibox_parts(path, n)
            assert sorted(sum(ours, [])) == sorted(by_name), "every batch in exactly one part"
            counted = [list(by_name)[k::n] for k in range(n)]
            heaviest = max(sum(g * s for g, s in (by_name[b] for b in part)) for part in ours)
            ms_ours = max(makespan([by_name[b] for b in part]) for part in ours)
            ms_count = max(makespan([by_name[b] for b in part]) for part in counted)
            ms_longest = max(makespan([by_name[b] for b in part], longest_first) for part in ours)
            print(f"{n} runners: bound {bound / 60:6.1f} min; cibox's split: heaviest part {heaviest / GPUS_PER_RUNNER / bound:.3f}x;"
                  f" played out {ms_ours / 60:6.1f} min ({ms_ours / bound:.3f}x, target <= 1.02)"
                  f"   by count {ms_count / 60:6.1f} min ({ms_count / bound:.3f}x)"
                  f"   cibox's split started longest first {ms_longest / 60:6.1f} min ({ms_longest / bound:.3f}x)")

if __name__ == "__main__":
    main()
