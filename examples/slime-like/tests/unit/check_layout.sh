#!/bin/sh
# The source arrived as git would ship it: the library, the tests, no build output.
set -eu
test -f slime/__init__.py
test -f cibox.yaml
for f in tests/test_*.py; do test -f "$f"; done
! test -e target
echo "layout ok: $(ls tests/test_*.py | wc -l) GPU test files"
