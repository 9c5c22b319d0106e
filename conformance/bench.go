package conformance

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// RunBenchmarks measures a backend through the public API: AcquireRelease
// (uncontended TryAcquire and Release) and Handoff8 (MeasureHandoff with 8
// lockers on one key). Compare with benchstat; never assert on the numbers.
func RunBenchmarks(b *testing.B, h Harness) {
	b.Run("AcquireRelease", func(b *testing.B) {
		l := benchLocker(b, h)
		ctx := context.Background()
		k := benchKey("acquire-release")
		b.ReportAllocs()
		for b.Loop() {
			lease, err := l.TryAcquire(ctx, k, dlock.WithTTL(time.Minute))
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Handoff8", func(b *testing.B) { benchHandoff(b, h, 8) })
}

func benchLocker(b *testing.B, h Harness) dlock.Locker {
	l := h.NewLocker(b)
	b.Cleanup(func() { _ = l.Close() })
	return l
}

func benchKey(name string) string {
	return "conformance-bench/" + name + "/" + time.Now().Format("150405.000000000")
}

func benchHandoff(b *testing.B, h Harness, n int) {
	lockers := make([]dlock.Locker, n)
	for i := range lockers {
		lockers[i] = benchLocker(b, h)
	}
	k := benchKey("handoff")
	MeasureHandoff(b, n, func(ctx context.Context, i int) (func() error, error) {
		lease, err := lockers[i].Acquire(ctx, k, dlock.WithTTL(time.Minute))
		if err != nil {
			return nil, err
		}
		return func() error { return lease.Release(ctx) }, nil
	})
}

// MeasureHandoff runs n contenders looping acquire (blocking until contender
// i holds the lock) and release until b.N grants, and reports handoff-p50-µs,
// handoff-p99-µs, changed-hands-% and wait-p99-ms; it fails if two contenders
// ever hold the lock at once. Use it to measure a peer library alike.
func MeasureHandoff(b *testing.B, n int, acquire func(ctx context.Context, i int) (release func() error, err error)) {
	ctx := context.Background()
	var (
		remaining   atomic.Int64
		inside      atomic.Int32
		mu          sync.Mutex
		lastHolder  = -1
		lastRelease time.Time
		handoffs    []time.Duration
		waits       []time.Duration
		changed     int
		grants      int
	)
	remaining.Store(int64(b.N))
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for remaining.Add(-1) >= 0 {
				start := time.Now()
				release, err := acquire(ctx, i)
				if err != nil {
					b.Error(err)
					return
				}
				got := time.Now()
				if inside.Add(1) != 1 {
					b.Error("two contenders held the lock at once")
				}
				mu.Lock()
				grants++
				waits = append(waits, got.Sub(start))
				if lastHolder >= 0 {
					handoffs = append(handoffs, got.Sub(lastRelease))
					if lastHolder != i {
						changed++
					}
				}
				lastHolder = i
				lastRelease = time.Now()
				mu.Unlock()
				inside.Add(-1)
				if err := release(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if len(handoffs) > 0 {
		b.ReportMetric(float64(pct(handoffs, 50).Microseconds()), "handoff-p50-µs")
		b.ReportMetric(float64(pct(handoffs, 99).Microseconds()), "handoff-p99-µs")
		b.ReportMetric(100*float64(changed)/float64(grants-1), "changed-hands-%")
	}
	if len(waits) > 0 {
		b.ReportMetric(float64(pct(waits, 99).Microseconds())/1000, "wait-p99-ms")
	}
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s) - 1) * p / 100
	return s[i]
}
