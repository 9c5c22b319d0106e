package dlock

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/clock"
)

// countingClock is the system clock, counting its readings.
type countingClock struct{ n atomic.Int64 }

func (c *countingClock) Now() time.Duration {
	c.n.Add(1)
	return clock.System.Now()
}

// TestCycleClockReads checks that an uncontended TryAcquire and Release read
// the Locker's clock three times: before the request, when the grant
// arrives, and when the release begins. Each read of the clocks costs a
// fraction of a microsecond on a VM, on every driver's hot path.
func TestCycleClockReads(t *testing.T) {
	clk := &countingClock{}
	l := newSuspendLocker(t, clk)
	ctx := context.Background()
	cycle := func() {
		lease, err := l.TryAcquire(ctx, "cycle")
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // the scheduler's loop reads the clock as it starts
	const n = 200
	before := clk.n.Load()
	for range n {
		cycle()
	}
	// The scheduler's loop reads the clock too, when it wakes (about once a
	// second here): a few reads in all.
	if per := float64(clk.n.Load()-before) / n; per > 3.1 {
		t.Errorf("a TryAcquire and Release read the clock %.2f times, want 3", per)
	}
}
