package bench

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
)

// benchTTL is every implementation's TTL (redsync: expiry; etcd, ZooKeeper:
// session TTL) in the latency and contention scenarios.
const benchTTL = 10 * time.Second

// Sizes of the scale scenarios; scripts/bench.sh --quick lowers them.
var (
	flagKeys    = flag.Int("dlock.keys", 1000, "Hold: keys held by one process")
	flagLeases  = flag.Int("dlock.leases", 10000, "Keepalive: leases held by one process")
	flagKATTL   = flag.Duration("dlock.keepalive-ttl", 9*time.Second, "Keepalive: the leases' TTL")
	flagWaiters = flag.Int("dlock.waiters", 1000, "Waiters: waiters on one key")
	flagImpls   = flag.String("dlock.impls", "", "BenchmarkRedis, Etcd, ZooKeeper, Postgres and MySQL: only the implementations whose name matches this regexp (all if empty), to compare a few without the others' load; the other benchmarks run all theirs")
)

// locker is one client of one lock implementation, as a separate process
// would have.
type locker interface {
	// lock takes key, waiting if wait is set, and returns the release.
	lock(ctx context.Context, key string, wait bool) (unlock func() error, err error)
}

// impl is one implementation under test on one backend.
type impl struct {
	name string
	// newLocker returns a new client; tb's cleanup closes it.
	newLocker func(tb testing.TB) locker
	// canWait is false for the raw floors, which have no way to wait.
	canWait bool
	// reqs returns the servers' request counter (summed over the servers the
	// implementation uses), or nil: not measured.
	reqs func() (float64, error)
	// oneSessionPerWaiter: waiters on one key need a client each.
	oneSessionPerWaiter bool
	// handoffOnly: a floor of the hand-off, not a lock: the uncontended and
	// contended scenarios leave it out (Handoff8 and the scale scenarios run it).
	handoffOnly bool
}

// dlockLocker adapts a dlock.Locker.
type dlockLocker struct{ l dlock.Locker }

func (d dlockLocker) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	var lease *dlock.Lease
	var err error
	if wait {
		lease, err = d.l.Acquire(ctx, key)
	} else {
		lease, err = d.l.TryAcquire(ctx, key)
	}
	if err != nil {
		return nil, err
	}
	return func() error { return lease.Release(context.Background()) }, nil
}

// driverLocker calls a backend.Driver as the Locker does, without one: an
// acquire with the benchmarks' TTL (waiting if asked), then a release.
type driverLocker struct{ d backend.Driver }

func (l driverLocker) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	g, err := l.d.Acquire(ctx, backend.AcquireRequest{Key: key, Owner: backend.NewOwnerID(), TTL: benchTTL, Wait: wait, OnLost: func(error) {}})
	if err != nil {
		return nil, err
	}
	return func() error { return l.d.Release(context.Background(), g) }, nil
}

// openDriver opens dsn's driver without a Locker; tb's cleanup closes it.
func openDriver(tb testing.TB, dsn string) driverLocker {
	tb.Helper()
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	open, ok := backend.Lookup(u.Scheme)
	if !ok {
		tb.Fatalf("no driver for %q", u.Scheme)
	}
	d, err := open(context.Background(), u)
	if err != nil {
		tb.Fatalf("%s driver: %v", u.Scheme, err)
	}
	tb.Cleanup(func() { _ = d.Close() })
	return driverLocker{d}
}

// openDlock opens dsn with the given TTL; tb's cleanup closes it.
func openDlock(tb testing.TB, dsn string, ttl time.Duration, opts ...dlock.Option) dlock.Locker {
	tb.Helper()
	l, err := dlock.Open(context.Background(), dsn, append([]dlock.Option{dlock.WithTTL(ttl)}, opts...)...)
	if err != nil {
		tb.Fatalf("open %s: %v", redactDSN(dsn), err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	return l
}

// redactDSN keeps only the scheme: the test servers have no passwords, but
// errors should not teach the habit of printing DSNs.
func redactDSN(dsn string) string {
	for i := range len(dsn) {
		if dsn[i] == ':' {
			return dsn[:i] + "://…"
		}
	}
	return "…"
}

// dlockImpl is the impl of a dlock driver at dsn.
func dlockImpl(name, dsn string, reqs func() (float64, error)) impl {
	return impl{
		name:      name,
		newLocker: func(tb testing.TB) locker { return dlockLocker{openDlock(tb, dsn, benchTTL)} },
		canWait:   true,
		reqs:      reqs,
	}
}

// sumReqs adds the counters of several servers.
func sumReqs(fs ...func() (float64, error)) func() (float64, error) {
	return func() (float64, error) {
		var sum float64
		for _, f := range fs {
			v, err := f()
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}
}

var keySeq atomic.Int64

// uniqueKey returns a key no earlier run used (the servers live for one
// top-level benchmark, but sub-benchmarks run several times).
func uniqueKey(parts ...string) string {
	k := "bench"
	for _, p := range parts {
		k += "/" + p
	}
	return k + "/" + strconv.FormatInt(keySeq.Add(1), 10)
}

// pct returns the p-th percentile of d (nearest rank, d unsorted).
func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p/100)]
}

func resetTimer(tb testing.TB) {
	if b, ok := tb.(*testing.B); ok {
		b.ResetTimer()
	}
}

func stopTimer(tb testing.TB) {
	if b, ok := tb.(*testing.B); ok {
		b.StopTimer()
	}
}

// report is b.ReportMetric for a benchmark and a log line for a test.
func report(tb testing.TB, v float64, unit string) {
	if b, ok := tb.(*testing.B); ok {
		b.ReportMetric(v, unit)
		return
	}
	tb.Logf("%s = %.4g", unit, v)
}

// ---- Uncontended -----------------------------------------------------------

// uncontendedResult holds one implementation's samples of one uncontended
// acquire + release.
type uncontendedResult struct {
	name    string
	samples []time.Duration
	total   time.Duration
	errors  int // failed cycles, not in samples
}

// maxErrors is how many failed lock or unlock calls one run tolerates (on a
// loaded machine a Redlock node can miss its timeout) before it fails: they
// are reported, not hidden.
const maxErrors = 20

// runUncontended runs n rounds; each round runs one uncontended
// try-acquire + release of every implementation, in an order shuffled every
// round, so that load from other processes hits all of them alike, and so
// that each follows every other equally often: what one leaves behind (a
// WAL flush's I/O still completing, a server process to wake) falls on a
// different one each round. (A rotation kept the order within a round: on
// PostgreSQL, tokens=sequence followed counter mode's flush in 3 rounds of
// 4, and measured 0.78× pg-advisory against 0.89× in a separate run with no
// flushing neighbour.)
func runUncontended(tb testing.TB, impls []impl, n int) []uncontendedResult {
	ctx := context.Background()
	ls := make([]locker, len(impls))
	keys := make([]string, len(impls))
	res := make([]uncontendedResult, len(impls))
	for i, im := range impls {
		ls[i] = im.newLocker(tb)
		keys[i] = uniqueKey("uncontended", im.name)
		res[i] = uncontendedResult{name: im.name, samples: make([]time.Duration, 0, n)}
		// One warm-up cycle: connections, scripts, leases.
		unlock, err := ls[i].lock(ctx, keys[i], false)
		if err != nil {
			tb.Fatalf("%s: warm-up lock: %v", im.name, err)
		}
		if err := unlock(); err != nil {
			tb.Fatalf("%s: warm-up unlock: %v", im.name, err)
		}
	}
	resetTimer(tb)
	inShuffledRounds(len(impls), n, func(i int) {
		start := time.Now()
		unlock, err := ls[i].lock(ctx, keys[i], false)
		if err == nil {
			err = unlock()
			if err != nil {
				err = fmt.Errorf("unlock: %w", err)
				// The key may stay locked until its TTL: use another.
				keys[i] = uniqueKey("uncontended", impls[i].name)
			}
		} else {
			err = fmt.Errorf("lock: %w", err)
		}
		if err != nil {
			res[i].errors++
			tb.Logf("NOTE uncontended: %s: %v", impls[i].name, err)
			if res[i].errors > maxErrors {
				tb.Fatalf("%s: more than %d errors", impls[i].name, maxErrors)
			}
			return
		}
		d := time.Since(start)
		res[i].samples = append(res[i].samples, d)
		res[i].total += d
	})
	stopTimer(tb)
	return res
}

// inShuffledRounds calls f once for each of 0 … n-1 in every one of rounds
// rounds, in an order shuffled every round — the same orders in every run —
// so that no implementation always follows the same neighbour.
func inShuffledRounds(n, rounds int, f func(i int)) {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range rounds {
		rng.Shuffle(n, func(a, b int) { order[a], order[b] = order[b], order[a] })
		for _, i := range order {
			f(i)
		}
	}
}

func reportUncontended(tb testing.TB, res []uncontendedResult) {
	for _, r := range res {
		report(tb, float64(len(r.samples))/r.total.Seconds(), r.name+".ops/s")
		report(tb, float64(pct(r.samples, 50).Nanoseconds()), r.name+".p50-ns")
		report(tb, float64(pct(r.samples, 99).Nanoseconds()), r.name+".p99-ns")
		report(tb, float64(r.errors), r.name+".errors")
	}
}

// ---- Contended -------------------------------------------------------------

// rotateHold is how long a contender holds the lock in rotation.
const rotateHold = 2 * time.Millisecond

type contendedResult struct {
	grants   int
	elapsed  time.Duration
	handoffs []time.Duration // release start → grant to a different contender
	waits    []time.Duration // one waiting lock call
	changed  int             // grants that went to another contender than the previous one
	overlaps int             // grants made while another contender held the lock
	errors   int             // failed lock or unlock calls (logged)
	reqs     float64         // server requests during the run; -1: not measured
}

// runContended runs n contenders, each with its own client, looping
// lock → unlock on one key until grants grants have been made in all.
//
// With rotate, a contender holds the lock for rotateHold, and once it
// released it does not call lock again until another contender got the lock:
// every grant is then a handoff to a contender that was already waiting when
// the lock was released (the hold outlasts a woken contender's first,
// immediate attempt), and the handoff latency measures how soon a waiter
// notices a release (for a polling lock, its poll interval), not how often a
// releaser takes the lock straight back.
func runContended(tb testing.TB, im impl, n, grants int, rotate bool) contendedResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ls := make([]locker, n)
	for i := range ls {
		ls[i] = im.newLocker(tb)
	}
	key := uniqueKey("contended", im.name, strconv.Itoa(n))
	var (
		remaining   atomic.Int64
		inside      atomic.Int32
		mu          sync.Mutex
		lastHolder  = -1
		lastRelease time.Time
		res         = contendedResult{reqs: -1}
		errOnce     sync.Once
		firstErr    error
		active      = n // contenders still looping
	)
	granted := sync.NewCond(&mu) // broadcast on every grant and exit
	remaining.Store(int64(grants))
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
		mu.Lock()
		granted.Broadcast()
		mu.Unlock()
	}
	// soft records a failed call and fails the run after maxErrors.
	soft := func(err error) {
		tb.Logf("NOTE contended, %d lockers: %v", n, err)
		mu.Lock()
		res.errors++
		n := res.errors
		mu.Unlock()
		if n > maxErrors {
			fail(fmt.Errorf("%s: more than %d errors, the last: %w", im.name, maxErrors, err))
		}
	}
	before := readReqs(tb, im)
	resetTimer(tb)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			defer func() {
				mu.Lock()
				active--
				granted.Broadcast()
				mu.Unlock()
			}()
			for remaining.Add(-1) >= 0 {
				t0 := time.Now()
				unlock, err := ls[i].lock(ctx, key, true)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					soft(fmt.Errorf("%s: contender %d: lock: %w", im.name, i, err))
					continue
				}
				got := time.Now()
				if inside.Add(1) != 1 {
					mu.Lock()
					res.overlaps++
					mu.Unlock()
				}
				mu.Lock()
				res.grants++
				res.waits = append(res.waits, got.Sub(t0))
				if lastHolder >= 0 && lastHolder != i {
					res.changed++
					res.handoffs = append(res.handoffs, got.Sub(lastRelease))
				}
				lastHolder = i
				mine := res.grants
				granted.Broadcast()
				mu.Unlock()
				if rotate {
					time.Sleep(rotateHold)
				}
				inside.Add(-1)
				mu.Lock()
				lastRelease = time.Now()
				mu.Unlock()
				if err := unlock(); err != nil {
					// The lock may stay held until its TTL runs out: the
					// others wait, as they would in production.
					soft(fmt.Errorf("%s: contender %d: unlock: %w", im.name, i, err))
				}
				if rotate {
					mu.Lock()
					for res.grants == mine && active > 1 && ctx.Err() == nil && remaining.Load() > 0 {
						granted.Wait()
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	stopTimer(tb)
	if firstErr != nil {
		tb.Fatal(firstErr)
	}
	if after := readReqs(tb, im); before >= 0 && after >= 0 {
		res.reqs = after - before
	}
	return res
}

func reportContended(tb testing.TB, r contendedResult) {
	report(tb, float64(r.grants)/r.elapsed.Seconds(), "grants/s")
	if len(r.handoffs) > 0 {
		report(tb, float64(pct(r.handoffs, 50).Nanoseconds()), "handoff-p50-ns")
		report(tb, float64(pct(r.handoffs, 99).Nanoseconds()), "handoff-p99-ns")
	}
	if r.grants > 1 {
		report(tb, 100*float64(r.changed)/float64(r.grants-1), "changed-%")
	}
	report(tb, float64(pct(r.waits, 99).Nanoseconds()), "wait-p99-ns")
	if r.reqs >= 0 && r.grants > 0 {
		report(tb, r.reqs/float64(r.grants), "reqs/grant")
	}
	report(tb, float64(r.overlaps), "overlaps")
	report(tb, float64(r.errors), "errors")
	if r.overlaps > 0 {
		tb.Errorf("%d grants overlapped another holder", r.overlaps)
	}
}

// readReqs reads im's request counter, or returns -1 when im has none.
func readReqs(tb testing.TB, im impl) float64 {
	if im.reqs == nil {
		return -1
	}
	v, err := im.reqs()
	if err != nil {
		tb.Fatalf("%s: reading the server's request counter: %v", im.name, err)
	}
	return v
}

// ---- Many keys held by one process ----------------------------------------

type holdResult struct {
	perAcquire time.Duration
	perLease   float64 // bytes of live heap per held lease
	goroutines float64 // goroutines per held lease
}

// runHold acquires n keys with one client, holds them all, measures the live
// heap they take, and releases them.
func runHold(tb testing.TB, im impl, n int) holdResult {
	ctx := context.Background()
	l := im.newLocker(tb)
	base := uniqueKey("hold", im.name)
	// Warm up the client so its connections are not counted per lease.
	unlock, err := l.lock(ctx, base+"/warm-up", false)
	if err != nil {
		tb.Fatalf("%s: warm-up: %v", im.name, err)
	}
	if err := unlock(); err != nil {
		tb.Fatalf("%s: warm-up release: %v", im.name, err)
	}
	heapBefore := liveHeap()
	gBefore := testenv.SteadyGoroutines()
	unlocks := make([]func() error, 0, n)
	start := time.Now()
	for i := range n {
		unlock, err := l.lock(ctx, base+"/"+strconv.Itoa(i), false)
		if err != nil {
			tb.Fatalf("%s: key %d: %v", im.name, i, err)
		}
		unlocks = append(unlocks, unlock)
	}
	took := time.Since(start)
	heapAfter := liveHeap()
	gAfter := testenv.SteadyGoroutines()
	for _, u := range unlocks {
		if err := u(); err != nil {
			tb.Fatalf("%s: release: %v", im.name, err)
		}
	}
	// The closures are part of what a caller keeps per lease.
	runtime.KeepAlive(unlocks)
	return holdResult{perAcquire: took / time.Duration(n), perLease: float64(heapAfter-heapBefore) / float64(n),
		goroutines: float64(gAfter-gBefore) / float64(n)}
}

// liveHeap returns the heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// ---- Keepalive load of many leases -----------------------------------------

type keepaliveResult struct {
	leases    int
	ttl       time.Duration
	measured  float64 // server requests per second while the leases are held
	trips     float64 // round trips per second (roundTrips), or -1
	expected  float64 // leases / (TTL/3)
	perLease  float64 // bytes of live heap per lease
	perLeaseG float64 // goroutines per lease
	retries   int     // acquires tried again after an error
	lost      int     // leases lost while held
}

// runKeepalive holds n leases of dlock with the given TTL (auto-renew on) and
// measures the server request rate over window.
// roundTrips, if not nil, counts round trips where reqs counts server
// operations (Redis: script calls, where reqs counts the commands they run
// too).
func runKeepalive(tb testing.TB, name, dsn string, reqs, roundTrips func() (float64, error), n int, ttl, window time.Duration) keepaliveResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := dlock.Open(ctx, dsn, dlock.WithTTL(ttl))
	if err != nil {
		tb.Fatalf("%s: open: %v", name, err)
	}
	defer func() { _ = l.Close() }()
	base := uniqueKey("keepalive", name)
	warm, err := l.TryAcquire(ctx, base+"/warm-up")
	if err != nil {
		tb.Fatalf("%s: warm-up: %v", name, err)
	}
	if err := warm.Release(ctx); err != nil {
		tb.Fatalf("%s: warm-up release: %v", name, err)
	}
	heapBefore := liveHeap()
	gBefore := testenv.SteadyGoroutines()
	leases := make([]*dlock.Lease, n)
	// Acquire in parallel: the scenario is about holding, not acquiring. An
	// acquire that fails (etcd answers "too many requests" when it falls
	// behind) is tried again, up to 10 times, and counted.
	const par = 8
	var wg sync.WaitGroup
	var next, retries atomic.Int64
	var acqErr atomic.Pointer[error]
	for range par {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || acqErr.Load() != nil {
					return
				}
				for attempt := 0; ; attempt++ {
					lease, err := l.TryAcquire(ctx, base+"/"+strconv.Itoa(i))
					if err == nil {
						leases[i] = lease
						break
					}
					if attempt == 10 {
						err = fmt.Errorf("%s: lease %d: %w", name, i, err)
						acqErr.CompareAndSwap(nil, &err)
						return
					}
					retries.Add(1)
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if p := acqErr.Load(); p != nil {
		tb.Fatal(*p)
	}
	gAfter := testenv.SteadyGoroutines()
	// Let the renewals spread out: they are due TTL/3 after each grant, and
	// the grants took a while.
	trips := func() float64 {
		if roundTrips == nil {
			return -1
		}
		v, err := roundTrips()
		if err != nil {
			tb.Fatal(err)
		}
		return v
	}
	v0, err := reqs()
	if err != nil {
		tb.Fatal(err)
	}
	t0 := time.Now()
	rt0 := trips()
	time.Sleep(window)
	v1, err := reqs()
	if err != nil {
		tb.Fatal(err)
	}
	rt1 := trips()
	elapsed := time.Since(t0)
	// The heap once every lease has renewed (some backends set up what a
	// renewal needs, a ZooKeeper watch, at the first one), measured after the
	// requests were counted, so its GC does not slow the renewals: the least
	// of a few readings, so that renewals in flight (thousands at once when
	// leases taken together come due together) are not counted as held.
	heapAfter := liveHeap()
	for range 4 {
		time.Sleep(250 * time.Millisecond)
		heapAfter = min(heapAfter, liveHeap())
	}
	lost := 0
	var firstLoss error
	for _, lease := range leases {
		if err := lease.Err(); err != nil {
			lost++
			if firstLoss == nil {
				firstLoss = err
			}
		}
	}
	if lost > 0 {
		// Reported as a metric (a failed benchmark prints no numbers), and
		// logged for the report's notes.
		tb.Logf("NOTE %s: %d of %d leases were lost while held; the first: %v", name, lost, n, firstLoss)
	}
	// Release in parallel too.
	next.Store(0)
	for range par {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				_ = leases[i].Release(ctx)
			}
		})
	}
	wg.Wait()
	r := keepaliveResult{
		leases:    n,
		ttl:       ttl,
		measured:  (v1 - v0) / elapsed.Seconds(),
		trips:     -1,
		expected:  float64(n) / (ttl / 3).Seconds(),
		perLease:  float64(heapAfter-heapBefore) / float64(n),
		perLeaseG: float64(gAfter-gBefore) / float64(n),
		retries:   int(retries.Load()),
		lost:      lost,
	}
	if roundTrips != nil {
		r.trips = (rt1 - rt0) / elapsed.Seconds()
	}
	return r
}

// scopedTB is tb with its own cleanups, run by close.
type scopedTB struct {
	testing.TB
	mu  sync.Mutex
	fns []func()
}

func (s *scopedTB) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fns = append(s.fns, f)
}

// close runs the cleanups, last registered first.
func (s *scopedTB) close() {
	s.mu.Lock()
	fns := s.fns
	s.fns = nil
	s.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// ---- Many waiters on one key -----------------------------------------------

type waitersResult struct {
	waiters  int
	handoffs int
	perGrant float64 // server requests per handoff while the waiters wait
	idleRate float64 // server requests per second while nothing changes hands
	gaveUp   int     // waiters whose lock call failed by itself (not cancelled)
}

// runWaiters starts n waiters on a key that clients of im hold, spread over
// clients clients, measures the idle request rate, then lets handoffs waiters
// take the lock one after another (each releases at once) and measures the
// server requests per handoff.
func runWaiters(tb testing.TB, im impl, n, clients, handoffs int) waitersResult {
	if im.reqs == nil {
		tb.Fatalf("%s: no request counter", im.name)
	}
	// Close the clients when this run ends, not with tb: the next run's
	// clients would add to their connections.
	sc := &scopedTB{TB: tb}
	defer sc.close()
	tb = sc
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := uniqueKey("waiters", im.name, strconv.Itoa(n))
	holder := im.newLocker(tb)
	unlock, err := holder.lock(ctx, key, false)
	if err != nil {
		tb.Fatalf("%s: holder: %v", im.name, err)
	}
	ls := make([]locker, clients)
	for i := range ls {
		ls[i] = im.newLocker(tb)
	}
	var (
		ended  = make(chan bool, n) // one per waiter: true if it got the lock
		inside atomic.Int32
		over   atomic.Int32
		gaveUp atomic.Int32
		wg     sync.WaitGroup
		failed atomic.Pointer[error]
	)
	for i := range n {
		wg.Go(func() {
			u, err := ls[i%clients].lock(ctx, key, true)
			if err != nil {
				if ctx.Err() == nil {
					// A peer may give up by itself (redislock stops waiting
					// after the TTL): counted and logged, not fatal.
					if gaveUp.Add(1) == 1 {
						tb.Logf("NOTE %s, %d waiters: waiter %d gave up: %v", im.name, n, i, err)
					}
				}
				ended <- false
				return
			}
			if inside.Add(1) != 1 {
				over.Add(1)
			}
			inside.Add(-1)
			if err := u(); err != nil && ctx.Err() == nil {
				err = fmt.Errorf("%s: waiter %d: release: %w", im.name, i, err)
				failed.CompareAndSwap(nil, &err)
			}
			ended <- true
		})
	}
	defer wg.Wait()
	defer cancel()
	// Wait for the waiters to settle: until the request rate stops falling.
	settle(tb, im, n)
	r0 := readReqs(tb, im)
	t0 := time.Now()
	time.Sleep(time.Second)
	r1 := readReqs(tb, im)
	idle := (r1 - r0) / time.Since(t0).Seconds()

	if err := unlock(); err != nil {
		tb.Fatalf("%s: holder release: %v", im.name, err)
	}
	deadline := time.After(2 * time.Minute)
	got, seen := 0, 0
	for got < handoffs {
		if seen == n {
			tb.Fatalf("%s: only %d handoffs: the other waiters gave up", im.name, got)
		}
		select {
		case ok := <-ended:
			seen++
			if ok {
				got++
			}
		case <-deadline:
			tb.Fatalf("%s: handoffs stalled after %d of %d", im.name, got, handoffs)
		}
	}
	r2 := readReqs(tb, im)
	// Let the other waiters through (zk.Lock takes no context, so its
	// waiters must get the lock to end); if that takes long (polling locks
	// with many waiters can starve), cancel the rest.
	drain := time.After(30 * time.Second)
drained:
	for ; seen < n; seen++ {
		select {
		case <-ended:
		case <-drain:
			cancel()
			break drained
		}
	}
	if p := failed.Load(); p != nil {
		tb.Fatal(*p)
	}
	if over.Load() > 0 {
		tb.Errorf("%s: %d grants overlapped another holder", im.name, over.Load())
	}
	return waitersResult{waiters: n, handoffs: handoffs, perGrant: (r2 - r1) / float64(handoffs), idleRate: idle, gaveUp: int(gaveUp.Load())}
}

// settle waits until n waiters have had time to register: at least
// 500ms + 2ms per waiter, and until the request counter's rate over 250ms
// no longer falls.
func settle(tb testing.TB, im impl, n int) {
	time.Sleep(500*time.Millisecond + time.Duration(n)*2*time.Millisecond)
	prev := -1.0
	for range 40 {
		r0 := readReqs(tb, im)
		time.Sleep(250 * time.Millisecond)
		d := readReqs(tb, im) - r0
		if prev >= 0 && d >= prev*0.9 {
			return
		}
		prev = d
	}
}
