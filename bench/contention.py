#!/usr/bin/env python3
"""GPU contention, side by side in one run.

16 jobs of sizes 8,1,1,2,4,1,2,8,1,4,2,1,1,2,4,8, each holding its GPUs 2 s, started
together on 8 GPUs:
  naive       -- the old wrapper's loop: flock(LOCK_NB) per GPU scanning upwards, keep
                 what it gets, release all and sleep 5*random() s when short (slime's
                 script); it never asks the driver
  nvidia-smi  -- `cibox gpu exec --count N --wait 300s` probing through the nvidia-smi
                 fixture, every call of which first sleeps SMI_LATENCY (a real
                 nvidia-smi's start-up)
  nvml        -- the same through the NVML double, whose init sleeps NVML_INIT (a real
                 NVML's driver initialisation) and each call NVML_CALL
Prints makespan against the ideal (sum of size x 2 s / 8 = 12.5 s), the overlaps (GPUs
held by two jobs at once: must be 0) and the driver calls made. Each cibox backend runs
twice: spawned back to back (arrival order is whatever order the 16 processes reach the
queue) and spawned 20 ms apart (arrival in the listed order).
With --mixed (issue 34), a mixed host instead: GPUs 0-3 H100s and 4-7 A100s (the
doubles' `gpu_name.<index>`), the same 16 jobs (sizes capped at 4) asking
`--model '*H100*'` and `--model '*A100*'` in turn; ideal is the larger model's share
(each model's GPU-seconds over its 4 GPUs), and a job holding a GPU of the other model
counts as a wrong model (must be 0).
With --amd (issue 34), an AMD host: 8 GPUs behind the rocm-smi double (each call sleeps
SMI_LATENCY, as a real rocm-smi's Python start-up), the same 16 jobs, ideal 12.5 s.
With --mig (issue 34), a MIG pool: two H200s in MIG mode, four 1g.18gb slices each (8
units), the same 16 jobs asking `--model '*MIG 1g.18gb'`, through both NVIDIA backends;
ideal 12.5 s; a slice held by two jobs at once is an overlap.
Usage: bench/contention.py [--mixed|--amd|--mig] [path/to/cibox] [SMI_LATENCY] [NVML_INIT] [NVML_CALL]
       (defaults: target/release/cibox, 0.3, 0.3, 0)
"""
import os, subprocess, sys, tempfile, time

from doubles import ROOT, amd_state, build_double, env_for, mig_state, state, take_calls

MODE = next((m for m in ("--mixed", "--amd", "--mig") if m in sys.argv), None)
if MODE:
    sys.argv.remove(MODE)
MIXED = MODE == "--mixed"

CIBOX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/cibox")
SMI_LATENCY = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
NVML_INIT = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
NVML_CALL = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
SIZES = [8, 1, 1, 2, 4, 1, 2, 8, 1, 4, 2, 1, 1, 2, 4, 8]
HOLD = 2.0
GPUS = 8
IDEAL = sum(SIZES) * HOLD / GPUS
# The mixed host: which model each job asks (in turn), its size capped at a model's 4 GPUs.
MODELS = ["*H100*", "*A100*"]
MIXED_JOBS = [(MODELS[i % 2], min(size, 4)) for i, size in enumerate(SIZES)]
OWN = {"*H100*": {f"GPU-11111111-2222-3333-4444-{i:012}" for i in range(4)},
       "*A100*": {f"GPU-11111111-2222-3333-4444-{i:012}" for i in range(4, 8)}}
MIXED_IDEAL = max(sum(s for m, s in MIXED_JOBS if m == model) * HOLD / 4 for model in MODELS)

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


def run(kind, work, double, stagger, jobs_asked=None, visible="CUDA_VISIBLE_DEVICES"):
    log = os.path.join(work, f"{kind}-{stagger}.log")
    locks = os.path.join(work, f"{kind}-{stagger}-locks")
    os.makedirs(locks)
    env = env_for(kind, work, locks, double)
    take_calls(work)
    t0 = time.time()
    procs = []
    jobs_asked = jobs_asked or (MIXED_JOBS if MIXED else [(None, s) for s in SIZES])
    for i, (model, size) in enumerate(jobs_asked):
        if kind == "naive":
            cmd = [sys.executable, "-c", NAIVE, locks, str(size), str(HOLD), log, f"job{i}"]
        else:
            script = f'python3 -c "import time; s=time.time(); time.sleep({HOLD}); e=time.time(); open(\'{log}\',\'a\').write(f\'job{i} {{s}} {{e}} ${visible}\\n\')"'
            model_args = ["--model", model] if model else []
            cmd = [CIBOX, "gpu", "exec", *model_args, "--count", str(size), "--wait", "300s", "--", "sh", "-c", script]
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
    if MIXED:
        wrong = sum(1 for tag, _, _, gpus in jobs
                    if not gpus <= OWN[MIXED_JOBS[int(tag[3:])][0]])
        overlaps = (overlaps, wrong)
    return makespan, overlaps, take_calls(work)


def main_mixed():
    with tempfile.TemporaryDirectory() as work:
        double = build_double(work)
        state(work, GPUS, SMI_LATENCY, NVML_INIT, NVML_CALL)
        for i in range(4, 8):
            with open(os.path.join(work, f"gpu_name.{i}"), "w") as f:
                f.write("NVIDIA A100-SXM4-80GB\n")
        print(f"mixed host: GPUs 0-3 H100, 4-7 A100; 16 jobs {MIXED_JOBS}, {HOLD:.0f} s each; "
              f"ideal makespan {MIXED_IDEAL:.1f} s; nvidia-smi {SMI_LATENCY:g} s per call; "
              f"NVML init {NVML_INIT:g} s, {NVML_CALL:g} s per call")
        for kind, stagger, how in (("nvidia-smi", 0, "together"), ("nvidia-smi", 0.02, "in order"),
                                   ("nvml", 0, "together"), ("nvml", 0.02, "in order")):
            makespan, (overlaps, wrong), (smi, inits, probes) = run(kind, work, double, stagger)
            calls = {"nvidia-smi": f"{smi} nvidia-smi calls",
                     "nvml": f"{inits} NVML inits, {probes} NVML probes"}[kind]
            print(f"{kind:10s} {how:8s} makespan {makespan:5.1f} s = {makespan / MIXED_IDEAL:.2f} x ideal, "
                  f"overlaps {overlaps}, wrong model {wrong}, {calls}")


def main():
    with tempfile.TemporaryDirectory() as work:
        double = build_double(work)
        state(work, GPUS, SMI_LATENCY, NVML_INIT, NVML_CALL)
        print(f"16 jobs, sizes {SIZES}, {HOLD:.0f} s each, {GPUS} GPUs; ideal makespan {IDEAL:.1f} s; "
              f"nvidia-smi {SMI_LATENCY:g} s per call; NVML init {NVML_INIT:g} s, {NVML_CALL:g} s per call")
        results = {}
        for kind, stagger, how in (("naive", 0, "together"),
                                   ("nvidia-smi", 0, "together"), ("nvidia-smi", 0.02, "in order"),
                                   ("nvml", 0, "together"), ("nvml", 0.02, "in order")):
            makespan, overlaps, (smi, inits, probes) = run(kind, work, double, stagger)
            results[(kind, how)] = makespan
            calls = {"naive": "no driver calls", "nvidia-smi": f"{smi} nvidia-smi calls",
                     "nvml": f"{inits} NVML inits, {probes} NVML probes"}[kind]
            print(f"{kind:10s} {how:8s} makespan {makespan:5.1f} s = {makespan / IDEAL:.2f} x ideal, "
                  f"overlaps {overlaps}, {calls}")
        naive = results[("naive", "together")]
        for kind in ("nvidia-smi", "nvml"):
            print(f"{kind:10s} together: {naive / results[(kind, 'together')]:.2f} x faster than naive")


def main_amd():
    with tempfile.TemporaryDirectory() as work:
        state(work, 0, 0, 0)
        amd_state(work, GPUS, SMI_LATENCY)
        print(f"AMD host: {GPUS} GPUs behind the rocm-smi double; 16 jobs, sizes {SIZES}, "
              f"{HOLD:.0f} s each; ideal makespan {IDEAL:.1f} s; rocm-smi {SMI_LATENCY:g} s per call")
        for stagger, how in ((0, "together"), (0.02, "in order")):
            makespan, overlaps, (smi, _, _) = run("rocm-smi", work, None, stagger,
                                                  visible="ROCR_VISIBLE_DEVICES")
            print(f"rocm-smi   {how:8s} makespan {makespan:5.1f} s = {makespan / IDEAL:.2f} x ideal, "
                  f"overlaps {overlaps}, {smi} rocm-smi calls")


def main_mig():
    with tempfile.TemporaryDirectory() as work:
        double = build_double(work)
        state(work, 2, SMI_LATENCY, NVML_INIT, NVML_CALL)
        with open(os.path.join(work, "gpu_name"), "w") as f:
            f.write("NVIDIA H200\n")
        mig_state(work, [(g, "1g.18gb") for g in (0, 1) for _ in range(4)])
        jobs = [("*MIG 1g.18gb", s) for s in SIZES]
        print(f"MIG pool: 2 H200s, 4 x 1g.18gb slices each (8 units); 16 jobs, sizes {SIZES}, "
              f"{HOLD:.0f} s each; ideal makespan {IDEAL:.1f} s; nvidia-smi {SMI_LATENCY:g} s per call; "
              f"NVML init {NVML_INIT:g} s, {NVML_CALL:g} s per call")
        for kind, stagger, how in (("nvidia-smi", 0, "together"), ("nvidia-smi", 0.02, "in order"),
                                   ("nvml", 0, "together"), ("nvml", 0.02, "in order")):
            makespan, overlaps, (smi, inits, probes) = run(kind, work, double, stagger, jobs)
            calls = {"nvidia-smi": f"{smi} nvidia-smi calls",
                     "nvml": f"{inits} NVML inits, {probes} NVML probes"}[kind]
            print(f"{kind:10s} {how:8s} makespan {makespan:5.1f} s = {makespan / IDEAL:.2f} x ideal, "
                  f"overlaps {overlaps}, {calls}")


if __name__ == "__main__":
    {"--mixed": main_mixed, "--amd": main_amd, "--mig": main_mig}.get(MODE, main)()
