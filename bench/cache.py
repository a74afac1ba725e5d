#!/usr/bin/env python3
"""The cost of a cache against a plain read-only bind, side by side in one run.

A batch reads 1 GB (8 files of 128 MiB) with dd, from
  bind              container.mounts DATA:/data (under a mount root the policy grants)
  cache, untrusted  the same bytes in a cache: an overlay over its current generation,
                    writes into a private layer in a holder container
  cache, trusted    the same, writes into the cache's own layer (promoted when the
                    batch passes: an empty layer here)
each run twice in a row: first with its files dropped from the page cache (on the
host, posix_fadvise DONTNEED; a virtual machine's disk may still be cached below it, so
these vary), then at once again (warm). Rounds alternate the sides;
medians of the whole cibox run and of the read alone (timed in the batch),
and their ratios to the bind. Also the one-off cost of filling the cache.

Then a pull request's runs (issue 38, caches.pull_requests: keep): a batch that finds
its 1 GB in the cache or else "downloads" it (copies it from the bind) into its pull
request's scope. Each round a new pull request: its first run (cold: the copy, then
the read, kept in its scope when it passes) against its second (warm: the read alone,
from its scope over the base's generation), and another pull request's first run
after them (cold again: a scope is its pull request's alone).
Usage: bench/cache.py [path/to/cibox] [rounds]   (run as root, engine up: .ci/setup-host.sh)
"""
import json, os, re, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIBOX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/cibox")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
DEMO = os.path.join(ROOT, "examples/demo/images/demo")
FILES, FILE_MIB = 8, 128

# The batches' reader: every file of the folder it is given, once, timed as a whole.
READ_SH = """#!/bin/sh
time -f 'READ %e' sh -c 'for f in "$0"/f*; do dd if="$f" of=/dev/null bs=1M 2>/dev/null; done' "$1"
"""


# A pull request's batch: warm when its scope holds the files, else it copies them in.
PR_SH = ("if [ -d /cache/data/pr ]; then echo WARM; else echo COLD; mkdir /cache/data/pr && "
         "cp /data/f* /cache/data/pr/; fi; sh /src/read.sh /cache/data/pr")


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout.strip()


def run(cmd, env):
    """Runs a cibox command; returns (seconds, seconds the batch spent reading, stdout)."""
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    took = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    reads = re.findall(r"READ ([0-9.]+)", p.stdout + p.stderr)
    if len(reads) != 1:
        sys.exit(f"expected one READ line:\n{p.stdout}\n{p.stderr}")
    return took, float(reads[0]), p.stdout


def drop(paths):
    """Drops these files' pages from the page cache (they are clean: read only)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def write_policy(path, store, data, trusted, scoped=False):
    with open(path, "w") as f:
        f.write(f"version: 1\ngrants:\n  mounts: [{data}]\n"
                f"caches:\n  root: {store}\n  trusted: {str(trusted).lower()}\n  size: 4g\n  private_size: 64m\n")
        if scoped:
            f.write(f"  projects: {{bench: {REPO}}}\n  pull_requests: keep\n")
    os.chmod(path, 0o644)


REPO = "bench/cibox"


def event_file(path, number):
    """A `pull_request_target` event of pull request `number`, as the runner writes it."""
    with open(path, "w") as f:
        json.dump({"action": "labeled", "number": number,
                   "pull_request": {"number": number, "base": {"repo": {"full_name": REPO}}},
                   "repository": {"full_name": REPO}}, f)
    os.chmod(path, 0o644)


def project(work, data):
    """A project over the demo's busybox rootfs; returns (manifest path, image ID)."""
    os.makedirs(os.path.join(work, ".git"), exist_ok=True)
    subprocess.run(["sh", os.path.join(DEMO, "make-rootfs.sh")], check=True, capture_output=True)
    img = os.path.join(work, "image")
    os.makedirs(img)
    shutil.copytree(os.path.join(DEMO, "rootfs"), os.path.join(img, "rootfs"), symlinks=True)
    with open(os.path.join(img, "Dockerfile"), "w") as f:
        # An image of its own: the demo's rootfs alone builds to the same ID as other
        # benches', which this one removes when done.
        f.write(f"FROM scratch\nLABEL org.cibox.bench=cache-{os.getpid()}-{time.time_ns()}\n"
                "COPY rootfs/ /\nENV PATH=/bin\n")
    with open(os.path.join(work, "read.sh"), "w") as f:
        f.write(READ_SH)
    manifest = os.path.join(work, "cibox.yaml")
    bind = f"container: {{mounts: [{json.dumps(data + ':/data')}]}}"
    batches = {
        "fill": f"{bind}, run: [{json.dumps('cp /data/f* /cache/data/')}]",
        "bind": f"caches: [], {bind}, run: [\"sh /src/read.sh /data\"]",
        "cached": f"caches: [data], run: [\"sh /src/read.sh /cache/data\"]",
        # A pull request's tests: what they need from the cache, or else fetched.
        "pr": f"{bind}, run: [{json.dumps(PR_SH)}]",
    }
    with open(manifest, "w") as f:
        f.write("version: 1\nproject: bench\nimage: {locks: [image/Dockerfile], dockerfile: image/Dockerfile}\n"
                "container: {memory: 1g, pids: 256}\ncaches:\n  data: /cache/data\nbatches:\n"
                + "".join(f"  {name}: {{gpus: 0, timeout: 10m, allow_empty: true, {rest}}}\n"
                          for name, rest in batches.items()))
    image = sh(CIBOX, "--manifest", manifest, "image", "build")
    return manifest, image


def main():
    if os.geteuid() != 0:
        sys.exit("run as root (the store and the data are root's, as on a CI host)")
    # Mount sources may not lie under /tmp or /var: the data and the store go in /srv.
    os.makedirs("/srv", exist_ok=True)
    base = tempfile.mkdtemp(prefix="cibox-bench-cache-", dir="/srv")
    work = tempfile.mkdtemp(prefix="cibox-bench-cache-")
    os.chmod(work, 0o755)
    image = None
    try:
        os.chmod(base, 0o755)
        data, store = os.path.join(base, "data"), os.path.join(base, "store")
        os.makedirs(data)
        os.makedirs(store)
        os.chmod(store, 0o755)
        chunk = os.urandom(1 << 20)
        for i in range(FILES):
            with open(os.path.join(data, f"f{i}"), "wb") as f:
                for j in range(FILE_MIB):
                    f.write(bytes([j % 256]) + chunk[1:])
        policies = {}
        for trusted in (False, True):
            policies[trusted] = os.path.join(base, f"policy-{trusted}.yaml")
            write_policy(policies[trusted], store, data, trusted)
        manifest, image = project(work, data)

        def cmd(name, scope="bench-cache"):
            return [CIBOX, "--manifest", manifest, "batch", "run", name, "--image", image, "--source", work,
                    "--reports", os.path.join(work, "reports"), "--scope", scope]

        def env(trusted):
            return dict(os.environ, CIBOX_LOG="error", CIBOX_HOST_POLICY=policies[trusted])

        t = time.perf_counter()
        p = subprocess.run(cmd("fill"), capture_output=True, text=True, env=env(True))
        fill = time.perf_counter() - t
        if p.returncode != 0:
            sys.exit(f"fill: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
        cache_dir = os.path.join(store, "bench", "data")

        def cache_files():
            gen = open(os.path.join(cache_dir, "current")).read().strip()
            return [os.path.join(cache_dir, "gens", gen, f"f{i}") for i in range(FILES)]

        assert len(cache_files()) == FILES and all(os.path.getsize(f) == FILE_MIB << 20 for f in cache_files())
        bind_files = [os.path.join(data, f"f{i}") for i in range(FILES)]
        sides = {
            "bind": (lambda: bind_files, "bind", False),
            "cache, untrusted": (cache_files, "cached", False),
            "cache, trusted": (cache_files, "cached", True),
        }
        got = {s: {"first": [], "second": [], "first_read": [], "second_read": []} for s in sides}
        print(f"image {image}; {FILES} x {FILE_MIB} MiB; {ROUNDS} rounds; filling the cache (trusted, "
              f"cp from the bind, then promoted): {fill:.1f} s\n")
        names = list(sides)
        for r in range(ROUNDS):
            for side in names[r % len(names):] + names[:r % len(names)]:
                files, batch, trusted = sides[side]
                drop(files())
                took, read, _ = run(cmd(batch), env(trusted))
                got[side]["first"].append(took)
                got[side]["first_read"].append(read)
                took, read, _ = run(cmd(batch), env(trusted))
                got[side]["second"].append(took)
                got[side]["second_read"].append(read)
        med = {s: {k: statistics.median(v) for k, v in got[s].items()} for s in sides}
        b = med["bind"]
        print(f"{'':18} {'first run (cold)':>30} {'second run (warm)':>30}")
        print(f"{'':18} {'whole run':>14} {'read 1 GB':>15} {'whole run':>14} {'read 1 GB':>15}")
        for s in sides:
            m = med[s]
            print(f"{s:18} {m['first']:12.2f} s {m['first_read']:12.2f} s  {m['second']:12.2f} s {m['second_read']:12.2f} s")
        print("\nratio to the bind (medians):")
        for s in ("cache, untrusted", "cache, trusted"):
            m = med[s]
            print(f"{s:18} first: whole {m['first']/b['first']:.2f}, read {m['first_read']/b['first_read']:.2f}   "
                  f"second: whole {m['second']/b['second']:.2f}, read {m['second_read']/b['second_read']:.2f}")
        pull_requests(cmd, base, store, data)
    finally:
        if image:
            subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


def pull_requests(cmd, base, store, data):
    """A pull request's first run (cold) against its second (warm), and another's first."""
    policy = os.path.join(base, "policy-scoped.yaml")
    write_policy(policy, store, data, True, scoped=True)
    got = {"first": [], "second": [], "other": []}
    for r in range(ROUNDS):
        number = 1000 + 2 * r
        for key, n in (("first", number), ("second", number), ("other", number + 1)):
            event = os.path.join(base, f"event-{n}.json")
            event_file(event, n)
            env = dict(os.environ, CIBOX_LOG="error", CIBOX_HOST_POLICY=policy,
                       GITHUB_EVENT_NAME="pull_request_target", GITHUB_EVENT_PATH=event,
                       GITHUB_REPOSITORY=REPO)
            took, _, out = run(cmd("pr"), env)
            want = "WARM" if key == "second" else "COLD"
            if want not in out.split():
                sys.exit(f"pull request {n}'s {key} run: expected {want}:\n{out}")
            got[key].append(took)
        for n in (number, number + 1):
            shutil.rmtree(os.path.join(store, "bench", "data", "pulls", str(n)), ignore_errors=True)
    m = {k: statistics.median(v) for k, v in got.items()}
    print(f"\na pull request's runs ({ROUNDS} pull requests, medians of the whole run):")
    print(f"  first (cold: copies 1 GB in, kept in its scope)  {m['first']:8.2f} s")
    print(f"  second (warm: reads it from its scope)           {m['second']:8.2f} s   ({m['first']/m['second']:.1f}x faster)")
    print(f"  another pull request's first (cold again)        {m['other']:8.2f} s")


if __name__ == "__main__":
    main()
