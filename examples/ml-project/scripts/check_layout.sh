#!/bin/sh
# Script test (no JUnit): the source was copied in, and the package is where it belongs.
set -eu
test -f mlp/tokenizer.py
test -f mlp/model.py
echo "layout: ok"
