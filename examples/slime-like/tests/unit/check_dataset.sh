#!/bin/sh
# slime's tests download their datasets into /root/datasets once and reuse them. Here a
# tiny stand-in: made when the cache lacks it, read from the cache when a trusted run
# made it before. Written to a temporary name first, so no run sees half a file.
set -eu
d=/root/datasets/gsm8k-mini
if [ -f "$d/train.jsonl" ]; then
  echo "dataset from cache: $(wc -l < "$d/train.jsonl") rows"
else
  mkdir -p "$d"
  for i in 1 2 3; do echo "{\"question\": $i}"; done > "$d/train.jsonl.part"
  mv "$d/train.jsonl.part" "$d/train.jsonl"
  echo "dataset made: 3 rows"
fi
