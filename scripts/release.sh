#!/usr/bin/env bash
# Keeps the versions of dlock's modules in step, and tags a release. Every
# published module is in the one module set of versions.yaml and is released
# at its version; multimod (go.opentelemetry.io/build-tools/multimod, pinned
# in internal/release's go.mod) reads the same file. CONTRIBUTING.md,
# Releasing, gives the whole procedure.
#
#   scripts/release.sh check     the versions agree (scripts/test.sh runs this):
#                                every module is in versions.yaml (published or
#                                excluded), no go.mod has a replace line, every
#                                requirement on a dlock module is at the set's
#                                version, and go.work uses every module and
#                                replaces the set's modules at that version
#   scripts/release.sh prepare   after raising the version in versions.yaml:
#                                moves every requirement on the set to it
#                                (multimod prerelease) and go.work with them,
#                                tidies, and commits on the current branch
#   scripts/release.sh tag [--unsigned] [COMMIT]
#                                on a clean checkout of COMMIT (default HEAD):
#                                check, multimod verify, the API check against
#                                api/VERSION, the install test; then creates
#                                the set's tags (signed, by multimod tag; with
#                                --unsigned, annotated by git tag -a) and prints
#                                the command that pushes them. Pushes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/modules.sh

usage() { sed -n '2,25s/^# \{0,1\}//p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
cmd=$1; shift

set_name() { awk '/^module-sets:/ {s = 1; next} s && /^  [^[:space:]#][^:]*:/ {sub(/:.*/, ""); sub(/^ +/, ""); print; exit}' versions.yaml; }
set_version() { sed -n 's/^[[:space:]]*version:[[:space:]]*\(v[^[:space:]]*\).*/\1/p' versions.yaml | head -n 1; }
set_modules() { awk '/^module-sets:/ {s = 1; next} /^[^[:space:]#]/ {s = 0} s && $1 == "-" {print $2}' versions.yaml; }
excluded_modules() { awk '/^excluded-modules:/ {s = 1; next} /^[^[:space:]#]/ {s = 0} s && $1 == "-" {print $2}' versions.yaml; }

# multimod runs the pinned multimod from the top of the repository.
multimod() { (cd internal/release && GOWORK=off go tool multimod "$@"); }

check() {
  local version fail=0 d p v listed want got
  version=$(set_version)
  case "$version" in v[0-9]*.[0-9]*.[0-9]*) ;; *) echo "versions.yaml: version '$version' is not a semantic version" >&2; return 1 ;; esac
  listed=$( (set_modules; excluded_modules) | LC_ALL=C sort)
  if [ "$(printf '%s\n' "$listed" | uniq -d)" != "" ]; then
    echo "versions.yaml lists a module twice: $(printf '%s\n' "$listed" | uniq -d)"; fail=1
  fi
  for d in $(mod_dirs); do
    p=$(mod_path "$d")
    if [ "$(cd "$d" && go mod edit -json | sed -n 's/^[[:space:]]*"Path": "\(.*\)"$/\1/p' | head -n 1)" != "$p" ]; then
      echo "$d/go.mod: the module path is not $p"; fail=1
    fi
    printf '%s\n' "$listed" | grep -qx "$p" || { echo "versions.yaml lists neither in the set nor as excluded: $p"; fail=1; }
    if (cd "$d" && go mod edit -json) | grep -q '"Replace": \['; then
      echo "$d/go.mod has replace lines: go install …@version refuses them, and users' builds ignore them (the go.work does their job)"; fail=1
    fi
    # go mod edit -json prints each requirement's Path, then its Version.
    while read -r p v; do
      [ "$v" = "$version" ] || { echo "$d/go.mod requires $p $v, want $version (scripts/release.sh prepare)"; fail=1; }
    done < <((cd "$d" && go mod edit -json) | awk -v pre="\"$MODULE_PREFIX" '
      /"Require"/ {r = 1} /^[[:space:]]*\]/ {r = 0}
      r && $1 == "\"Path\":" && index($2, pre) == 1 {p = $2; gsub(/[",]/, "", p)}
      r && $1 == "\"Version\":" && p != "" {v = $2; gsub(/[",]/, "", v); print p, v; p = ""}')
  done
  for p in $(set_modules); do
    [ -f "$(mod_dir "$p")/go.mod" ] || { echo "versions.yaml lists $p, which has no go.mod"; fail=1; }
  done
  # go.work: every module in use; the set's modules replaced, at the set's
  # version, by their working copies; nothing else.
  want=$(mod_dirs | sed 's|^\.$||; s|^|./|; s|^\./$|.|' | LC_ALL=C sort)
  got=$(go work edit -json | awk '/"Use"/ {u = 1} u && /"DiskPath"/ {gsub(/[",]/, "", $2); print $2} /^[[:space:]]*\]/ {u = 0}' | LC_ALL=C sort)
  [ "$want" = "$got" ] || { echo "go.work uses:"; echo "$got"; echo "want:"; echo "$want"; fail=1; }
  want=$(for p in $(set_modules); do d=$(mod_dir "$p"); [ "$d" = . ] && d= ; echo "$p $version ./$d"; done | LC_ALL=C sort)
  got=$(go work edit -json | awk '
    /"Replace"/ {r = 1} r && /"Old"/ {o = 1} r && /"New"/ {o = 0}
    r && $1 == "\"Path\":" {gsub(/[",]/, "", $2); if (o) op = $2; else np = $2}
    r && $1 == "\"Version\":" && o {gsub(/[",]/, "", $2); ov = $2}
    r && /^[[:space:]]*}$/ && np != "" {print op, ov, np; np = ""}' | sed 's|^\(.*\) \./$|\1 ./|' | LC_ALL=C sort)
  [ "$want" = "$got" ] || { echo "go.work replaces:"; echo "$got"; echo "want:"; echo "$want"; fail=1; }
  if [ $fail -ne 0 ]; then
    echo "release.sh: the versions do not agree" >&2
    return 1
  fi
  echo "release.sh: every module agrees on $(set_name) $version"
}

# sync_work points go.work's replace lines at the set's version (check then
# says if a module of the set has none).
sync_work() {
  sed -i 's|^\([[:space:]]*\(replace[[:space:]]\{1,\}\)\{0,1\}'"$MODULE_PREFIX"'[^[:space:]]*\) v[^[:space:]]* =>|\1 '"$(set_version)"' =>|' go.work
}

require_clean() {
  if [ -n "$(git status --porcelain)" ]; then
    echo "release.sh: the working tree has changes; commit or remove them first" >&2
    exit 1
  fi
}

case $cmd in
check)
  check
  ;;
prepare)
  require_clean
  multimod verify
  # Moves every go.mod's requirements on the set to its version and commits;
  # go mod tidy is skipped: a plain one cannot resolve the new version yet.
  before=$(git rev-parse HEAD)
  multimod prerelease --module-set-names "$(set_name)" --skip-go-mod-tidy --commit-to-different-branch=false
  # multimod also rewrites every version number in a module's version.go (or
  # its version-refs); dlock keeps no version in a file, so nothing but
  # go.mod files may change (versions.yaml says why etcd's points at LICENSE).
  if git diff --name-only "$before" HEAD | grep -v '\(^\|/\)go\.mod$'; then
    echo "release.sh: multimod prerelease changed the files above, not only go.mod files: undo that commit (git reset --hard $before) and see versions.yaml" >&2
    exit 1
  fi
  sync_work
  scripts/tidy.sh
  check
  if [ -n "$(git status --porcelain)" ]; then
    git add -A -- go.work ':(glob)**/go.mod' ':(glob)**/go.sum'
    git commit -q -m "release: go.work and go.sum for $(set_version)"
  fi
  git log --oneline -2
  echo "release.sh: prepared $(set_version); record its API (scripts/api.sh record) once it is final, then tag"
  ;;
tag)
  sign=1
  if [ "${1:-}" = --unsigned ]; then sign=0; shift; fi
  commit=$(git rev-parse --verify "${1:-HEAD}^{commit}")
  require_clean
  [ "$(git rev-parse HEAD)" = "$commit" ] || { echo "release.sh: check out $commit first: the checks run on the working tree" >&2; exit 1; }
  version=$(set_version)
  check
  multimod verify
  [ -d "api/$version" ] || { echo "release.sh: api/$version is missing: run scripts/api.sh record and commit it" >&2; exit 1; }
  scripts/api.sh check "$version"
  (cd internal/release && GOWORK=off go test -count=1 -run 'TestInstall' ./...)
  tags=()
  for p in $(set_modules); do
    d=$(mod_dir "$p")
    if [ "$d" = . ]; then tags+=("$version"); else tags+=("$d/$version"); fi
  done
  if [ $sign -eq 1 ]; then
    multimod tag --module-set-name "$(set_name)" --commit-hash "$commit"
  else
    for t in "${tags[@]}"; do
      git tag -a -m "Module set $(set_name), Version $version" "$t" "$commit"
    done
  fi
  for t in "${tags[@]}"; do
    [ "$(git rev-parse "$t^{commit}")" = "$commit" ] || { echo "release.sh: tag $t is not on $commit" >&2; exit 1; }
  done
  echo "release.sh: tagged $commit as: ${tags[*]}"
  echo "push them with: git push origin ${tags[*]}"
  ;;
*) usage ;;
esac
