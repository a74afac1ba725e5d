#!/usr/bin/env bash
# cibox image verify against the old way, side by side in one run:
#   old: sha256sum of the lock files + docker image inspect (what a careful script does)
#   new: cibox image verify ID (lockset + engine lookup + label checks)
# on an image whose lock files total 50 MB. Prints the mean of each and the ratio.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/.ci/setup-host.sh" >/dev/null
command -v hyperfine >/dev/null || { apt-get update -q >/dev/null; apt-get install -y -q hyperfine >/dev/null; }
cargo build --release --quiet --manifest-path "$root/Cargo.toml"
cibox="$root/target/release/cibox"

work=$(mktemp -d)
trap 'rm -rf "$work"; [ -n "${id:-}" ] && docker image rm -f "$id" >/dev/null 2>&1 || true' EXIT
mkdir -p "$work/locks" "$work/image" "$work/.git"
# 50 MB in five lock files (wheels, toolchain archives and the like are this big).
for i in 1 2 3 4 5; do head -c 10485760 /dev/urandom >"$work/locks/part$i.lock"; done
printf 'FROM scratch\nCOPY nonce /nonce\n' >"$work/image/Dockerfile"
date +%s%N >"$work/image/nonce"
cat >"$work/cibox.yaml" <<YAML
version: 1
project: bench
image: {locks: ["locks/*.lock", "image/*"], dockerfile: image/Dockerfile}
batches: {b: {gpus: 0, timeout: 1m, run: ["true"]}}
YAML
id=$("$cibox" --manifest "$work/cibox.yaml" image build 2>/dev/null)
echo "image $id, lock files $(du -shc "$work"/locks/*.lock | tail -1 | cut -f1)"

files="locks/part1.lock locks/part2.lock locks/part3.lock locks/part4.lock locks/part5.lock image/Dockerfile image/nonce"
hyperfine --style basic --warmup 3 --runs "${RUNS:-30}" --export-json "$work/h.json" \
  -n old "cd $work && sha256sum $files >/dev/null && docker image inspect $id >/dev/null" \
  -n cibox "$cibox --manifest $work/cibox.yaml image verify $id >/dev/null"
python3 - "$work/h.json" <<'PY'
import json, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
old, new = r["old"]["mean"], r["cibox"]["mean"]
print(f"old (sha256sum + docker image inspect): {old*1000:.1f} ms")
print(f"cibox image verify:                     {new*1000:.1f} ms")
print(f"ratio cibox/old: {new/old:.2f} (target <= 1.2)")
PY
