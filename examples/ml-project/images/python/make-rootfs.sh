#!/bin/sh
# Makes rootfs/ beside this script with debootstrap (as root; Debian's mirror), then
# checks that the installed packages are exactly those of packages.lock. Pass
# --update-lock to record what was installed instead (a new image, to qualify again).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$here/rootfs"
debootstrap --variant=minbase --include=python3,python3-pytest bookworm "$here/rootfs" http://deb.debian.org/debian
mkdir -p "$here/rootfs/work" "$here/rootfs/src" "$here/rootfs/reports"
chmod 1777 "$here/rootfs/work"
rm -rf "$here/rootfs/var/cache/apt/archives"/*.deb "$here/rootfs/var/lib/apt/lists"/*
have=$(chroot "$here/rootfs" dpkg-query -W -f='${Package} ${Version}\n' | sort)
if [ "${1:-}" = "--update-lock" ]; then
  printf '%s\n' "$have" > "$here/packages.lock"
fi
if [ "$have" != "$(cat "$here/packages.lock")" ]; then
  echo "make-rootfs: the installed packages differ from packages.lock; rerun with --update-lock to move the lock" >&2
  exit 1
fi
echo "make-rootfs: $here/rootfs ready"
