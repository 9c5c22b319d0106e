#!/usr/bin/env bash
# Runs every check and test dlock has, in every module of the repository (the
# root, and the nested modules etcd, migrate, cmd/dlock, examples and the
# peer-benchmark module bench): formatting, a go.mod tidiness check, go vet and
# staticcheck, `go test -race` against real servers (started by the tests
# themselves on free loopback ports; install them first with
# scripts/install-test-deps.sh), the peer-benchmark module's smoke test, and a
# check that docs/SAFETY.md states what this run's fault matrix observed.
#
# Tests that need a server binary skip when it is missing — except under
# CI=true, where they fail.
#
# Usage: scripts/test.sh [extra go test flags, e.g. -run Conformance]
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION=v0.8.2

step() { printf '\n== %s\n' "$*"; }

# The modules, each tested on its own (GOWORK=off), as its users build it. The
# root comes first; bench is run separately, by its smoke test.
modules=(. etcd migrate dlockotel cmd/dlock examples)
export GOWORK=off

step "gofmt"
unformatted=$(gofmt -s -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt -s would change:"; echo "$unformatted"; exit 1
fi

for m in "${modules[@]}" bench; do
  step "module $m: go mod tidy (check only), go vet, staticcheck $STATICCHECK_VERSION"
  (cd "$m" && go mod tidy -diff && go vet ./... && go run "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" ./...)
done

step "go test -race"
# The fault matrix and soaks write their results here (conformance.WriteRecord),
# and porcupine's visualisation of a failed history goes to the artifacts dir.
export DLOCK_SAFETY_OUT="${DLOCK_SAFETY_OUT:-$(mktemp -d)}"
export DLOCK_ARTIFACTS="${DLOCK_ARTIFACTS:-$DLOCK_SAFETY_OUT/artifacts}"
for m in "${modules[@]}"; do
  printf -- '-- module %s\n' "$m"
  (cd "$m" && go test -race -count=1 -timeout 25m -v "$@" ./... 2>&1 | "$OLDPWD/scripts/summarize-tests.sh")
done

step "peer-benchmark module: every scenario once, at tiny sizes (bench/ TestSmoke)"
(cd bench && go test -race -count=1 -timeout 10m ./... 2>&1 | ../scripts/summarize-tests.sh)

if [ $# -eq 0 ]; then   # a partial run (-run …) would miss rows
  step "docs/SAFETY.md states what this run observed"
  go run ./conformance/cmd/safety-report -from "$DLOCK_SAFETY_OUT" -check
fi
