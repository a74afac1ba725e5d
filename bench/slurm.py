#!/usr/bin/env python3
"""Sixteen GPU jobs on a 2-node Slurm cluster (4 GPUs a node), side by side in one run.

The mix: sizes 4,1,1,2,4,1,2,4,1,2,2,1,1,2,2,4 GPUs, each job 10 s, all started together
on the emulated cluster of .ci/setup-host.sh (nodes n1 and n2 on this machine):
  srun     -- the anchor, what the cluster itself gives: 16 bare `srun --gres=gpu:N
              sleep 10` at once
  cibox    -- `cibox layer run mix --parallel` under a host policy with `scheduler:
              slurm`: each batch a Slurm job whose node runs a disposable container
              (on the GPU engine double of .ci/gpu-engine.sh) on the GPUs Slurm gave
  random   -- what GitHub does, dealing jobs to runners: each job to n1 or n2 at random
              (one draw per seed), all started at once, each a local `cibox batch run`
              that leases GPUs of its node's own (cibox's fair queue, its own lock dir)
Prints each makespan, its ratio to the GPU-seconds bound (sum of size x 10 s / 8 GPUs)
and to srun's, and for the random dealings the ratio of cibox's makespan to theirs.
Usage: bench/slurm.py [path/to/cibox] [SEEDS] [SECONDS]
       (defaults: target/release/cibox, 1,2,3, 10; as root, after .ci/setup-host.sh)
"""
import json, os, random, shutil, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from doubles import ROOT, SMI

CIBOX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/cibox")
SEEDS = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "1,2,3").split(",")]
HOLD = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
SIZES = [4, 1, 1, 2, 4, 1, 2, 4, 1, 2, 2, 1, 1, 2, 2, 4]
NODES = ["n1", "n2"]
GPUS = 8
BOUND = sum(SIZES) * HOLD / GPUS
GPU_ENGINE = "unix:///run/cibox-gpu-docker/docker.sock"


def sh(*cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"bench/slurm.py: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr.strip()}")
    return p.stdout.strip()


def project(work):
    """A busybox project in `work`/src with one batch per job and a layer of them all;
    its image ID (built in the GPU engine double)."""
    work = os.path.join(work, "src")
    os.makedirs(os.path.join(work, ".git"))
    root = os.path.join(work, "image", "rootfs")
    for d in ["bin", "tmp", "work", "src", "reports"]:
        os.makedirs(os.path.join(root, d))
    for d in ["tmp", "work"]:
        os.chmod(os.path.join(root, d), 0o1777)
    shutil.copy("/bin/busybox", os.path.join(root, "bin/busybox"))
    for applet in sh("/bin/busybox", "--list").split():
        if applet != "busybox":
            os.symlink("busybox", os.path.join(root, "bin", applet))
    with open(os.path.join(work, "image", "Dockerfile"), "w") as f:
        f.write(f"FROM scratch\nLABEL org.cibox.bench.nonce={time.time_ns()}\nCOPY rootfs/ /\nENV PATH=/bin\n")
    batches = "".join(
        f"  j{i:02}: {{gpus: {n}, timeout: 5m, allow_empty: true, run: [\"sleep {HOLD}\"]}}\n"
        for i, n in enumerate(SIZES))
    with open(os.path.join(work, "cibox.yaml"), "w") as f:
        f.write("version: 1\nproject: bench\nimage: {locks: [image/Dockerfile], dockerfile: image/Dockerfile}\n"
                "container: {memory: 256m, pids: 128}\nbatches:\n" + batches +
                "layers:\n  mix: {batches: all}\n")
    os.chmod(work, 0o755)
    env = dict(os.environ, DOCKER_HOST=GPU_ENGINE, CIBOX_LOG="error")
    return sh(CIBOX, "--manifest", os.path.join(work, "cibox.yaml"), "image", "build", env=env)


def run_cmd(work, *args):
    """`cibox ARGS` on the project, its source the project (the reports, locks and GPU
    state lie beside it, not in it)."""
    src = os.path.join(work, "src")
    return [CIBOX, "--manifest", os.path.join(src, "cibox.yaml"), *args, "--source", src]


def gpu_state(work):
    """The fake GPUs: each node's own state folder (the fixture picks it by
    SLURMD_NODENAME), 4 idle GPUs each."""
    state = os.path.join(work, "state")
    for n, node in enumerate(NODES):
        d = os.path.join(state, "nodes", node)
        os.makedirs(d)
        with open(os.path.join(d, "gpus.csv"), "w") as f:
            f.writelines(f"{i}, GPU-be0c0000-0000-0000-000{n}-{i:012}, 0, 81559, 0\n" for i in range(4))
        open(os.path.join(d, "apps.csv"), "w").close()
    open(os.path.join(state, "gpus.csv"), "w").close()
    open(os.path.join(state, "apps.csv"), "w").close()
    return state


def wait_all(procs):
    return [p.wait() for p in procs]


def bare_srun(tag):
    t = time.perf_counter()
    procs = [subprocess.Popen(["srun", f"--job-name=bench-srun-{tag}-{i}", "--nodes=1",
                               f"--gres=gpu:{n}", "--time=5", "sleep", str(HOLD)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i, n in enumerate(SIZES)]
    codes = wait_all(procs)
    assert all(c == 0 for c in codes), f"srun exits: {codes}"
    return time.perf_counter() - t


def cibox_slurm(work, image, state):
    # Outside the source: a policy in a checkout is never read.
    policy = os.path.join(tempfile.mkdtemp(prefix="cibox-bench-policy-"), "host.yaml")
    locks = os.path.join(work, "locks-slurm")
    with open(policy, "w") as f:
        f.write(f"version: 1\ngpu: {{lock_dir: {locks}, probe: nvidia-smi}}\nscheduler: slurm\nslurm: {{partition: gpu}}\n")
    os.chmod(policy, 0o644)
    env = dict(os.environ, DOCKER_HOST=GPU_ENGINE, CIBOX_LOG="error", CIBOX_HOST_POLICY=policy,
               CIBOX_NVIDIA_SMI=SMI, CIBOX_FAKE_SMI_STATE=state)
    reports = os.path.join(work, "reports-slurm")
    t = time.perf_counter()
    r = subprocess.run(run_cmd(work, "layer", "run", "mix", "--parallel", "--wait", "10m",
                               "--image", image, "--reports", reports, "--scope", "bench-slurm"),
                       env=env, capture_output=True, text=True)
    took = time.perf_counter() - t
    assert r.returncode == 0, f"cibox through Slurm: exit {r.returncode}\n{r.stderr[-3000:]}"
    nodes = {}
    for i in range(len(SIZES)):
        rec = json.load(open(os.path.join(reports, f"j{i:02}", "result.json")))
        nodes[rec["slurm"]["nodes"][0]] = nodes.get(rec["slurm"]["nodes"][0], 0) + 1
    return took, nodes


def random_dealing(work, image, state, seed):
    rng = random.Random(seed)
    dealt = [rng.choice(NODES) for _ in SIZES]
    procs = []
    t = time.perf_counter()
    for i, node in enumerate(dealt):
        env = dict(os.environ, DOCKER_HOST=GPU_ENGINE, CIBOX_LOG="error", CIBOX_GPU_PROBE="nvidia-smi",
                   CIBOX_NVIDIA_SMI=SMI, CIBOX_FAKE_SMI_STATE=os.path.join(state, "nodes", node),
                   CIBOX_GPU_LOCK_DIR=os.path.join(work, f"locks-{seed}-{node}"))
        env.pop("CIBOX_HOST_POLICY", None)
        procs.append(subprocess.Popen(
            run_cmd(work, "batch", "run", f"j{i:02}", "--wait", "10m", "--image", image,
                    "--reports", os.path.join(work, f"reports-{seed}-{i}"),
                    "--scope", f"bench-random-{seed}"),
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    codes = wait_all(procs)
    assert all(c == 0 for c in codes), f"random dealing (seed {seed}): exits {codes}"
    per_node = {n: sum(s for s, d in zip(SIZES, dealt) if d == n) for n in NODES}
    return time.perf_counter() - t, per_node


def main():
    # The GPU engine double (its own dockerd; idempotent, and a socket left by an engine
    # that died is no engine); the emulated cluster comes with .ci/setup-host.sh.
    subprocess.run(["bash", os.path.join(ROOT, ".ci/gpu-engine.sh")], check=True)
    work = tempfile.mkdtemp(prefix="cibox-bench-slurm-")
    image = None
    try:
        image = project(work)
        state = gpu_state(work)
        print(f"16 jobs of {HOLD:.0f} s on 2 nodes x 4 GPUs; GPU-seconds bound {BOUND:.1f} s")
        srun = bare_srun("a")
        cibox, spread = cibox_slurm(work, image, state)
        rows = [("bare srun --gres", srun, ""), ("cibox through Slurm", cibox,
                f"jobs per node {spread}")]
        randoms = []
        for seed in SEEDS:
            took, per_node = random_dealing(work, image, state, seed)
            randoms.append(took)
            rows.append((f"random dealing, seed {seed}", took, f"GPUs asked per node {per_node}"))
        srun2 = bare_srun("b")
        rows.append(("bare srun --gres (again)", srun2, ""))
        anchor = min(srun, srun2)
        print(f"{'':28} {'makespan':>9} {'/bound':>7} {'/srun':>6}")
        for name, took, note in rows:
            print(f"{name:28} {took:8.1f}s {took / BOUND:7.2f} {took / anchor:6.2f}  {note}")
        print(f"cibox through Slurm / bare srun: {cibox / anchor:.2f}x (target within 1.1x)")
        for seed, took in zip(SEEDS, randoms):
            verdict = "better" if cibox < took else "NOT better"
            print(f"cibox through Slurm / random dealing seed {seed}: {cibox / took:.2f}x ({verdict})")
    finally:
        if image:
            subprocess.run(["docker", "-H", GPU_ENGINE, "rmi", "-f", image], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
