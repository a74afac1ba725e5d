"""Shared by the GPU benchmarks: the fixture state folder and the NVML double."""
import os, subprocess, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMI = os.path.join(ROOT, "tests/fixtures/nvidia-smi")
ROCM_SMI = os.path.join(ROOT, "tests/fixtures/rocm-smi")
DOUBLE_SRC = os.path.join(ROOT, "tests/nvml-double/src/lib.rs")


def build_double(work):
    """Builds the NVML double with plain rustc (it has no dependencies); its path."""
    out = os.path.join(work, "libnvml_double.so")
    subprocess.run(["rustc", "--edition", "2024", "--crate-type", "cdylib", "-O",
                    "--crate-name", "nvml_double", DOUBLE_SRC, "-o", out], check=True)
    return out


def state(work, gpus, smi_latency, nvml_init_latency, nvml_latency=0.0):
    """A state folder with `gpus` idle GPUs and the latencies of both doubles."""
    def put(name, text):
        with open(os.path.join(work, name), "w") as f:
            f.write(text)
    put("gpus.csv", "".join(f"{i}, GPU-11111111-2222-3333-4444-{i:012}, 0, 81559, 0\n" for i in range(gpus)))
    put("apps.csv", "")
    put("latency", f"{smi_latency}\n" if smi_latency else "")
    put("nvml_init_latency", f"{nvml_init_latency}\n" if nvml_init_latency else "")
    put("nvml_latency", f"{nvml_latency}\n" if nvml_latency else "")
    put("calls.log", "")


def amd_state(work, gpus, latency):
    """The rocm-smi double's state folder (work/amd): `gpus` idle AMD GPUs; its path."""
    amd = os.path.join(work, "amd")
    os.makedirs(amd, exist_ok=True)
    def put(name, text):
        with open(os.path.join(amd, name), "w") as f:
            f.write(text)
    put("gpus.csv", "".join(f"{i}, {amd_id(i)[4:]}, 0, 196592, 0\n" for i in range(gpus)))
    put("apps.csv", "")
    put("latency", f"{latency}\n" if latency else "")
    put("calls.log", "")
    return amd


def amd_id(i):
    """The identity of the double's AMD GPU `i` (GPU- and its unique ID)."""
    return f"GPU-{0xa5a5000000000000 + i * 0x1111:016x}"


def mig_state(work, slices):
    """Puts the fixture's GPUs in MIG mode: `slices` is (gpu index, profile) per slice.
    Returns each slice's UUID, in order."""
    uuids, lines = [], []
    for n, (gpu, profile) in enumerate(slices):
        uuid = f"MIG-5a5a5a5a-{gpu:04}-4444-8888-{n:012}"
        uuids.append(uuid)
        lines.append(f"{gpu}, {uuid}, {profile}, 0, 18432\n")
    with open(os.path.join(work, "mig.csv"), "w") as f:
        f.write("".join(lines))
    return uuids


def env_for(backend, work, locks, double):
    """The environment of a cibox run through `backend` ("nvidia-smi", "nvml" or
    "rocm-smi")."""
    env = dict(os.environ, CIBOX_FAKE_SMI_STATE=work, CIBOX_GPU_LOCK_DIR=locks, CIBOX_LOG="error")
    for k in ("CIBOX_NVIDIA_SMI", "CIBOX_NVML_LIB", "CIBOX_GPU_PROBE", "CIBOX_ROCM_SMI"):
        env.pop(k, None)
    if backend == "nvml":
        env.update(CIBOX_GPU_PROBE="nvml", CIBOX_NVML_LIB=double)
    elif backend == "rocm-smi":
        env.update(CIBOX_GPU_PROBE="rocm-smi", CIBOX_ROCM_SMI=ROCM_SMI,
                   CIBOX_FAKE_ROCM_STATE=os.path.join(work, "amd"))
    else:
        env.update(CIBOX_GPU_PROBE="nvidia-smi", CIBOX_NVIDIA_SMI=SMI)
    return env


def take_calls(work):
    """(nvidia-smi or rocm-smi calls, NVML inits, NVML probes) logged since the last take;
    clears the logs."""
    lines = []
    for path in (os.path.join(work, "calls.log"), os.path.join(work, "amd", "calls.log")):
        if os.path.exists(path):
            lines += open(path).read().splitlines()
            open(path, "w").close()
    smi = sum(1 for l in lines if l.startswith("start "))
    inits = sum(1 for l in lines if l == "nvml init")
    probes = sum(1 for l in lines if l == "nvml count")
    return smi, inits, probes
