#!/usr/bin/env bash
# Installs the real servers dlock's tests run against, from Debian packages.
#
# Idempotent: packages already installed are skipped. Packaged services are kept
# from auto-starting on their default ports (tests start their own servers on free
# loopback ports; see internal/testenv).
#
# Usage: scripts/install-test-deps.sh            (needs root, or sudo)
set -euo pipefail

# One line per server the tests use. Drivers add theirs as they land.
packages=(
  redis-server redis-tools   # redis driver, redlock driver
  zookeeper                  # zookeeper driver (pulls a JRE)
  libcurator-recipes-java    # zookeeper: TestCurator runs Apache Curator 5.4 (java's source
                             # launcher; Debian's JRE has the jdk.compiler module, no JDK needed)
  postgresql pgbouncer       # postgres driver; sqltable (pgbouncer: transaction pooling)
  mariadb-server             # sqltable's MySQL dialect; fencing.SQLGuard on MariaDB
  etcd-server etcd-client    # etcd driver (etcd 3.4; etcdctl for the interop test)
  chromium                   # cmd/dlock: renders dlock bench's HTML report headless (TestBench)
)

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-test-deps: need root or sudo" >&2; exit 1; }
  sudo="sudo"
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-test-deps: all present: ${packages[*]}"
  exit 0
fi

# Keep packaged services from starting on the default ports during install.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  created_policy=1
fi
cleanup() { if [ "$created_policy" = 1 ]; then $sudo rm -f "$policy"; fi; }
trap cleanup EXIT

echo "install-test-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-test-deps: done"
