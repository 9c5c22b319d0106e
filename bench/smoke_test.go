package bench

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestSmoke runs every scenario of every implementation once at tiny sizes
// (the backends in parallel), the guards' writes (BenchmarkGuards) and
// schedule's calls (BenchmarkSchedule) on the same servers, the fleet's phases
// on Redis from two client processes (BenchmarkFleet), and checks that
// no two holders ever overlapped and that the metrics are sane. It measures nothing worth reporting: the
// numbers are the benchmarks' (scripts/bench.sh).
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts every server: not in -short")
	}
	// Registered first, so it runs last: after every client and server is
	// closed, no goroutine of the benchmarks or the clients may be left.
	t.Cleanup(func() { goleak.VerifyNone(t) })
	backends := []struct {
		name  string
		start func(testing.TB) scaleBackend
	}{
		{"redis", func(tb testing.TB) scaleBackend {
			e := startRedisEnv(tb)
			return scaleBackend{name: "redis", impls: e.impls, keepaliveDSN: e.single.URL(), reqs: e.impls[0].reqs, roundTrips: e.scripts,
				guards:      func(tb testing.TB) []guardWrite { return redisGuardWrites(tb, e.single.Addr()) },
				scheduleDSN: e.single.URL()}
		}},
		{"etcd", func(tb testing.TB) scaleBackend {
			e := startEtcdEnv(tb)
			return scaleBackend{name: "etcd", impls: e.impls, keepaliveDSN: e.srv.URL() + "/dlock", reqs: e.reqs,
				guards:      func(tb testing.TB) []guardWrite { return etcdGuardWrites(tb, e.srv.Endpoint()) },
				scheduleDSN: e.srv.URL() + "/bench-schedule"}
		}},
		{"zookeeper", func(tb testing.TB) scaleBackend {
			e := startZooKeeperEnv(tb)
			return scaleBackend{name: "zookeeper", impls: e.impls, keepaliveDSN: e.srv.URL("/dlock") + "?session=10s", reqs: e.reqs,
				guards: func(tb testing.TB) []guardWrite { return zkGuardWrites(tb, e.srv.Addr()) }}
		}},
		{"postgres", func(tb testing.TB) scaleBackend {
			e := startPostgresEnv(tb)
			return scaleBackend{name: "postgres", impls: e.impls, reqs: e.reqs,
				guards: func(tb testing.TB) []guardWrite { return sqlGuardWrites(tb, "postgres", "pgx", e.srv.URL()) },
				// pgtable:// requires durable commits: this server's default is off.
				scheduleDSN: pgtableDSN(e.srv.URL()) + "&synchronous_commit=on"}
		}},
		{"mysql", func(tb testing.TB) scaleBackend {
			e := startMySQLEnv(tb)
			return scaleBackend{name: "mysql", impls: e.impls, reqs: e.reqs,
				guards: func(tb testing.TB) []guardWrite { return sqlGuardWrites(tb, "mariadb", "mysql", e.srv.DSN()) }}
		}},
		{"nats", func(tb testing.TB) scaleBackend {
			e := startNATSEnv(tb)
			return scaleBackend{name: "nats", impls: e.impls, keepaliveDSN: e.srv.URL() + "/dlock", reqs: e.reqs}
		}},
		{"http", func(testing.TB) scaleBackend { return scaleBackend{name: "http", guards: httpGuardWrites} }},
		{"memlock", func(testing.TB) scaleBackend { return scaleBackend{name: "memlock", scheduleDSN: memDSN()} }},
	}
	t.Run("fleet", func(t *testing.T) { t.Parallel(); fleetSmoke(t) })
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.start(t)
			for _, r := range runUncontended(t, s.impls, 20) {
				p50, p99 := pct(r.samples, 50), pct(r.samples, 99)
				// A peer's own timeouts may fail a call on a loaded machine
				// (redsync gives each node a few ms): that is counted and
				// logged, not failed. dlock's calls must all succeed.
				want := 20
				if !isDlock(r.name) {
					want -= r.errors
				}
				if len(r.samples) != want || len(r.samples) == 0 || p50 <= 0 || p50 > p99 || r.total <= 0 {
					t.Errorf("%s: uncontended: %d samples, %d errors, p50 %v, p99 %v", r.name, len(r.samples), r.errors, p50, p99)
				}
			}
			for _, im := range s.impls {
				if !im.canWait {
					continue
				}
				for _, rotate := range []bool{false, true} {
					r := runContended(t, im, 4, 12, rotate)
					if r.grants != 12 || r.overlaps != 0 || (isDlock(im.name) && r.errors != 0) || len(r.waits) != 12 || (im.reqs != nil && r.reqs <= 0) || (rotate && r.changed != 11) {
						t.Errorf("%s: contended (rotate %v): %d grants, %d changed hands, %d overlaps, %d errors, %d waits, %v requests",
							im.name, rotate, r.grants, r.changed, r.overlaps, r.errors, len(r.waits), r.reqs)
					}
				}
				h := runHold(t, im, 10)
				if h.perAcquire <= 0 {
					t.Errorf("%s: hold: %v per acquire", im.name, h.perAcquire)
				}
				w := runWaitersFor(t, im, 6, 3)
				if w.perGrant <= 0 {
					t.Errorf("%s: waiters: %v requests per handoff", im.name, w.perGrant)
				}
			}
			if s.guards != nil {
				start := time.Now()
				for _, w := range s.guards(t) {
					if r := runGuardWrites(t, w, 5); r.plain <= 0 || r.guarded <= 0 {
						t.Errorf("guard %s: plain %v, guarded %v for %d writes", w.name, r.plain, r.guarded, r.n)
					}
				}
				t.Logf("guards' writes: %v", time.Since(start).Round(time.Millisecond))
			}
			if s.scheduleDSN != "" {
				start := time.Now()
				r := runScheduleCalls(t, scheduleCalls(openDlock(t, s.scheduleDSN, benchTTL)), 5)
				for i, d := range r.totals {
					if d <= 0 {
						t.Errorf("schedule %s: %v for %d calls", r.names[i], d, r.n)
					}
				}
				t.Logf("schedule's calls: %v", time.Since(start).Round(time.Millisecond))
			}
			if s.keepaliveDSN != "" {
				r := runKeepalive(t, s.name, s.keepaliveDSN, s.reqs, s.roundTrips, 20, 1500*time.Millisecond, 1500*time.Millisecond)
				if r.measured <= 0 || r.expected <= 0 || (s.roundTrips != nil && r.trips <= 0) || r.lost > 0 {
					t.Errorf("keepalive: %v requests/s, %v round trips/s, %v expected, %d leases lost", r.measured, r.trips, r.expected, r.lost)
				}
			}
		})
	}
}

// isDlock tells dlock's implementations from the peers and floors by name.
func isDlock(name string) bool { return strings.HasPrefix(name, "dlock") }
