#!/usr/bin/env bash
# Runs every check and test dlock has, in every module of the repository (the
# root first, then each nested module scripts/modules.sh finds, the
# peer-benchmark module bench and the release module internal/release last):
# formatting, go.mod tidiness and version agreement, go vet and staticcheck,
# API compatibility with the last recorded release, `go test -race` against
# real servers (started by the tests themselves on free loopback ports;
# install them first with scripts/install-test-deps.sh), the peer-benchmark
# module's smoke test, the install test (every published module served from a
# local module proxy and installed as users do), and a check that
# docs/SAFETY.md states what this run's fault matrix observed. A failing
# module does not stop the run; it ends with each failing test's own
# messages (scripts/test-failures.sh).
#
# Tests that need a server binary skip when it is missing — except under
# CI=true, where they fail.
#
# Usage: scripts/test.sh [extra go test flags, e.g. -run Conformance]
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/modules.sh

STATICCHECK_VERSION=v0.8.2

# step prints a step's heading and notes when it began, for the timings
# printed last (the part of a CI log that is kept).
timings=()
step() {
  timings+=("$(printf '%5ds  %s' "$SECONDS" "${*%%:*}")")
  printf '\n== %s\n' "$*"
}
print_timings() {
  printf '\n== timings (seconds since the start of scripts/test.sh when each step began; the end at %ds)\n' "$SECONDS"
  printf '%s\n' "${timings[@]}"
  if [ -n "${DLOCK_INSTALL_SECONDS:-}" ]; then
    echo "(before it, .ci/run's installs took ${DLOCK_INSTALL_SECONDS}s)"
  fi
}

# The modules, each tested on its own, as its users build it: in a workspace
# of its own that sends the dlock modules it requires to their working copies
# (scripts/modules.sh; the go.mod files have no replace lines). The root comes
# first; bench is run separately, by its smoke test, and internal/release by
# the install test.
# k8s's tests need a kube-apiserver, built from source once and cached
# (docs/k8s.md): they run with DLOCK_K8S=1, which is set here when the cached
# binary exists (a cold build does not fit a CI run); otherwise the module is
# vetted but not tested, and the SAFETY.md check leaves its rows alone.
kube_bin=$(kube_apiserver_bin)
if [ -z "${DLOCK_K8S:-}" ] && [ -z "${DLOCK_KUBE_APISERVER:-}" ] && [ -x "$kube_bin" ]; then
  export DLOCK_K8S=1
fi
k8s_tests=false
[ "${DLOCK_K8S:-}" = 1 ] || [ -n "${DLOCK_KUBE_APISERVER:-}" ] && k8s_tests=true
mapfile -t modules < <(mod_dirs | grep -vx -e bench -e internal/release)
test_modules=("${modules[@]}")
$k8s_tests || mapfile -t test_modules < <(printf '%s\n' "${modules[@]}" | grep -vx k8s)
works=$(mktemp -d)
logs=$(mktemp -d)   # each module's raw go test output, for the closing recap
trap 'rm -rf "$works" "$logs"' EXIT
for m in $(mod_dirs); do
  mod_workspace "$m" "$works/$(echo "$m" | tr / _).work"
done
work() { echo "$works/$(echo "$1" | tr / _).work"; }

# gotest DIR ARGS… runs go test ARGS… in the module in DIR, prints its
# verdicts (scripts/summarize-tests.sh) and keeps its raw output for the
# recap; a failure leaves a marker file beside it, and the run goes on.
logname() { if [ "$1" = . ]; then echo "$logs/root.log"; else echo "$logs/$(echo "$1" | tr / _).log"; fi; }
gotest() {
  local m=$1 raw
  shift
  raw=$(logname "$m")
  printf -- '-- module %s\n' "$m"
  if ! (cd "$m" && GOWORK="$(work "$m")" go test "$@" 2>&1 | tee "$raw" | "$top/scripts/summarize-tests.sh"); then
    echo "$m" >"$raw.failed"
  fi
}
top=$(pwd)

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
if ! $k8s_tests; then
  if [ -x "$kube_bin" ]; then
    echo "k8s: not tested: DLOCK_K8S=${DLOCK_K8S:-} (the cached kube-apiserver is at $kube_bin; docs/k8s.md)"
  else
    echo "k8s: not tested: no kube-apiserver cached at $kube_bin (DLOCK_K8S=1 builds it; docs/k8s.md)"
  fi
fi
# The fault matrix and soaks write their results here (conformance.WriteRecord),
# and porcupine's visualisation of a failed history goes to the artifacts dir.
export DLOCK_SAFETY_OUT="${DLOCK_SAFETY_OUT:-$(mktemp -d)}"
export DLOCK_ARTIFACTS="${DLOCK_ARTIFACTS:-$DLOCK_SAFETY_OUT/artifacts}"
# The root module, the longest, runs beside the others (one after another),
# which halves the wall time on two cores; DLOCK_TEST_SERIAL=1 runs each
# module alone. The root's verdicts are printed when both are done.
if [ "${DLOCK_TEST_SERIAL:-}" = 1 ]; then
  for m in "${test_modules[@]}"; do
    gotest "$m" -race -count=1 -timeout 25m -v "$@" ./...
  done
else
  gotest . -race -count=1 -timeout 25m -v "$@" ./... >"$logs/root.summary.txt" 2>&1 &
  root_pid=$!
  for m in "${test_modules[@]}"; do
    [ "$m" = . ] || gotest "$m" -race -count=1 -timeout 25m -v "$@" ./...
  done
  wait "$root_pid" || true
  cat "$logs/root.summary.txt"
fi

step "peer-benchmark module: every scenario once, at tiny sizes (bench/ TestSmoke)"
gotest bench -race -count=1 -timeout 10m -v ./...

if [ $# -eq 0 ]; then   # a partial run (-run …) would miss rows
  step "install test: go install and go get every published module from a local module proxy (internal/release)"
  gotest internal/release -count=1 -timeout 15m -v ./...

  step "docs/SAFETY.md states what this run observed"
  not_run=()
  $k8s_tests || not_run=(-not-run k8s)
  if ! GOWORK="$(work .)" go run ./conformance/cmd/safety-report -from "$DLOCK_SAFETY_OUT" -check "${not_run[@]}"; then
    echo "docs/SAFETY.md" >"$logs/SAFETY.failed"
  fi
fi

# The recap: what a reader of the run's last lines needs.
mapfile -t failed < <(cat "$logs"/*.failed 2>/dev/null)
print_timings
if [ ${#failed[@]} -gt 0 ]; then
  step "FAILED: ${failed[*]}; each failing test's own messages follow"
  for m in "${failed[@]}"; do
    raw=$(logname "$m")
    [ -f "$raw" ] || continue   # docs/SAFETY.md: its own lines are above
    printf -- '-- module %s\n' "$m"
    scripts/test-failures.sh <"$raw"
  done
  exit 1
fi
