package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// ownerDel is the raw floor's release: an owner-checked DEL.
var ownerDel = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkRedis measures the driver against one redis-server:
//
//   - RawFloor: what any correct Redis lock costs with go-redis alone, two
//     round trips: SET NX PX with a random owner, then an owner-checked DEL.
//   - TryAcquireRelease: the same through dlock, uncontended, auto-renew on
//     with a long TTL: one script round trip each way.
//   - VsFloor: the floor, the driver alone and dlock, interleaved (see below).
//
// Contended hand-off is measured by BenchmarkConformance/Handoff8.
func BenchmarkRedis(b *testing.B) {
	srv := testenv.StartRedis(b)
	ctx := context.Background()

	b.Run("RawFloor", func(b *testing.B) {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
		defer c.Close()
		const k = "bench:raw"
		if err := ownerDel.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			owner := backend.NewOwnerID()
			ok, err := c.SetNX(ctx, k, owner, time.Minute).Result()
			if err != nil || !ok {
				b.Fatalf("SET NX: %v %v", ok, err)
			}
			if n, err := ownerDel.Run(ctx, c, []string{k}, owner).Int(); err != nil || n != 1 {
				b.Fatalf("DEL: %v %v", n, err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})

	b.Run("TryAcquireRelease", func(b *testing.B) {
		l := openLocker(b, srv, "", dlock.WithTTL(time.Minute), dlock.WithAutoRenew(true))
		const k = "bench/try-acquire-release"
		b.ReportAllocs()
		for b.Loop() {
			lease, err := l.TryAcquire(ctx, k)
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})

	// VsFloor interleaves one raw-floor cycle, one driver cycle (the driver
	// alone, without package dlock) and one dlock cycle per iteration, so
	// that load from other processes hits all three alike, and reports each
	// one's mean and dlock's throughput relative to the floor.
	b.Run("VsFloor", func(b *testing.B) {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
		defer c.Close()
		d, err := redis.NewDriver(ctx, c, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer d.Close()
		l := openLocker(b, srv, "", dlock.WithTTL(time.Minute))
		var raw, drv, lck time.Duration
		for b.Loop() {
			t0 := time.Now()
			owner := backend.NewOwnerID()
			if ok, err := c.SetNX(ctx, "bench:vs-floor", owner, time.Minute).Result(); err != nil || !ok {
				b.Fatalf("SET NX: %v %v", ok, err)
			}
			if err := ownerDel.Run(ctx, c, []string{"bench:vs-floor"}, owner).Err(); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			g, err := d.Acquire(ctx, backend.AcquireRequest{Key: "bench/vs-floor-driver", Owner: backend.NewOwnerID(), TTL: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			if err := d.Release(ctx, g); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			lease, err := l.TryAcquire(ctx, "bench/vs-floor-dlock")
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
			t3 := time.Now()
			raw += t1.Sub(t0)
			drv += t2.Sub(t1)
			lck += t3.Sub(t2)
		}
		n := float64(b.N)
		b.ReportMetric(float64(raw.Microseconds())/n, "floor-µs")
		b.ReportMetric(float64(drv.Microseconds())/n, "driver-µs")
		b.ReportMetric(float64(lck.Microseconds())/n, "dlock-µs")
		b.ReportMetric(float64(raw)/float64(lck), "dlock/floor-ops")
		b.ReportMetric(float64(raw)/float64(drv), "driver/floor-ops")
	})
}
