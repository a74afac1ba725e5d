#!/usr/bin/env bash
# A second Docker engine whose containers can be given GPUs by UUID, for the Slurm
# bench (bench/slurm.py) on machines without GPUs: Docker registers its `nvidia` device
# driver when it finds `nvidia-container-runtime-hook` on its PATH at start, and calls
# that hook before each container with GPUs starts. Here the hook is a stand-in that
# gives the container nothing, so a batch's container starts with its device request
# for the fake GPUs' UUIDs (NVIDIA_VISIBLE_DEVICES set), as on a GPU host.
#
# Its own socket, data root, exec root and bridge (cibox-gpu0, 10.213.0.1/24), no
# iptables rules: it leaves the main engine alone. Not `--bridge=none`: an engine
# started without a bridge removes the default one, docker0, which the main engine's
# containers use. Idempotent. Run as root (bench/slurm.py calls it).
set -euo pipefail

sock=/run/cibox-gpu-docker/docker.sock
hook_dir=/opt/cibox-gpu-double/bin
up() { DOCKER_HOST=unix://$sock docker info >/dev/null 2>&1; }

mkdir -p "$hook_dir" /var/lib/cibox-gpu-docker /run/cibox-gpu-docker
hook=$hook_dir/nvidia-container-runtime-hook
want=$(cat <<'HOOK'
#!/bin/sh
# A stand-in for the NVIDIA Container Toolkit's OCI hook (.ci/gpu-engine.sh): it gives
# the container nothing.
cat >/dev/null
exit 0
HOOK
)
if [ "$(cat "$hook" 2>/dev/null)" != "$want" ]; then
  printf '%s\n' "$want" >"$hook"
fi
chmod 0755 "$hook"

if ! ip link show cibox-gpu0 >/dev/null 2>&1; then
  ip link add cibox-gpu0 type bridge
  ip addr add 10.213.0.1/24 dev cibox-gpu0
  ip link set cibox-gpu0 up
fi
if ! up; then
  echo "gpu-engine: starting a second dockerd on $sock (GPU runtime stand-in)"
  PATH=$hook_dir:$PATH nohup dockerd -H "unix://$sock" \
    --data-root /var/lib/cibox-gpu-docker --exec-root /run/cibox-gpu-docker/exec \
    --pidfile /run/cibox-gpu-docker/dockerd.pid \
    --bridge=cibox-gpu0 --iptables=false --ip-masq=false \
    >/var/log/cibox-gpu-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    up && break
    sleep 1
  done
  if ! up; then
    echo "gpu-engine: the second dockerd did not come up in 60 s; its log:" >&2
    tail -n 30 /var/log/cibox-gpu-dockerd.log >&2
    exit 1
  fi
fi
echo "gpu-engine: up on unix://$sock"
