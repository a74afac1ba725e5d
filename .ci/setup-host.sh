#!/usr/bin/env bash
# Installs and starts what cibox's tests and demo need on a fresh Debian machine:
# a Docker engine (Debian's docker.io, dockerd started in the background when no engine
# answers), busybox-static (the demo image's rootfs), debootstrap (the Debian image of
# the Python test), nix-bin (offline checks of the flake), python3 (drives a pseudo-
# terminal in the `gpu exec` terminal test), and cargo-nextest. Idempotent.
set -euo pipefail

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker >/dev/null 2>&1 || need+=(docker.io)
[ -x /bin/busybox ] || need+=(busybox-static)
[ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
command -v nix-instantiate >/dev/null 2>&1 || need+=(nix-bin)
# Debian's own: the confinement tests run it as user nobody, who cannot reach a
# python3 installed under root's home (pyenv).
[ -x /usr/bin/python3 ] || need+=(python3)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-host: need root to install: ${need[*]}" >&2
    exit 1
  fi
  echo "setup-host: installing ${need[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

if ! cargo nextest --version >/dev/null 2>&1; then
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
