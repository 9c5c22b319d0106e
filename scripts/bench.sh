#!/usr/bin/env bash
# Runs the peer benchmarks of the separate bench/ module — dlock's drivers
# against redsync (1 and 5 pools), redislock, etcd's concurrency.Mutex,
# go-zookeeper's zk.NewLock, raw pg_advisory_lock, raw GET_LOCK, a ShedLock-style
# table and each backend's raw protocol floor (NATS: nats.go's key-value
# create and purge; Kubernetes: client-go's Lease create and delete, where
# internal/testenv has a kube-apiserver cached or with DLOCK_K8S=1), and the
# uncontended cycles of Redis, ZooKeeper, MySQL (tokens=sequence) and
# PostgreSQL (tokens=sequence) step by step from their floors — and writes
# docs/BENCHMARKS.md from that one run. A short fleet run (BenchmarkFleet:
# many client processes per backend, each with its own Locker;
# docs/CAPACITY.md) writes its raw figures to docs/fleet-run.txt.
#
# The benchmarks start their own servers (redis-server, etcd, ZooKeeper,
# PostgreSQL, MariaDB, nats-server) on free loopback ports and stop them; install
# them with scripts/install-test-deps.sh (testenv builds nats-server once). A
# full run takes about 22 minutes on 2 cores (the step-by-step runs of
# Redis, ZooKeeper and MySQL about 1–2 of them); --quick (smaller sizes) about 5.
#
# Usage: scripts/bench.sh [--quick] [--out FILE] [--fleet-out FILE]
#        (defaults docs/BENCHMARKS.md, docs/fleet-run.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

quick=false
out=docs/BENCHMARKS.md
fleet_out=docs/fleet-run.txt
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=true ;;
    --out) out=$2; shift ;;
    --out=*) out=${1#--out=} ;;
    --fleet-out) fleet_out=$2; shift ;;
    --fleet-out=*) fleet_out=${1#--fleet-out=} ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

# The Redis, ZooKeeper and MySQL step-by-step benchmarks are read by p50 and
# need more rounds than the rest for a stable one: -benchtime and -count for
# each (ZooKeeper by rounds: its cycles vary too much for a time to size them).
if $quick; then
  count=1; benchtime=300ms
  steps_redis=(300ms 1); steps_zk=(300x 1); steps_mysql=(300ms 1)
  scale=(-dlock.keys 200 -dlock.leases 1000 -dlock.keepalive-ttl 3s -dlock.waiters 100)
  fleet=(-dlock.fleet-procs 4 -dlock.fleet-leases 10 -dlock.fleet-ttl 2s -dlock.fleet-phase 500ms)
  cmdline="scripts/bench.sh --quick"
else
  count=3; benchtime=1s
  steps_redis=(5s 3); steps_zk=(3000x 3); steps_mysql=(1s 5)
  scale=(-dlock.keys 1000 -dlock.leases 10000 -dlock.keepalive-ttl 9s -dlock.waiters 1000)
  fleet=(-dlock.fleet-procs 8 -dlock.fleet-leases 20 -dlock.fleet-ttl 3s -dlock.fleet-phase 1s)
  cmdline="scripts/bench.sh"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
raw=$work/raw.txt
meta=$work/meta.txt

step() { printf '\n== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

version() { # first line of a command's version output, or "not installed"
  local out
  if out=$("$@" 2>&1) && [ -n "$out" ]; then echo "${out%%$'\n'*}"; else echo "not installed"; fi
}
find_bin() { # a binary from $PATH or Debian's sbin directories
  command -v "$1" 2>/dev/null || { for d in /usr/local/sbin /usr/sbin /sbin; do [ -x "$d/$1" ] && { echo "$d/$1"; return; }; done; echo "$1"; }
}
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
zk_version=$(dpkg-query -W -f='${Version}' zookeeper 2>/dev/null || echo "not installed")

# The Kubernetes benchmark needs a kube-apiserver built from source: it runs
# when internal/testenv has one cached (or with DLOCK_K8S=1, which builds it).
. "$root/scripts/modules.sh"
kube_version=$(kube_version)
if [ -z "${DLOCK_K8S:-}" ] && [ -x "$(kube_apiserver_bin)" ]; then
  export DLOCK_K8S=1
fi

started=$(date -u '+%Y-%m-%d %H:%M UTC')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
{
  printf 'Date\t%s\n' "$started"
  printf 'Command\t`%s` (go test -bench in bench/: -count %s, -benchtime %s for the latency and contention scenarios; -benchtime 1x, one run, for the scale scenarios: %s; step by step, -benchtime %s -count %s for Redis, -benchtime %s -count %s for ZooKeeper, -benchtime %s -count %s for MySQL)\n' "$cmdline" "$count" "$benchtime" "${scale[*]}" "${steps_redis[@]}" "${steps_zk[@]}" "${steps_mysql[@]}"
  printf 'CPU\t%s × %s\n' "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  printf 'Memory\t%s\n' "$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  printf 'OS\t%s, kernel %s\n' "$(. /etc/os-release && echo "$PRETTY_NAME")" "$(uname -r)"
  printf 'Go\t%s\n' "$(go version)"
  printf 'Redis\t%s\n' "$(version "$(find_bin redis-server)" --version)"
  printf 'etcd\t%s\n' "$(version "$(find_bin etcd)" --version)"
  printf 'ZooKeeper\tDebian package %s\n' "$zk_version"
  printf 'PostgreSQL\t%s\n' "$(version "${pg_bin:-/nonexistent}/postgres" --version)"
  printf 'MariaDB\t%s\n' "$(version "$(find_bin mariadbd)" --version)"
  printf 'NATS\tnats-server %s (built from its module by internal/testenv)\n' "$(sed -n 's/^const NATSServerVersion = "\(.*\)"$/\1/p' internal/testenv/nats.go)"
  if [ "${DLOCK_K8S:-}" = 1 ]; then
    printf 'Kubernetes\tkube-apiserver %s (built from its module by internal/testenv), on Debian'"'"'s etcd\n' "$kube_version"
  else
    printf 'Kubernetes\tnot measured (no kube-apiserver cached; DLOCK_K8S=1 builds one)\n'
  fi
} >"$meta"

# bench/ with the working copies of dlock's modules and the dependency
# versions its own go.mod selects (scripts/modules.sh, sourced above).
mod_workspace bench "$work/go.work"
export GOWORK=$work/go.work
cd "$root/bench"
step "build (go test -c)"
go test -c -o "$work/bench.test" .

# A failed benchmark does not stop the run: the report lists the failures,
# and the script exits non-zero at the end.
status=0
step "latency and contention: Redis, etcd, ZooKeeper, PostgreSQL, MySQL, NATS, Kubernetes (when cached); the steps of the Redis fair hand-off and of the PostgreSQL sequence-mode cycle; observability overhead; election hand-over; semaphore and read/write lock; guarded writes; scheduled jobs (-count $count, -benchtime $benchtime)"
"$work/bench.test" -test.run '^$' -test.bench '^Benchmark(Redis|RedisHandoffSteps|Etcd|ZooKeeper|Postgres|PostgresSteps|MySQL|NATS|K8s|Observe|Election|Primitives|Guards|Schedule)$' \
  -test.benchtime "$benchtime" -test.count "$count" -test.timeout 40m 2>&1 | tee -a "$raw" || status=1

step "the uncontended cycle step by step: Redis, ZooKeeper, MySQL (tokens=sequence) (-benchtime, -count: ${steps_redis[*]}, ${steps_zk[*]}, ${steps_mysql[*]})"
run_steps() { # NAME BENCHTIME COUNT: BenchmarkNAME into the raw file
  "$work/bench.test" -test.run '^$' -test.bench "^Benchmark$1\$" -test.benchtime "$2" -test.count "$3" \
    -test.timeout 20m 2>&1 | tee -a "$raw" || status=1
}
run_steps RedisSteps "${steps_redis[@]}"
run_steps ZooKeeperSteps "${steps_zk[@]}"
run_steps MySQLSteps "${steps_mysql[@]}"
load_mid=$(cut -d' ' -f1-3 /proc/loadavg)

step "scale: many keys, keepalive of many leases, many waiters (${scale[*]})"
"$work/bench.test" -test.run '^$' -test.bench '^BenchmarkScale$' -test.benchtime 1x -test.count 1 \
  -test.timeout 40m "${scale[@]}" 2>&1 | tee -a "$raw" || status=1

# The short fleet run: its figures go to their own file, not to the report.
step "fleet: client processes per backend, steady, contended, uncontended, ramp (${fleet[*]})"
fleet_raw=$work/fleet.txt
{
  printf '# %s, %s; load average (1, 5, 15 min) before: %s\n' "$cmdline" "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf '# %s × %s\n' "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
} >"$fleet_raw"
"$work/bench.test" -test.run '^$' -test.bench '^BenchmarkFleet$' -test.benchtime 1x -test.count 1 \
  -test.timeout 20m "${fleet[@]}" 2>&1 | tee -a "$fleet_raw" || status=1
printf '# load average after: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$fleet_raw"
case "$fleet_out" in /*) cp "$fleet_raw" "$fleet_out" ;; *) cp "$fleet_raw" "$root/$fleet_out" ;; esac
echo "wrote $fleet_out"

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
finished=$(date -u '+%H:%M UTC')
printf 'Load average (1, 5, 15 min)\t%s before, %s between the two parts, %s after (finished %s)\n' \
  "$load_before" "$load_mid" "$load_after" "$finished" >>"$meta"

case "$out" in /*) out_path=$out ;; *) out_path=$root/$out ;; esac
step "write $out"
go run ./cmd/benchreport -in "$raw" -meta "$meta" -cmd "$cmdline" -out "$out_path"
echo "wrote $out"
if [ "$status" -ne 0 ]; then
  echo "bench.sh: some benchmarks failed; $out lists them under \"Failures in this run\"" >&2
fi
exit "$status"
