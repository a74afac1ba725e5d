#!/bin/sh
# A tiny test runner for the busybox image: runs tests/<suite>/test_*.sh, each a test
# case, and writes JUnit XML to $CIBOX_REPORTS/junit-<suite>.xml.
set -u
suite=${1:?usage: run.sh SUITE}
out=${CIBOX_REPORTS:-.}/junit-$suite.xml
total=0 failed=0 body=""
for t in tests/"$suite"/test_*.sh; do
  [ -e "$t" ] || continue
  name=$(basename "$t" .sh)
  total=$((total + 1))
  if log=$(sh "$t" 2>&1); then
    echo "PASS $suite/$name"
    body="$body<testcase classname=\"$suite\" name=\"$name\"/>"
  else
    failed=$((failed + 1))
    echo "FAIL $suite/$name"; echo "$log"
    msg=$(printf '%s' "$log" | tr '<>&"' '____' | head -c 500)
    body="$body<testcase classname=\"$suite\" name=\"$name\"><failure message=\"$msg\"/></testcase>"
  fi
done
printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="%s" tests="%d" failures="%d" errors="0" skipped="0">%s</testsuite>\n' \
  "$suite" "$total" "$failed" "$body" > "$out"
echo "$total tests, $failed failed"
[ "$failed" -eq 0 ]
