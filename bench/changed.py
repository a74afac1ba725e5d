#!/usr/bin/env python3
"""`cibox changed` against the pipeline it replaces, in one run.

A repository with 5,000 test files; the head changes 500 of them. Compared, paired:
  cibox  -- cibox changed --base BASE   (merge base, renames, NUM_GPUS, JSON matrix)
  old    -- git diff --name-only --diff-filter=AM BASE...HEAD -- 'tests/**/test_*.py'
            | xargs grep -oP '^NUM_GPUS\\s*=\\s*\\K\\d+'
Prints medians and the ratio. Usage: bench/changed.py [path/to/cibox] [rounds]
"""
import os, random, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIBOX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/cibox")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10


def git(d, *args):
    return subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@example.com", *args],
                          cwd=d, check=True, capture_output=True, text=True).stdout.strip()


def main():
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as d:
        git(d, "init", "-q", "-b", "main")
        with open(os.path.join(d, "cibox.yaml"), "w") as f:
            f.write('version: 1\nproject: bench\nimage: {locks: [cibox.yaml]}\n'
                    'batches: {b: {gpus: 0, timeout: 1m, run: [x]}}\n'
                    'changed: {patterns: ["tests/**/test_*.py"], default_gpus: 8}\n')
        files = []
        for i in range(5000):
            rel = f"tests/area{i % 50}/sub{i % 7}/test_{i}.py"
            os.makedirs(os.path.join(d, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(f"import torch\n\nNUM_GPUS = {rng.choice([1, 2, 4, 8])}\n\n" + "def test_x():\n    assert True\n" * 20)
            files.append(rel)
        git(d, "add", "-A")
        git(d, "commit", "-qm", "base")
        base = git(d, "rev-parse", "HEAD")
        git(d, "checkout", "-q", "-b", "pr")
        for rel in rng.sample(files, 500):
            with open(os.path.join(d, rel), "a") as f:
                f.write("\ndef test_new():\n    assert 1\n")
        git(d, "commit", "-qam", "change 500")
        old_cmd = ["bash", "-c", f"git diff --name-only --diff-filter=AM {base}...HEAD -- 'tests/**/test_*.py' "
                   "| xargs grep -oP '^NUM_GPUS\\s*=\\s*\\K\\d+' >/dev/null"]
        new_cmd = [CIBOX, "changed", "--base", base]
        out = subprocess.run(new_cmd, cwd=d, check=True, capture_output=True, text=True).stdout
        assert out.count("test_file") == 500, "cibox did not find the 500 files"
        a, b = [], []
        for _ in range(ROUNDS):
            for cmd, acc in ((new_cmd, a), (old_cmd, b)):
                t = time.perf_counter()
                subprocess.run(cmd, cwd=d, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                acc.append(time.perf_counter() - t)
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"5,000 test files, 500 changed: cibox changed {ma*1000:.0f} ms, git diff + grep {mb*1000:.0f} ms, "
              f"ratio {ma/mb:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
