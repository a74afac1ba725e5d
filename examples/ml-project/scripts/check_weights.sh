#!/bin/sh
# Script test (no JUnit): the weights folder is mounted read-only where the manifest says.
set -eu
test -f "$WEIGHTS/vocab.txt"
! touch "$WEIGHTS/.probe" 2>/dev/null
echo "weights: $(wc -l < "$WEIGHTS/vocab.txt") vocabulary entries, read-only"
