#!/usr/bin/env bash
# Records, and checks, the exported API of every published package of dlock,
# with apidiff (golang.org/x/exp/cmd/apidiff, pinned in internal/release's
# go.mod). A package is published when it is in a module of versions.yaml's
# module set, is not a command (package main) and is not internal; the
# command's module (cmd/dlock) has no Go API.
#
#   scripts/api.sh record [VERSION]   writes api/VERSION/*.export, the export
#                                     data of each package (default: the
#                                     version in versions.yaml)
#   scripts/api.sh check [VERSION]    fails if the working tree's API is not
#                                     compatible with the one recorded for
#                                     VERSION (default: the newest recorded);
#                                     additions are compatible
#
# Record the API of each release as it is tagged (CONTRIBUTING.md,
# Releasing); scripts/test.sh runs the check.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/modules.sh

usage() { sed -n '2,17s/^# \{0,1\}//p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
cmd=$1; shift

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

set_version() { sed -n 's/^[[:space:]]*version:[[:space:]]*\(v[^[:space:]]*\).*/\1/p' versions.yaml | head -n 1; }

# published_modules prints the directory of each module of the set, less
# cmd/dlock.
published_modules() {
  awk '/^module-sets:/ {s = 1; next} /^[^[:space:]#]/ {s = 0} s && $1 == "-" {print $2}' versions.yaml |
    while read -r p; do
      [ "$p" = "$MODULE_PREFIX/cmd/dlock" ] || mod_dir "$p"
    done
}

# export_name PKG prints the file name PKG's export data is kept under.
export_name() {
  local rel=${1#"$MODULE_PREFIX"}
  rel=${rel#/}
  rel=${rel:-root}
  echo "${rel//\//-}.export"
}

# The apidiff binary, built from the version internal/release pins.
(cd internal/release && GOWORK=off go build -o "$tmp/apidiff" golang.org/x/exp/cmd/apidiff)
apidiff=$tmp/apidiff

case $cmd in
record)
  version=${1:-$(set_version)}
  dir=api/$version
  rm -rf "$dir"
  mkdir -p "$dir"
  for m in $(published_modules); do
    mod_workspace "$m" "$tmp/go.work"
    for pkg in $(cd "$m" && GOWORK="$tmp/go.work" go list -f '{{if ne .Name "main"}}{{.ImportPath}}{{end}}' ./... | grep -v -e '/internal/' -e '/internal$' || true); do
      (cd "$m" && GOWORK="$tmp/go.work" "$apidiff" -w "$OLDPWD/$dir/$(export_name "$pkg")" "$pkg")
      echo "recorded $pkg"
    done
  done
  echo "api.sh: wrote $dir; commit it with the release"
  ;;
check)
  version=${1:-}
  if [ -z "$version" ]; then
    version=$(ls api 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$version" ]; then
      echo "api.sh: no API recorded under api/ yet: nothing to check"
      exit 0
    fi
  fi
  dir=api/$version
  [ -d "$dir" ] || { echo "api.sh: $dir does not exist" >&2; exit 2; }
  mods=$(published_modules)
  fail=0
  for f in "$dir"/*.export; do
    pkg=$(head -n 1 "$f")
    # The module the package is in: the longest module path that prefixes it.
    m= best=
    for d in $mods; do
      p=$(mod_path "$d")
      case "$pkg" in
      "$p" | "$p"/*) if [ ${#p} -gt ${#best} ]; then m=$d best=$p; fi ;;
      esac
    done
    [ -n "$m" ] || { echo "$f: $pkg is in no published module" >&2; exit 2; }
    mod_workspace "$m" "$tmp/go.work"
    if ! out=$(cd "$m" && GOWORK="$tmp/go.work" "$apidiff" -incompatible "$OLDPWD/$f" "$pkg" 2>&1); then
      echo "$pkg: not found or does not build (incompatible with $version):"
      echo "$out" | sed 's/^/    /'
      fail=1
    elif [ -n "$out" ]; then
      echo "$pkg: incompatible with $version:"
      echo "$out" | sed 's/^/    /'
      fail=1
    fi
  done
  if [ $fail -ne 0 ]; then
    echo "api.sh: the API is not compatible with the one recorded in $dir (see CONTRIBUTING.md, Releasing)"
    exit 1
  fi
  echo "api.sh: the API is compatible with $version ($(ls "$dir" | wc -l) packages)"
  ;;
*) usage ;;
esac
