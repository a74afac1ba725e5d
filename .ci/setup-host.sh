#!/usr/bin/env bash
# Installs and starts what cibox needs on a fresh Debian machine, saying each step.
#
#   setup-host.sh --demo   the main job (examples/demo/run-demo.sh): a Docker engine
#                          (Debian's docker.io, dockerd started in the background when no
#                          engine answers) and busybox-static (the demo image's rootfs).
#   setup-host.sh          the tests (.ci/run), on top of that: debootstrap (the Debian
#                          image of the Python test), nix-bin (offline checks of the
#                          flake), python3 (drives a pseudo-terminal in a `gpu exec`
#                          test), gcc and libc6-dev (a static helper an image test
#                          builds), docker-registry (a local registry for `image fetch`,
#                          started on 127.0.0.1:5000 without auth), cargo-nextest, and
#                          Slurm with munge (an emulated 2-node cluster with 4 fake GPUs
#                          a node; see .ci/slurm-cluster.sh).
#
# Idempotent: what is there is left as it is. bench/slurm.py starts a second engine
# of its own (.ci/gpu-engine.sh).
set -euo pipefail

demo=no
[ "${1:-}" = "--demo" ] && demo=yes

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker >/dev/null 2>&1 || need+=(docker.io)
[ -x /bin/busybox ] || need+=(busybox-static)
if [ "$demo" = yes ]; then
  :
else
[ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
command -v nix-instantiate >/dev/null 2>&1 || need+=(nix-bin)
# Debian's own: the confinement tests run it as user nobody, who cannot reach a
# python3 installed under root's home (pyenv).
[ -x /usr/bin/python3 ] || need+=(python3)
[ -x /usr/bin/docker-registry ] || need+=(docker-registry)
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
# A static C helper the image tests build (an extended attribute busybox cannot set).
command -v cc >/dev/null 2>&1 || need+=(gcc)
dpkg -s libc6-dev >/dev/null 2>&1 || need+=(libc6-dev)
# What stands for the Nix check phase's PATH (tests/it/nix/check_path.rs): stdenv's
# initial path and tools, and the package's nativeCheckInputs.
for p in coreutils findutils diffutils sed grep gawk tar gzip bzip2 make bash patch xz-utils \
  file binutils patchelf git util-linux bsdutils mount; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
fi
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-host: need root to install: ${need[*]}" >&2
    exit 1
  fi
  echo "setup-host: installing with apt: ${need[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

if [ "$demo" = no ] && ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup-host: installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-host: no Docker engine answers and only root can start dockerd" >&2
    exit 1
  fi
  echo "setup-host: starting dockerd"
  log=/var/log/cibox-dockerd.log
  nohup dockerd >"$log" 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! docker info >/dev/null 2>&1; then
    echo "setup-host: dockerd did not come up in 60 s; its log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
fi
echo "setup-host: engine $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"
if [ "$demo" = yes ]; then
  echo "setup-host: ready for the demo (the tests need more: run it without --demo)"
  exit 0
fi

# The registry the `image fetch` tests push to and pull from: loopback only (the engine
# trusts it without TLS), no auth, its own storage.
registry_up() { python3 - <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen("http://127.0.0.1:5000/v2/", timeout=2)
except Exception:
    sys.exit(1)
PY
}
if ! registry_up; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-host: no registry answers on 127.0.0.1:5000 and only root can start one" >&2
    exit 1
  fi
  echo "setup-host: starting docker-registry on 127.0.0.1:5000"
  mkdir -p /var/lib/cibox-registry
  cat >/var/lib/cibox-registry/config.yml <<'YML'
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: /var/lib/cibox-registry/data}
  delete: {enabled: true}
http:
  addr: 127.0.0.1:5000
YML
  nohup docker-registry serve /var/lib/cibox-registry/config.yml >/var/log/cibox-registry.log 2>&1 &
  for _ in $(seq 1 30); do
    registry_up && break
    sleep 1
  done
  if ! registry_up; then
    echo "setup-host: docker-registry did not come up in 30 s; its log:" >&2
    tail -n 30 /var/log/cibox-registry.log >&2
    exit 1
  fi
fi
echo "setup-host: registry on 127.0.0.1:5000"

# The emulated Slurm cluster (two slurmd on this machine, 4 fake GPUs each).
if [ "$(id -u)" = 0 ]; then
  bash "$(dirname "$0")/slurm-cluster.sh"
elif ! sinfo -h >/dev/null 2>&1; then
  echo "setup-host: no Slurm controller answers and only root can start the emulated cluster" >&2
  exit 1
else
  echo "setup-host: Slurm answers: $(sinfo -h -N -o '%N %t %G' | tr '\n' ' ')"
fi
