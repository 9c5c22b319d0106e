// Package bench compares dlock with peer lock libraries on the same servers in
// the same run. It is a separate module, so that users of dlock never download
// the peer libraries.
//
// Peers: go-redsync/redsync v4 (1 pool, and 5 pools beside dlock's Redlock),
// bsm/redislock, etcd's concurrency.Mutex, go-zookeeper's zk.NewLock and a raw
// pg_advisory_lock with pgx; and each backend's raw protocol floor (Redis: SET
// NX PX + owner-checked DEL; etcd: txn put-if-absent + delete; ZooKeeper:
// create ephemeral + delete; PostgreSQL: pg_try_advisory_lock + unlock; NATS:
// the key-value store's create with a per-key TTL + revision-checked purge).
//
// Scenarios (see the Benchmark functions): uncontended acquire + release
// (interleaved across implementations), 8 and 32 lockers contending for one
// key (grants/s, handoff latency, share of grants that change hands, wait
// p99, server requests per grant, overlaps), many keys held by one process
// (time per acquire, heap per lease), the keepalive load of many leases,
// many waiters on one key (server requests per handoff), and what each guard
// (package fencing and its subpackages) adds to a write: the same write
// plain and guarded, interleaved (BenchmarkGuards), and what package
// schedule's Run and Once cost against a bare lock cycle, interleaved
// (BenchmarkSchedule); and the uncontended cycle of Redis, ZooKeeper,
// PostgreSQL and MySQL taken apart step by step from the floor, interleaved
// (BenchmarkRedisSteps, BenchmarkZooKeeperSteps, BenchmarkPostgresSteps,
// BenchmarkMySQLSteps). BenchmarkFleet drives each backend from many client
// processes at once and measures what each renewal, grant and hand-off costs
// the servers, for the capacity model in docs/CAPACITY.md.
//
// scripts/bench.sh runs them all and writes docs/BENCHMARKS.md:
//
//	scripts/bench.sh            # about 12–16 minutes on 2 cores
//	scripts/bench.sh --quick    # smaller sizes, one run
//
// By hand:
//
//	cd bench && go test -run '^$' -bench '^BenchmarkRedis$' -count 3
//	cd bench && go test -run '^$' -bench '^BenchmarkScale$' -benchtime 1x -args -dlock.waiters 100
//
// TestSmoke (plain go test) runs every scenario once at tiny sizes and checks
// that no two holders ever overlapped.
//
// The servers are real, started by dlock's internal/testenv on free loopback
// ports (see scripts/install-test-deps.sh).
package bench
