#!/usr/bin/env bash
# Reads raw `go test -v` output on stdin and prints only what explains its
# failures: for each failed test, every line it logged (attributed through
# the "=== RUN/CONT/NAME" lines) and its "--- FAIL" verdict; each panic with
# the 60 lines after it; and the lines of a package that failed without a
# failing test (a build error, a timeout). scripts/test.sh ends with it, so
# that the tail of a failed run says why.
set -uo pipefail
awk '
  /^=== (RUN|CONT|NAME|PAUSE)/ { cur = $3; next }
  /^(FAIL|PASS)$/ { next }
  /^panic: / { panic = 60 }
  panic > 0 { print; panic--; if (panic == 0) print "…"; next }
  /^[[:space:]]*--- FAIL: / {
    name = $3
    failed[name] = 1
    verdict[name] = verdict[name] $0 "\n"
    fails++
    next
  }
  /^[[:space:]]*--- (PASS|SKIP): / { next }
  /^(ok|FAIL|\?)[[:space:]]/ {
    if ($1 == "FAIL" && NF >= 2 && fails == 0) {
      # The package failed without a failing test: show its last lines.
      print "package " $2 " failed without a failing test; its last lines:"
      start = (n > 40) ? n - 40 : 0
      for (i = start; i < n; i++) print buf[i]
    }
    if ($1 == "FAIL" || $1 == "ok") { fails = 0; n = 0; cur = "" }
    next
  }
  {
    buf[n++] = $0
    if (cur != "") logs[cur] = logs[cur] $0 "\n"
  }
  END {
    for (name in failed) {
      # Print a parent only if none of its subtests failed (they carry the messages).
      leaf = 1
      for (other in failed) if (index(other, name "/") == 1) { leaf = 0; break }
      if (!leaf) continue
      printf "%s", verdict[name]
      printf "%s", logs[name]
    }
  }
'
