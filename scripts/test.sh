#!/usr/bin/env bash
# Runs every check and test dlock has, in every module of the repository (the
# root, and the nested modules etcd, migrate, dlockotel, cmd/dlock, examples,
# the peer-benchmark module bench and the release module internal/release):
# formatting, go.mod tidiness and version agreement, go vet and staticcheck,
# API compatibility with the last recorded release, `go test -race` against
# real servers (started by the tests themselves on free loopback ports;
# install them first with scripts/install-test-deps.sh), the peer-benchmark
# module's smoke test, the install test (every published module served from a
# local module proxy and installed as users do), and a check that
# docs/SAFETY.md states what this run's fault matrix observed.
#
# Tests that need a server binary skip when it is missing — except under
# CI=true, where they fail.
#
# Usage: scripts/test.sh [extra go test flags, e.g. -run Conformance]
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/modules.sh

STATICCHECK_VERSION=v0.8.2

step() { printf '\n== %s\n' "$*"; }

# The modules, each tested on its own, as its users build it: in a workspace
# of its own that sends the dlock modules it requires to their working copies
# (scripts/modules.sh; the go.mod files have no replace lines). The root comes
# first; bench is run separately, by its smoke test, and internal/release by
# the install test.
modules=(. etcd migrate dlockotel dlockgocron dlockcron cmd/dlock examples)
works=$(mktemp -d)
trap 'rm -rf "$works"' EXIT
for m in $(mod_dirs); do
  mod_workspace "$m" "$works/$(echo "$m" | tr / _).work"
done
work() { echo "$works/$(echo "$1" | tr / _).work"; }

step "gofmt"
unformatted=$(gofmt -s -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt -s would change:"; echo "$unformatted"; exit 1
fi

step "go.mod files: go mod tidy (check only, scripts/tidy.sh -diff); the versions agree (scripts/release.sh check)"
scripts/tidy.sh -diff
scripts/release.sh check

for m in "${modules[@]}" bench internal/release; do
  step "module $m: go vet, staticcheck $STATICCHECK_VERSION"
  # third_party/ is other projects' code, kept as they wrote it.
  (cd "$m" && export GOWORK="$(work "$m")" && go vet ./... &&
    go run "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" $(go list ./... | grep -v '/third_party/'))
done

step "API compatible with the last recorded release (scripts/api.sh check)"
scripts/api.sh check

step "go test -race"
# The fault matrix and soaks write their results here (conformance.WriteRecord),
# and porcupine's visualisation of a failed history goes to the artifacts dir.
export DLOCK_SAFETY_OUT="${DLOCK_SAFETY_OUT:-$(mktemp -d)}"
export DLOCK_ARTIFACTS="${DLOCK_ARTIFACTS:-$DLOCK_SAFETY_OUT/artifacts}"
for m in "${modules[@]}"; do
  printf -- '-- module %s\n' "$m"
  (cd "$m" && GOWORK="$(work "$m")" go test -race -count=1 -timeout 25m -v "$@" ./... 2>&1 | "$OLDPWD/scripts/summarize-tests.sh")
done

step "peer-benchmark module: every scenario once, at tiny sizes (bench/ TestSmoke)"
(cd bench && GOWORK="$(work bench)" go test -race -count=1 -timeout 10m ./... 2>&1 | ../scripts/summarize-tests.sh)

if [ $# -eq 0 ]; then   # a partial run (-run …) would miss rows
  step "install test: go install and go get every published module from a local module proxy (internal/release)"
  (cd internal/release && GOWORK="$(work internal/release)" go test -count=1 -timeout 15m -v ./... 2>&1 | ../../scripts/summarize-tests.sh)

  step "docs/SAFETY.md states what this run observed"
  GOWORK="$(work .)" go run ./conformance/cmd/safety-report -from "$DLOCK_SAFETY_OUT" -check
fi
