#!/usr/bin/env bash
# Runs go mod tidy in every module of the repository, as it must be run here:
# with the other dlock modules resolved to their working copies, and none of
# them listed in a go.sum (see scripts/modules.sh). A plain go mod tidy in a
# nested module would look for an unpublished version of the root, or list
# the published one in go.sum.
#
# Usage: scripts/tidy.sh [-diff]   (-diff: change nothing, print the changes
#                                   and fail if there are any)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/modules.sh

rc=0
for m in $(mod_dirs); do
  echo "-- $m"
  mod_tidy "$m" "${1:-}" || rc=1
done
exit $rc
