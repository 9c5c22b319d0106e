#!/usr/bin/env bash
# Filters `go test -v` output: drops the "=== RUN/PAUSE/CONT/NAME" noise and
# keeps every verdict (--- PASS/FAIL/SKIP with reasons), every test log line and
# the per-package result lines. Exits 1 if the output reports a failure; the
# caller's `set -o pipefail` also carries go test's own exit status.
set -uo pipefail
failed=0
while IFS= read -r line; do
  case "$line" in
    "=== RUN"*|"=== PAUSE"*|"=== CONT"*|"=== NAME"*) continue ;;
    "FAIL"*|"--- FAIL"*|"panic:"*) failed=1 ;;
  esac
  printf '%s\n' "$line"
done
exit "$failed"
