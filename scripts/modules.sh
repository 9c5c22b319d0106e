# Sourced by scripts/test.sh, bench.sh, tidy.sh, api.sh and release.sh: the repository's
# Go modules, and how to build one of them on its own.
#
# No go.mod in the repository has a replace line: a module requires the
# others at the version of versions.yaml, as its users' builds do, and the
# go.work at the top makes a development build use the working copy of each.
# The checks build each module in a workspace of its own instead
# (mod_workspace), so that the versions it is built with are those its own
# go.mod selects, as in a user's build.
# The caller must be at the top of the repository.

MODULE_PREFIX=github.com/dlock-go/dlock

# mod_dirs prints the directory of every module (the root first), not those
# under testdata.
mod_dirs() {
  find . -name go.mod -not -path './.git/*' -not -path '*/testdata/*' -printf '%h\n' |
    sed 's|^\./||' | LC_ALL=C sort | sed 's|^\.$|.|'
}

# mod_path DIR prints the module path of the module in DIR.
mod_path() {
  if [ "$1" = . ]; then echo "$MODULE_PREFIX"; else echo "$MODULE_PREFIX/$1"; fi
}

# mod_dir PATH prints the directory of the dlock module PATH.
mod_dir() {
  if [ "$1" = "$MODULE_PREFIX" ]; then echo .; else echo "${1#"$MODULE_PREFIX"/}"; fi
}

# mod_workspace DIR FILE writes to FILE a go.work, for GOWORK=FILE, that uses
# the module in DIR alone and replaces each other dlock module with its
# working copy: the build list is the one DIR's go.mod selects, as in a
# user's build, with the working copies of the dlock modules it requires.
mod_workspace() {
  local top d
  top=$(pwd)
  {
    echo "go $(sed -n 's/^go \([0-9.]*\)$/\1/p' go.mod)"
    echo
    if [ "$1" = . ]; then echo "use $top"; else echo "use $top/$1"; fi
    echo
    echo "replace ("
    for d in $(mod_dirs); do
      [ "$d" = "$1" ] && continue
      if [ "$d" = . ]; then echo "	$MODULE_PREFIX => $top"; else echo "	$(mod_path "$d") => $top/$d"; fi
    done
    echo ")"
  } >"$2"
}

# mod_tidy DIR [-diff] runs go mod tidy in DIR with the other dlock modules
# replaced by their working copies (through a temporary go.mod: -modfile), so
# that a version not yet published resolves and no go.sum lists dlock's own
# modules. Without -diff it writes the result back, less the replace lines;
# with -diff it prints what would change and fails if anything would.
mod_tidy() {
  local dir=$1 mode=${2:-} top tmp d rc=0
  top=$(pwd)
  tmp=$(mktemp -d)
  cp "$dir/go.mod" "$tmp/go.mod"
  if [ -f "$dir/go.sum" ]; then cp "$dir/go.sum" "$tmp/go.sum"; fi
  for d in $(mod_dirs); do
    [ "$d" = "$dir" ] && continue
    go mod edit -replace "$(mod_path "$d")=$top/$d" "$tmp/go.mod"
  done
  if [ "$mode" = -diff ]; then
    (cd "$dir" && GOWORK=off go mod tidy -diff -modfile="$tmp/go.mod") || rc=$?
  else
    (cd "$dir" && GOWORK=off go mod tidy -modfile="$tmp/go.mod") || rc=$?
    if [ $rc -eq 0 ]; then
      for d in $(mod_dirs); do
        go mod edit -dropreplace "$(mod_path "$d")" "$tmp/go.mod"
      done
      cp "$tmp/go.mod" "$dir/go.mod"
      if [ -s "$tmp/go.sum" ]; then cp "$tmp/go.sum" "$dir/go.sum"; else rm -f "$dir/go.sum"; fi
    fi
  fi
  rm -rf "$tmp"
  return $rc
}

# kube_version prints the kube-apiserver version internal/testenv builds, and
# kube_apiserver_bin where it caches the binary (k8s's tests and benchmark
# run where it exists; docs/k8s.md).
kube_version() { sed -n 's/^const KubeVersion = "\(.*\)"$/\1/p' internal/testenv/kube.go; }
kube_apiserver_bin() { echo "${XDG_CACHE_HOME:-$HOME/.cache}/dlock-testenv/kube-apiserver-$(kube_version)/kube-apiserver"; }
