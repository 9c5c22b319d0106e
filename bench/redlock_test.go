package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/redis"   // the single-node baseline
	_ "github.com/dlock-go/dlock/redlock" // redlock://
)

// benchTTL is every implementation's TTL (redsync: expiry).
const benchTTL = 10 * time.Second

// locker is what the benchmarks compare: one client of one lock
// implementation, as a separate process would have.
type locker interface {
	// lock takes key, waiting if wait is set, and returns the release.
	lock(ctx context.Context, key string, wait bool) (unlock func() error, err error)
}

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
	return func() error { return lease.Release(ctx) }, nil
}

type redsyncLocker struct{ rs *redsync.Redsync }

func (r redsyncLocker) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	// Enough tries that a contended Lock does not give up (the default is 32,
	// 50–250ms apart).
	m := r.rs.NewMutex(key, redsync.WithExpiry(benchTTL), redsync.WithTries(1_000_000))
	var err error
	if wait {
		err = m.LockContext(ctx)
	} else {
		err = m.TryLockContext(ctx)
	}
	if err != nil {
		return nil, err
	}
	return func() error {
		ok, err := m.UnlockContext(ctx)
		if err == nil && !ok {
			err = fmt.Errorf("redsync: unlock of %q failed", key)
		}
		return err
	}, nil
}

// BenchmarkRedlock compares, on this machine, dlock's Redlock over 5
// redis-server processes with dlock's single-node Redis driver (one more
// redis-server) and with redsync over the same 5 servers (5 pools):
//
//   - AcquireRelease/IMPL: uncontended TryAcquire + Release, one client.
//   - Parallel8/IMPL: 8 goroutines of one client, each on its own key;
//     ops/s is the throughput.
//   - Handoff8/IMPL: 8 clients loop Acquire → Release on one key. Reports
//     ops/s, changed-hands-% (grants that went to another client than the
//     previous one) and handoff-p50/p99-µs (release → grant to another
//     client: how long a waiter takes to notice a release), wait-p99-ms and
//     wait-max-ms (one lock call: how long a client can starve).
//   - Interleaved: one uncontended cycle of each implementation per
//     iteration, so that load from other processes hits all three alike;
//     reports each one's mean and redlock's ratios to the others.
func BenchmarkRedlockVsRedsync(b *testing.B) {
	var nodes []*testenv.Redis
	var addrs []string
	for range 5 {
		n := testenv.StartRedis(b)
		nodes = append(nodes, n)
		addrs = append(addrs, n.Addr())
	}
	single := testenv.StartRedis(b)
	ctx := context.Background()

	newImpl := func(b *testing.B, name string) locker {
		switch name {
		case "redis1":
			l, err := dlock.Open(ctx, single.URL(), dlock.WithTTL(benchTTL))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close() })
			return dlockLocker{l}
		case "redlock5":
			l, err := dlock.Open(ctx, "redlock://"+strings.Join(addrs, ","), dlock.WithTTL(benchTTL))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close() })
			return dlockLocker{l}
		case "redsync5":
			var pools []redsyncredis.Pool
			for _, n := range nodes {
				cl := goredis.NewClient(&goredis.Options{Addr: n.Addr()})
				b.Cleanup(func() { _ = cl.Close() })
				pools = append(pools, redsyncgoredis.NewPool(cl))
			}
			return redsyncLocker{redsync.New(pools...)}
		}
		b.Fatalf("unknown implementation %q", name)
		return nil
	}
	impls := []string{"redis1", "redlock5", "redsync5"}

	for _, name := range impls {
		b.Run("AcquireRelease/"+name, func(b *testing.B) {
			l := newImpl(b, name)
			key := "bench/acquire-release/" + name
			b.ReportAllocs()
			for b.Loop() {
				unlock, err := l.lock(ctx, key, false)
				if err != nil {
					b.Fatal(err)
				}
				if err := unlock(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
	for _, name := range impls {
		b.Run("Parallel8/"+name, func(b *testing.B) {
			l := newImpl(b, name)
			var next atomic.Int64
			b.SetParallelism(4) // 4 × GOMAXPROCS (2 here) goroutines
			b.RunParallel(func(pb *testing.PB) {
				key := "bench/parallel/" + name + "/" + strconv.FormatInt(next.Add(1), 10)
				for pb.Next() {
					unlock, err := l.lock(ctx, key, false)
					if err != nil {
						b.Error(err)
						return
					}
					if err := unlock(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
	for _, name := range impls {
		b.Run("Handoff8/"+name, func(b *testing.B) {
			lockers := make([]locker, 8)
			for i := range lockers {
				lockers[i] = newImpl(b, name)
			}
			benchHandoff(b, lockers, "bench/handoff/"+name)
		})
	}
	b.Run("Interleaved", func(b *testing.B) {
		ls := make([]locker, len(impls))
		for i, name := range impls {
			ls[i] = newImpl(b, name)
		}
		took := make([]time.Duration, len(impls))
		for b.Loop() {
			for i, l := range ls {
				start := time.Now()
				unlock, err := l.lock(ctx, "bench/interleaved/"+impls[i], false)
				if err != nil {
					b.Fatal(err)
				}
				if err := unlock(); err != nil {
					b.Fatal(err)
				}
				took[i] += time.Since(start)
			}
		}
		n := float64(b.N)
		for i, name := range impls {
			b.ReportMetric(float64(took[i].Microseconds())/n, name+"-µs")
		}
		// Latency relative to the single node (target ≤ 1.5), and
		// throughput relative to redsync (target ≥ 1).
		b.ReportMetric(float64(took[1])/float64(took[0]), "redlock/redis1-latency")
		b.ReportMetric(float64(took[2])/float64(took[1]), "redlock/redsync-ops")
	})
}

func benchHandoff(b *testing.B, lockers []locker, key string) {
	conformance.MeasureHandoff(b, len(lockers), func(ctx context.Context, i int) (func() error, error) {
		return lockers[i].lock(ctx, key, true)
	})
}
