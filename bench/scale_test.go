package bench

import (
	"strconv"
	"testing"
)

// pgMaxWaiters bounds the PostgreSQL waiters of the Waiters scenario: each
// waiting Acquire (dlock's, or the raw peer's) takes a connection of its
// own, and testenv's server allows 300 connections. Held leases need none
// of their own (dlock's driver holds them in one session per TTL).
const pgMaxWaiters = 200

// scaleEnv is every backend's servers, for the scale scenarios.
type scaleEnv struct {
	redis *redisEnv
	etcd  *etcdEnv
	zk    *zkEnv
	pg    *pgEnv
}

func startScaleEnv(tb testing.TB) *scaleEnv {
	return &scaleEnv{
		redis: startRedisEnv(tb),
		etcd:  startEtcdEnv(tb),
		zk:    startZooKeeperEnv(tb),
		pg:    startPostgresEnv(tb),
	}
}

// backends lists the backends with their implementations, in report order.
func (e *scaleEnv) backends() []scaleBackend {
	pgWait := dlockImpl("dlock", e.pg.srv.URL()+"&pool_max_conns="+strconv.Itoa(pgMaxWaiters+50), e.pg.reqs)
	return []scaleBackend{
		{name: "redis", impls: e.redis.impls, keepaliveDSN: e.redis.single.URL(), reqs: e.redis.impls[0].reqs, roundTrips: e.redis.scripts},
		{name: "etcd", impls: e.etcd.impls, keepaliveDSN: e.etcd.srv.URL() + "/dlock", reqs: e.etcd.reqs},
		{name: "zookeeper", impls: e.zk.impls, keepaliveDSN: e.zk.srv.URL("/dlock") + "?session=10s", reqs: e.zk.reqs},
		{name: "postgres", impls: append([]impl{pgWait}, e.pg.impls[1:]...), keepaliveDSN: e.pg.srv.URL(), maxWaiters: pgMaxWaiters, reqs: e.pg.reqs},
	}
}

type scaleBackend struct {
	name         string
	impls        []impl
	keepaliveDSN string // "": the keepalive scenario is not run
	maxWaiters   int    // 0: no bound
	reqs         func() (float64, error)
	roundTrips   func() (float64, error)       // nil: reqs counts round trips
	guards       func(testing.TB) []guardWrite // TestSmoke: the guards' writes on this server; nil: none
	scheduleDSN  string                        // TestSmoke: BenchmarkSchedule's calls on this DSN; "": none
}

func (s scaleBackend) bound(n int) int {
	if s.maxWaiters > 0 && n > s.maxWaiters {
		return s.maxWaiters
	}
	return n
}

// waiterClients is how many clients the waiters of the Waiters scenario are
// spread over (the waiters of one client share its connections).
const waiterClients = 10

// fewWaiters is the Waiters scenario's baseline: server operations per
// handoff with this many waiters are compared with those with many.
const fewWaiters = 10

// BenchmarkScale runs the scale scenarios once each (run it with
// -benchtime 1x); sizes come from the -dlock.* flags:
//
//   - Hold/BACKEND/IMPL: one client acquires -dlock.keys keys and holds them: acquire-ns (time per acquire),
//     B/lease (live heap per held lease, after GC) and goroutines/lease.
//   - Keepalive/BACKEND: dlock holds -dlock.leases leases with TTL
//     -dlock.keepalive-ttl and auto-renew: reqs/s measured over one TTL,
//     expected-reqs/s = leases/(TTL/3), B/lease (live heap per held lease
//     after that TTL, when every lease has renewed; the least of 5 readings
//     250 ms apart, so renewals in flight are not counted) and goroutines/lease.
//   - Waiters/BACKEND/IMPL: -dlock.waiters waiters (PostgreSQL: at most
//     pgMaxWaiters) on one key, over 10 clients; then 10 waiters, one per
//     client; then up to 100 waiters, one per client: reqs/handoff for
//     each (over the first handoffs, while most still wait), many/few
//     (O(1): about 1), and idle reqs/s.
func BenchmarkScale(b *testing.B) {
	e := startScaleEnv(b)
	bs := e.backends()
	for _, be := range bs {
		for _, im := range be.impls {
			if im.name == "dlock-redlock5" || im.name == "redsync5" {
				continue
			}
			b.Run("Hold/"+be.name+"/"+im.name, func(b *testing.B) {
				n := *flagKeys
				r := runHold(b, im, n)
				report(b, float64(n), "keys")
				report(b, float64(r.perAcquire.Nanoseconds()), "acquire-ns")
				report(b, r.perLease, "B/lease")
				report(b, r.goroutines, "goroutines/lease")
			})
		}
	}
	for _, be := range bs {
		if be.keepaliveDSN == "" {
			continue
		}
		b.Run("Keepalive/"+be.name, func(b *testing.B) {
			r := runKeepalive(b, be.name, be.keepaliveDSN, be.reqs, be.roundTrips, *flagLeases, *flagKATTL, *flagKATTL)
			reportKeepalive(b, r)
		})
	}
	for _, be := range bs {
		for _, im := range be.impls {
			if !im.canWait || im.name == "dlock-redlock5" || im.name == "redsync5" {
				continue
			}
			b.Run("Waiters/"+be.name+"/"+im.name, func(b *testing.B) {
				n := be.bound(*flagWaiters)
				many := runWaitersFor(b, im, n, waiterClients)
				few := runWaitersFor(b, im, fewWaiters, fewWaiters)
				nc := min(n, perWaiterClients)
				own := runWaitersFor(b, im, nc, nc)
				report(b, float64(many.waiters), "waiters")
				report(b, many.perGrant, "reqs/handoff")
				report(b, few.perGrant, "reqs/handoff@10")
				report(b, many.perGrant/few.perGrant, "many/few")
				report(b, float64(nc), "clients")
				report(b, own.perGrant, "reqs/handoff@clients")
				report(b, many.idleRate, "idle-reqs/s")
				report(b, float64(many.gaveUp+few.gaveUp+own.gaveUp), "gave-up")
			})
		}
	}
}

func reportKeepalive(tb testing.TB, r keepaliveResult) {
	report(tb, float64(r.leases), "leases")
	report(tb, r.ttl.Seconds(), "ttl-s")
	report(tb, r.measured, "reqs/s")
	if r.trips >= 0 {
		report(tb, r.trips, "round-trips/s")
	}
	report(tb, r.expected, "expected-reqs/s")
	report(tb, r.perLease, "B/lease")
	report(tb, r.perLeaseG, "goroutines/lease")
	report(tb, float64(r.retries), "acquire-retries")
	report(tb, float64(r.lost), "lost")
}

// perWaiterClients bounds the Waiters variant where every waiter has a client
// of its own, as waiters in separate processes would.
const perWaiterClients = 100

// runWaitersFor runs the Waiters scenario with n waiters over clients
// clients; each etcd-mutex and pg-advisory waiter gets a client of its own
// (waiters of one etcd session would share its key and all hold the lock at
// once; a pgx.Conn serves one statement at a time).
func runWaitersFor(tb testing.TB, im impl, n, clients int) waitersResult {
	if im.oneSessionPerWaiter {
		clients = n
	}
	handoffs := max(min(100, n/2), 1)
	return runWaiters(tb, im, n, clients, handoffs)
}
