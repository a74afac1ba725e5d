#!/usr/bin/env bash
# Builds cibox's release binary for one target and packs it as the release workflow
# publishes it (.github/workflows/release.yml):
#
#   .ci/release-build.sh TARGET OUT
#
# writes OUT/cibox-TARGET.tar.gz (the binary `cibox` alone, packed reproducibly: names
# sorted, owner 0, the commit's time) and OUT/cibox-TARGET.tar.gz.sha256 (one line, as
# `sha256sum` writes it). TARGET must be the host's own or one whose standard library
# rustup has installed (`rustup target add TARGET`); the workflow builds each target on
# a runner of its architecture, so none is cross-compiled.
set -euo pipefail
target=${1:?usage: release-build.sh TARGET OUT}
out=${2:?usage: release-build.sh TARGET OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if ! rustup target list --installed 2>/dev/null | grep -qx "$target" \
  && [ "$(rustc -vV | sed -n 's/^host: //p')" != "$target" ]; then
  echo "release-build: the standard library of $target is not installed (rustup target add $target)" >&2
  exit 2
fi
cargo build --release --locked --target "$target"
mkdir -p "$out"
name=cibox-$target.tar.gz
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
  -C "target/$target/release" -cf - cibox | gzip -n -9 >"$out/$name"
(cd "$out" && sha256sum "$name" >"$name.sha256")
cat "$out/$name.sha256"
