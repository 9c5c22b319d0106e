package schedule_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/schedule"
)

// BenchmarkRunCost compares, on one Redis, a bare lock cycle (TryAcquire
// and Release) with a run of Run in each mode and a call of Once that each
// run the work, on a run or key of their own.
func BenchmarkRunCost(b *testing.B) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, testenv.StartRedis(b).URL())
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	nop := func(context.Context, *dlock.Lease) error { return nil }
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b.Run("bare-lock-cycle", func(b *testing.B) {
		for b.Loop() {
			lease, err := l.TryAcquire(ctx, "bench/bare")
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, mode := range []schedule.Mode{schedule.NotRepeated, schedule.RetryLost} {
		name := map[schedule.Mode]string{schedule.NotRepeated: "Run-NotRepeated", schedule.RetryLost: "Run-RetryLost"}[mode]
		b.Run(name, func(b *testing.B) {
			job := schedule.Job{Name: "bench-" + name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36), AtMost: 10 * time.Second, Mode: mode, Retention: time.Minute}
			i := 0
			for b.Loop() {
				i++
				if r, err := schedule.Run(ctx, l, job, base.Add(time.Duration(i)*time.Second), nop); err != nil || r.Status != schedule.Ran {
					b.Fatal(r, err)
				}
			}
		})
	}
	b.Run("Once", func(b *testing.B) {
		round := strconv.FormatInt(time.Now().UnixNano(), 36)
		i := 0
		for b.Loop() {
			i++
			if r, err := schedule.Once(ctx, l, "bench/"+round+"/"+strconv.Itoa(i), nop, schedule.WithRetention(time.Minute)); err != nil || r.Status != schedule.Ran {
				b.Fatal(r, err)
			}
		}
	})
}
