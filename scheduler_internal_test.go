package dlock

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/clock"
)

// TestSpawnDuringStop: a driver may report a loss (and the lease spawn its
// clean-up release) while Close is stopping the scheduler. spawn must then
// run nothing: before the fix it started a goroutine after stop had begun
// waiting (a WaitGroup misuse -race reports) and called into a driver about
// to be closed.
func TestSpawnDuringStop(t *testing.T) {
	s := newScheduler(clock.System)
	var ran atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			<-start
			for range 1000 {
				s.spawn(func() { ran.Add(1) })
			}
		})
	}
	close(start)
	s.stop()
	after := ran.Load()
	for range 100 {
		s.spawn(func() { ran.Add(1) })
	}
	wg.Wait()
	s.stop() // waits for whatever spawn started before the first stop
	if got := ran.Load(); got != after {
		t.Fatalf("spawn ran %d functions after stop returned", got-after)
	}
}

// A Locker that takes and releases leases one after another, its scheduler's
// queue empty whenever the loop looks, wakes the loop about once per
// clock.MaxSleep, not once per lease: each wake-up is a goroutine switch (a
// futex call on Linux), which cost an uncontended Redis acquire+release about
// a tenth of its syscalls.
func TestSchedulerLoopNotWokenPerLease(t *testing.T) {
	l := newSuspendLocker(t, clock.System)
	var passes atomic.Int64
	l.sched.mu.Lock()
	l.sched.armedHook = func(time.Duration) { passes.Add(1) }
	l.sched.mu.Unlock()
	ctx := context.Background()
	const cycles = 300
	start := time.Now()
	for range cycles {
		lease, err := l.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		runtime.Gosched() // give the loop its chance to run, as a network round trip would
	}
	took := time.Since(start)
	// One pass per MaxSleep of the run, one for the first lease, and slack.
	limit := int64(took/clock.MaxSleep) + 3
	if n := passes.Load(); n > limit {
		t.Fatalf("the scheduler loop ran %d times for %d leases taken and released one after another in %v (want ≤ %d)", n, cycles, took, limit)
	}
}
