#!/usr/bin/env bash
# The main job on the bundled example, from local files only: build the demo image from
# Debian's busybox-static, prove it matches the lock files, run the example's CPU layer
# in disposable containers, back the image up and restore it to the identical ID, and
# show what the host offers GPU batches.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bash "$root/.ci/setup-host.sh" --demo
step() { printf '\n== %s\n' "$*"; }

step "build cibox (release; a few minutes the first time)"
cargo build --release --manifest-path "$root/Cargo.toml"
cibox=("$root/target/release/cibox" --manifest "$root/examples/demo/cibox.yaml")

step "the manifest"
"${cibox[@]}" batch list

step "the lockset of the image's lock files"
"${cibox[@]}" image lockset

step "build the image (FROM scratch over busybox-static), labelled with the lockset"
sh "$root/examples/demo/images/demo/make-rootfs.sh"
# Builds are reproducible: the ID may be one this engine already holds (built by you
# earlier, or by another user). Only an image this run made is removed below.
before=$(docker images -q --no-trunc)
id=$("${cibox[@]}" image build)
ours=yes
if grep -qx "$id" <<<"$before"; then ours=no; fi

step "verify it by ID"
"${cibox[@]}" -v image verify "$id"

step "run layer 1 (the CPU batch) in a disposable, locked-down container"
reports="$root/target/demo-reports"
"${cibox[@]}" layer run 1 --image "$id" --source "$root/examples/demo" --reports "$reports"

step "back it up, remove it, restore it: the ID must come back identical"
backup="$root/target/demo-image.tar"
"${cibox[@]}" image save "$id" --to "$backup"
if [ "$ours" = yes ]; then
  docker image rm -f "$id" >/dev/null
else
  echo "the image was in this engine before this run: left in place, loaded over itself"
fi
restored=$("${cibox[@]}" image load --from "$backup")
[ "$restored" = "$id" ] || { echo "restored $restored, expected $id" >&2; exit 1; }
echo "restored $restored"

step "what this host grants batches beyond the locked-down default (its policy)"
"${cibox[@]}" host policy

step "what this host offers GPU batches (exit 5 here is expected without a GPU)"
set +e
"${cibox[@]}" doctor
echo "doctor exit code: $?"
