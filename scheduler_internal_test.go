package dlock

import (
	"sync"
	"sync/atomic"
	"testing"

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
