#!/bin/sh
# Every GPU test says how many GPUs it needs, as `cibox changed` reads it.
set -eu
for f in tests/test_*.py; do
  grep -q '^NUM_GPUS = [0-9][0-9]*$' "$f" || { echo "$f: no NUM_GPUS" >&2; exit 1; }
done
echo "markers ok"
