#!/usr/bin/env python3
"""`cibox image build` against `DOCKER_BUILDKIT=1 docker build` of the same recipe, side by
side in one run: cold (nothing of the recipe in the build cache) and warm (built a moment
before, every step cached).

The recipe is vLLM's shape (issue 35): docker/Dockerfile built from the repository's root
for its `test` stage; a `deps` stage that copies a requirements file and runs a step
with a `RUN --mount=type=cache` mount, writing 40 MB; a source tree of 50 MB (500 files)
copied into the target from outside docker/; a stage the target does not need. The base
is busybox (Debian's busybox-static) FROM scratch, so nothing is pulled.

docker's side is the engine's own client (/usr/bin/docker, Debian's 20.10: the Docker 28
client first on PATH wants buildx for BuildKit), with its context sent as BuildKit's
file sync sends it; cibox's side sends a tar of the context, then saves what the engine
built, normalises it (file times, entry order, builder fields) and loads it. Cold: each
side, each round, gets a fresh nonce in the first step, so no step is cached (the cache
mount itself stays, as on a CI host). Rounds alternate which side goes first; medians
and the ratios cibox/docker.

With --base-mib N (issue 44's shape): a base of N MiB of random data and busybox,
imported locally (`docker import`), and a recipe FROM it with a COPY, a RUN writing
10 MB and a last COPY; three cases, each side by side with `docker build`: warm (nothing
changed), top (the last COPY's file changed) and cold (the first COPY's file changed:
every step runs again). cibox's peak memory (its maximum resident set) is printed for
each case.

Usage: bench/image_build.py [path/to/cibox] [rounds] [--base-mib N]
       (engine up: .ci/setup-host.sh)
Removes only the images it names (its own tags).
"""
import os, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = [a for a in sys.argv[1:]]
BASE_MIB = None
if "--base-mib" in ARGS:
    i = ARGS.index("--base-mib")
    BASE_MIB = int(ARGS[i + 1])
    del ARGS[i:i + 2]
CIBOX = os.path.abspath(ARGS[0]) if len(ARGS) > 0 else os.path.join(ROOT, "target/release/cibox")
ROUNDS = int(ARGS[1]) if len(ARGS) > 1 else 5
DOCKER = "/usr/bin/docker"
SRC_FILES, SRC_KIB = 500, 100

DOCKERFILE = """FROM scratch AS base
COPY rootfs/ /
ENV PATH=/bin
FROM base AS deps
COPY nonce requirements.txt /deps/
RUN --mount=type=cache,id=cibox-bench-image-build,target=/root/.cache \\
    sh -c 'mkdir -p /root/.cache/wheels /opt/venv && for i in $(seq 1 40); do \\
      test -e /root/.cache/wheels/w$i || head -c 1048576 /dev/zero > /root/.cache/wheels/w$i; \\
      cp /root/.cache/wheels/w$i /opt/venv/; done'
FROM deps AS test
COPY src /workspace/src
COPY pyproject.toml /workspace/
FROM test AS never
RUN false
"""


def sh(*cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout.strip()


def timed(cmd, cwd, env=None):
    t = time.perf_counter()
    out = sh(*cmd, cwd=cwd, env=env)
    return time.perf_counter() - t, out


def timed_rss(cmd, cwd, env=None):
    """Seconds, stdout and the process's resource usage (its peak resident set)."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err)
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        took = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{out.decode()}\n{err.read().decode()}")
    return took, out.decode().strip(), usage


BIG_DOCKERFILE = """FROM {base}
COPY nonce /nonce
RUN head -c 10485760 /dev/zero > /ten-mb && cat /nonce >> /ten-mb
COPY top /top
"""


def big_base(mib, work):
    """Imports a base of `mib` MiB of random data and busybox; returns its tag."""
    tag = f"cibox-bench-image-base:{mib}mib-{os.getpid()}"
    root = f"{work}/base"
    os.makedirs(f"{root}/bin")
    os.makedirs(f"{root}/data")
    shutil.copy("/bin/busybox", f"{root}/bin/busybox")
    for a in sh("/bin/busybox", "--list").split():
        if a != "busybox":
            os.symlink("busybox", f"{root}/bin/{a}")
    left = mib
    n = 0
    while left > 0:
        chunk = min(left, 256)
        with open(f"{root}/data/blob{n:03}", "wb") as f:
            for _ in range(chunk):
                f.write(os.urandom(1 << 20))
        left -= chunk
        n += 1
    tar = f"{work}/base.tar"
    sh("tar", "-C", root, "-cf", tar, ".")
    sh(DOCKER, "import", tar, tag)
    os.remove(tar)
    shutil.rmtree(root)
    return tag


def main_big(mib):
    if not os.access(CIBOX, os.X_OK):
        sys.exit(f"{CIBOX}: build it first (cargo build --release)")
    work = tempfile.mkdtemp(prefix="cibox-bench-image-big-")
    tags, ids, base = [], set(), None
    cases = ("warm", "top", "cold")
    times = {f"{side} {c}": [] for c in cases for side in ("cibox", "docker")}
    rss = {c: [] for c in cases}
    try:
        t = time.perf_counter()
        base = big_base(mib, work)
        print(f"base {base}: {mib} MiB of random data, imported in {time.perf_counter() - t:.1f}s")
        proj = f"{work}/p"
        os.makedirs(f"{proj}/.git")
        with open(f"{proj}/Dockerfile", "w") as f:
            f.write(BIG_DOCKERFILE.format(base=base))
        with open(f"{proj}/cibox.yaml", "w") as f:
            f.write("version: 1\nproject: bench-image-big\nimage:\n  locks: [Dockerfile]\n"
                    "  dockerfile: Dockerfile\nbatches:\n  b: {gpus: 0, timeout: 1m, run: [\"true\"]}\n")
        env = dict(os.environ, DOCKER_BUILDKIT="1")

        def cibox_build():
            took, out, usage = timed_rss([CIBOX, "image", "build"], proj)
            ids.add(out.splitlines()[-1])
            return took, usage

        def docker_build(n):
            tag = f"cibox-bench-image-build:big-{os.getpid()}-{n}"
            tags.append(tag)
            took, _ = timed([DOCKER, "build", "-q", "-t", tag, "."], proj, env)
            return took, None

        def write(name, text):
            with open(f"{proj}/{name}", "w") as f:
                f.write(text)

        write("nonce", "first\n")
        write("top", "first\n")
        for side in ("cibox", "docker"):
            (cibox_build() if side == "cibox" else docker_build(0))
        for r in range(ROUNDS):
            order = ["cibox", "docker"] if r % 2 == 0 else ["docker", "cibox"]
            for case in cases:
                for side in order:
                    if case == "top":
                        write("top", f"{side} {r} {time.time_ns()}\n")
                    elif case == "cold":
                        write("nonce", f"{side} {r} {time.time_ns()}\n")
                    took, usage = cibox_build() if side == "cibox" else docker_build(f"{r}-{case}")
                    times[f"{side} {case}"].append(took)
                    if usage is not None:
                        rss[case].append(usage.ru_maxrss / 1024)
        print(f"\n{'':14} {'median':>9} {'min':>9} {'max':>9}")
        med = {}
        for k, v in times.items():
            med[k] = statistics.median(v)
            print(f"{k:14} {med[k]:8.2f}s {min(v):8.2f}s {max(v):8.2f}s")
        print(f"\nratio cibox/docker (medians), base {mib} MiB; cibox's peak memory:")
        for c in cases:
            print(f"  {c}: {med['cibox ' + c] / med['docker ' + c]:.2f}x  "
                  f"(cibox {med['cibox ' + c]:.2f}s, docker {med['docker ' + c]:.2f}s); "
                  f"peak {max(rss[c]):.0f} MiB")
    finally:
        for tag in tags:
            subprocess.run([DOCKER, "rmi", tag], capture_output=True)
        for i in ids:
            subprocess.run([DOCKER, "rmi", "-f", i], capture_output=True)
        if base:
            subprocess.run([DOCKER, "rmi", base], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def make_project(d):
    os.makedirs(f"{d}/.git")
    os.makedirs(f"{d}/docker")
    with open(f"{d}/docker/Dockerfile", "w") as f:
        f.write(DOCKERFILE)
    with open(f"{d}/cibox.yaml", "w") as f:
        f.write("version: 1\nproject: bench-image-build\nimage:\n"
                "  locks: [docker/Dockerfile, requirements.txt, pyproject.toml]\n"
                "  dockerfile: docker/Dockerfile\n  context: .\n  target: test\n"
                "batches:\n  b: {gpus: 0, timeout: 1m, run: [\"true\"]}\n")
    with open(f"{d}/requirements.txt", "w") as f:
        f.write("torch==2.9.0\nnumpy==2.3.4\n")
    with open(f"{d}/pyproject.toml", "w") as f:
        f.write("[project]\nname = \"bench\"\n")
    with open(f"{d}/.dockerignore", "w") as f:
        f.write(".git\n")
    os.makedirs(f"{d}/src")
    for i in range(SRC_FILES):
        with open(f"{d}/src/m{i:04}.py", "wb") as f:
            f.write((f"# module {i}\n".encode() * (SRC_KIB * 1024 // 12 + 1))[: SRC_KIB * 1024])
    root = f"{d}/rootfs"
    os.makedirs(f"{root}/bin")
    shutil.copy("/bin/busybox", f"{root}/bin/busybox")
    for a in sh("/bin/busybox", "--list").split():
        if a != "busybox":
            os.symlink("busybox", f"{root}/bin/{a}")


def main():
    if not os.access(CIBOX, os.X_OK):
        sys.exit(f"{CIBOX}: build it first (cargo build --release)")
    work = tempfile.mkdtemp(prefix="cibox-bench-image-")
    tags, ids = [], set()
    times = {k: [] for k in ("cibox cold", "docker cold", "cibox warm", "docker warm")}
    try:
        make_project(work)
        print(f"{SRC_FILES} source files of {SRC_KIB} KiB, 40 MB written under a cache mount; "
              f"{ROUNDS} rounds; cibox {CIBOX}; docker {DOCKER} (DOCKER_BUILDKIT=1)")

        def cibox_build():
            took, out = timed([CIBOX, "image", "build"], work)
            ids.add(out.splitlines()[-1])
            return took

        def docker_build(n):
            tag = f"cibox-bench-image-build:docker-{n}"
            tags.append(tag)
            env = dict(os.environ, DOCKER_BUILDKIT="1")
            took, _ = timed([DOCKER, "build", "-q", "--target", "test", "-f", "docker/Dockerfile",
                             "-t", tag, "."], work, env)
            return took

        sides = {"cibox": lambda n: cibox_build(), "docker": docker_build}
        # One round of each first, to warm the page cache and the engine.
        for side in sides:
            with open(f"{work}/nonce", "w") as f:
                f.write(f"warm-up {side} {time.time_ns()}\n")
            sides[side](0)
        for r in range(ROUNDS):
            order = ["cibox", "docker"] if r % 2 == 0 else ["docker", "cibox"]
            for side in order:
                with open(f"{work}/nonce", "w") as f:
                    f.write(f"{side} {r} {time.time_ns()}\n")
                times[f"{side} cold"].append(sides[side](r + 1))
                times[f"{side} warm"].append(sides[side](r + 1))
        print(f"\n{'':14} {'median':>9} {'min':>9} {'max':>9}")
        med = {}
        for k, v in times.items():
            med[k] = statistics.median(v)
            print(f"{k:14} {med[k]:8.2f}s {min(v):8.2f}s {max(v):8.2f}s")
        print("\nratio cibox/docker (medians):")
        for state in ("cold", "warm"):
            print(f"  {state}: {med['cibox ' + state] / med['docker ' + state]:.2f}x  "
                  f"(cibox {med['cibox ' + state]:.2f}s, docker {med['docker ' + state]:.2f}s)")
    finally:
        for tag in tags:
            subprocess.run([DOCKER, "rmi", tag], capture_output=True)
        for i in ids:
            subprocess.run([DOCKER, "rmi", "-f", i], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if BASE_MIB:
        main_big(BASE_MIB)
    else:
        main()
