#!/bin/sh
# Makes rootfs/ beside this script from the host's Debian busybox-static, offline:
# /bin/busybox plus one symlink per applet. Refuses a busybox that is not the one
# named in busybox.lock (pass --update-lock to record the installed one instead).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bb=${BUSYBOX:-/bin/busybox}
[ -x "$bb" ] || { echo "make-rootfs: $bb missing: apt-get install busybox-static" >&2; exit 1; }
want=$(sed -n 's/^sha256 //p' "$here/busybox.lock")
have=$(sha256sum "$bb" | cut -d' ' -f1)
if [ "${1:-}" = "--update-lock" ]; then
  ver=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo unknown)
  sed -i "s/^package .*/package busybox-static $ver/; s/^sha256 .*/sha256 $have/" "$here/busybox.lock"
  want=$have
fi
if [ "$want" != "$have" ]; then
  echo "make-rootfs: $bb has sha256 $have, busybox.lock pins $want" >&2
  echo "make-rootfs: rerun with --update-lock to move the lock (a new image, to qualify again)" >&2
  exit 1
fi
rm -rf "$here/rootfs"
mkdir -p "$here/rootfs/bin" "$here/rootfs/tmp" "$here/rootfs/work" "$here/rootfs/reports" "$here/rootfs/src"
chmod 1777 "$here/rootfs/tmp" "$here/rootfs/work"
cp "$bb" "$here/rootfs/bin/busybox"
for applet in $("$bb" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$here/rootfs/bin/$applet"
done
echo "make-rootfs: $here/rootfs ready (busybox $have)"
