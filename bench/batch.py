#!/usr/bin/env python3
"""The batch runner against the raw engine, side by side in one run.

  1. a trivial CPU batch end to end   vs  docker run --rm --network none IMAGE true
  2. copying a 200 MB source tree in  vs  docker run --rm -v SRC:/src:ro IMAGE cp -R /src/. /work/
  3. a batch printing 500 MB          :   cibox's peak memory; throughput vs docker logs -f
  4. fault runs, 10 each              :   SIGKILL mid-batch (left within 5 s, then after
                                          cleanup); SIGTERM mid-batch;
                                          timeout with workers that ignore SIGTERM
  5. a run of 50 trivial batches over a 12,000-file source (vLLM's tree is 12,699
     entries)                         vs  50 x docker run --rm -v SRC:/work:ro IMAGE true
     and where a trivial batch's time goes (its phases under -v)
Paired runs alternate the two sides; medians and ratios are printed.
Usage: bench/batch.py [--trivial|--many] [path/to/cibox] [rounds]   (run as root, engine up: .ci/setup-host.sh)
  --trivial: part 1 only; --many: part 5 only
"""
import json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIVIAL_ONLY = "--trivial" in sys.argv[1:]
MANY_ONLY = "--many" in sys.argv[1:]
ARGS = [a for a in sys.argv[1:] if a not in ("--trivial", "--many")]
CIBOX = ARGS[0] if ARGS else os.path.join(ROOT, "target/release/cibox")
ROUNDS = int(ARGS[1]) if len(ARGS) > 1 else 10
DEMO = os.path.join(ROOT, "examples/demo/images/demo")


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout.strip()


def timed(cmd, **kw):
    """Runs cmd; returns (seconds, exit code, peak RSS in MiB of the process itself)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    _, status, usage = os.wait4(p.pid, 0)
    return time.perf_counter() - t, os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024


def spread(xs, scale=1000, unit=" ms"):
    """min / quartiles / max of `xs`, for noisy medians."""
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return "/".join(f"{v * scale:.0f}" if scale > 1 else f"{v:.2f}"
                    for v in (min(xs), q[0], q[1], q[2], max(xs))) + unit + " (min/q1/med/q3/max)"


def project(work, batches):
    """A project over the demo's busybox rootfs; returns (manifest path, image ID)."""
    os.makedirs(os.path.join(work, ".git"), exist_ok=True)
    img = os.path.join(work, "image")
    if not os.path.exists(img):
        subprocess.run(["sh", os.path.join(DEMO, "make-rootfs.sh")], check=True, capture_output=True)
        os.makedirs(img)
        shutil.copytree(os.path.join(DEMO, "rootfs"), os.path.join(img, "rootfs"), symlinks=True)
        with open(os.path.join(img, "Dockerfile"), "w") as f:
            f.write("FROM scratch\nCOPY rootfs/ /\nENV PATH=/bin\n")
    manifest = os.path.join(work, "cibox.yaml")
    with open(manifest, "w") as f:
        f.write("version: 1\nproject: bench\nimage: {locks: [image/Dockerfile], dockerfile: image/Dockerfile}\n"
                "container: {memory: 1g, pids: 256}\nbatches:\n" + batches)
    image = sh(CIBOX, "--manifest", manifest, "image", "build")
    return manifest, image


def batch_cmd(manifest, image, work, name, source, scope):
    return [CIBOX, "--manifest", manifest, "batch", "run", name, "--image", image, "--source", source,
            "--reports", os.path.join(work, "reports"), "--scope", scope]


def containers(scope):
    return sh("docker", "ps", "-aq", "--filter", f"label=org.cibox.scope={scope}").split()


def main():
    env = dict(os.environ, CIBOX_LOG="error")
    with tempfile.TemporaryDirectory() as work:
        manifest, image = project(work, (
            "  trivial: {gpus: 0, timeout: 1m, run: [\"true\"], allow_empty: true}\n"
            "  loud: {gpus: 0, timeout: 10m, allow_empty: true, run: [\"yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz012345678901234567 | head -c 500000000\"]}\n"
            "  long: {gpus: 0, timeout: 10m, run: [\"sleep 600\"]}\n"
            "  stubborn: {gpus: 0, timeout: 2s, run: [\"for i in 1 2 3; do (trap '' TERM; while :; do sleep 1; done) & done; wait\"]}\n"))
        small = os.path.join(work, "small-src")
        os.makedirs(small)
        open(os.path.join(small, "f"), "w").write("x")
        print(f"image {image}; {ROUNDS} paired rounds each\n")

        if MANY_ONLY:
            many(manifest, image, work, env)
            subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
            return

        # 1. Trivial batch.
        a, b = [], []
        for _ in range(ROUNDS):
            a.append(timed(batch_cmd(manifest, image, work, "trivial", small, "bench"), env=env)[0])
            b.append(timed(["docker", "run", "--rm", "--network", "none", image, "true"])[0])
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"trivial batch:  cibox {ma*1000:6.0f} ms   docker run {mb*1000:6.0f} ms   ratio {ma/mb:.2f} (target <= 1.2)")
        print(f"  spread: cibox {spread(a)}   docker run {spread(b)}   "
              f"pairwise ratios {spread([x / y for x, y in zip(a, b)], 1, '')}")
        if TRIVIAL_ONLY:
            subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
            return

        # 2. 200 MB source copied in.
        big = os.path.join(work, "big-src")
        for d in range(20):
            os.makedirs(os.path.join(big, f"d{d}"))
            for i in range(100):
                with open(os.path.join(big, f"d{d}", f"f{i}.bin"), "wb") as f:
                    f.write(os.urandom(100 * 1024))
        a, b = [], []
        for _ in range(ROUNDS):
            a.append(timed(batch_cmd(manifest, image, work, "trivial", big, "bench"), env=env)[0])
            b.append(timed(["docker", "run", "--rm", "--network", "none", "-v", f"{big}:/src:ro", image,
                            "cp", "-R", "/src/.", "/work/"])[0])
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"200 MB source:  cibox {ma*1000:6.0f} ms   docker run {mb*1000:6.0f} ms   ratio {ma/mb:.2f} (target <= 1.15)")

        # 3. 500 MB of output.
        runs = max(1, ROUNDS // 5)
        a, rss, b = [], [], []
        for _ in range(runs):
            t, code, peak = timed(batch_cmd(manifest, image, work, "loud", small, "bench"), env=env)
            assert code == 0, f"loud batch exited {code}"
            a.append(t)
            rss.append(peak)
            cid = sh("docker", "run", "-d", "--network", "none", image, "sh", "-c",
                     "yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz012345678901234567 | head -c 500000000")
            b.append(timed(["docker", "logs", "-f", cid])[0])
            sh("docker", "rm", "-f", cid)
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"500 MB output:  cibox {ma:6.1f} s ({500/ma:5.0f} MB/s, peak RSS {max(rss):.1f} MiB; target <= 30)   "
              f"docker run -d + logs -f {mb:6.1f} s ({500/mb:5.0f} MB/s)   throughput ratio {mb/ma:.2f} (target >= 0.8)")

        # 4. Faults.
        kill_alone = kill_ok = term_ok = timeout_ok = 0
        term_times = []
        for i in range(ROUNDS):
            scope = f"fault-{i}"
            p = subprocess.Popen(batch_cmd(manifest, image, work, "long", small, scope), env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while not containers(scope):
                time.sleep(0.05)
            p.kill(); p.wait()
            killed = time.time()
            while containers(scope) and time.time() - killed < 5:
                time.sleep(0.05)
            kill_alone += not containers(scope)
            subprocess.run([CIBOX, "--manifest", manifest, "cleanup", "--scope", scope], env=env, capture_output=True)
            kill_ok += not containers(scope)

            p = subprocess.Popen(batch_cmd(manifest, image, work, "long", small, scope), env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while not containers(scope):
                time.sleep(0.05)
            time.sleep(0.3)
            t = time.perf_counter()
            p.send_signal(signal.SIGTERM)
            code = p.wait()
            term_times.append(time.perf_counter() - t)
            term_ok += code == 143 and not containers(scope)

            _, code, _ = timed(batch_cmd(manifest, image, work, "stubborn", small, scope), env=env)
            timeout_ok += code == 124 and not containers(scope)
        print(f"faults ({ROUNDS} each): SIGKILL left nothing within 5 s by itself {kill_alone}/{ROUNDS}, "
              f"after cleanup {kill_ok}/{ROUNDS}; "
              f"SIGTERM exit 143, nothing left {term_ok}/{ROUNDS} (time to exit median "
              f"{statistics.median(term_times)*1000:.0f} ms, max {max(term_times)*1000:.0f} ms); "
              f"timeout with stubborn workers exit 124, nothing left {timeout_ok}/{ROUNDS}")
        subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)


def phases(manifest, image, work, source, env, rounds):
    """Where a trivial batch's time goes: the median of each `-v` phase line's offset
    (time since the batch started), and of the whole command."""
    marks = {}
    totals = []
    for _ in range(rounds):
        t = time.perf_counter()
        out = subprocess.run(batch_cmd(manifest, image, work, "trivial", source, "bench") + ["-v"],
                             env=dict(env, CIBOX_LOG="info"), capture_output=True, text=True).stderr
        totals.append(time.perf_counter() - t)
        for line in out.splitlines():
            # `cibox: batch trivial:    create [   0.1s] …`
            if "batch trivial:" in line and "[" in line and "s]" in line:
                head = line.split("batch trivial:", 1)[1]
                name = head.split("[", 1)[0].strip()
                at = float(head.split("[", 1)[1].split("s]", 1)[0])
                marks.setdefault(name, []).append(at)
    shown = ", ".join(f"{k} {statistics.median(v) * 1000:.0f}" for k, v in marks.items())
    print(f"  a trivial batch's phases (ms since the batch started, medians): {shown}; "
          f"the whole command {statistics.median(totals) * 1000:.0f} ms")


def many(manifest, image, work, env):
    """50 trivial batches over a 12,000-file source: one cibox run against 50 docker runs
    that bind the source read-only."""
    src = os.path.join(work, "tree-src")
    for i in range(12000):
        d = os.path.join(src, f"pkg{i % 120}", f"mod{i % 9}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}.py"), "w") as f:
            f.write("x = 1\n" * (1 + i % 60))
    names = [f"t{i:02d}" for i in range(50)]
    with open(manifest, "a") as f:
        for n in names:
            f.write(f"  {n}: {{gpus: 0, timeout: 1m, run: [\"true\"], allow_empty: true}}\n")
    rounds = max(1, ROUNDS // 5)
    a, b = [], []
    for _ in range(rounds):
        t, code, _ = timed([CIBOX, "--manifest", manifest, "batch", "run", *names, "--image", image,
                            "--source", src, "--reports", os.path.join(work, "reports"),
                            "--scope", "bench"], env=env)
        assert code == 0, f"cibox exited {code}"
        a.append(t)
        t = time.perf_counter()
        for _ in names:
            subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{src}:/work:ro", image, "true"],
                           check=True, capture_output=True)
        b.append(time.perf_counter() - t)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"50 batches, 12,000-file source: cibox {ma:6.1f} s ({ma / 50 * 1000:.0f} ms a batch)   "
          f"50 x docker run -v SRC:/work:ro {mb:6.1f} s ({mb / 50 * 1000:.0f} ms a run)   ratio {ma / mb:.2f} (target <= 1.2)")
    phases(manifest, image, work, src, env, 5)


if __name__ == "__main__":
    main()
