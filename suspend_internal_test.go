package dlock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/clock"
	"github.com/dlock-go/dlock/memlock"
)

// suspendClock is the system clock plus a jump: what CLOCK_BOOTTIME does
// across a host suspend while Go's monotonic clock (and its timers) does not.
type suspendClock struct{ jumped atomic.Int64 }

func (c *suspendClock) Now() time.Duration {
	return clock.System.Now() + time.Duration(c.jumped.Load())
}
func (c *suspendClock) suspend(d time.Duration) { c.jumped.Add(int64(d)) }

func newSuspendLocker(t *testing.T, clk clock.Clock) *locker {
	t.Helper()
	s, err := defaultSettings().withLocker([]Option{WithTTL(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	l := newLockerClock(memlock.NewStore().NewDriver(), "mem", s, clk)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// asleep returns a channel that receives each time l's scheduler goes to
// sleep with at least min ahead of it: the moment a suspend can only be
// noticed by the scheduler waking up on its own.
func asleep(l *locker, min time.Duration) <-chan struct{} {
	ch := make(chan struct{}, 1)
	l.sched.mu.Lock()
	l.sched.armedHook = func(sleep time.Duration) {
		if sleep >= min {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	l.sched.mu.Unlock()
	return ch
}

// A suspend longer than the lease's validity ends the lease at the
// scheduler's first wake-up after resume — within clock.MaxSleep, long before
// the next renewal (TTL/3 = 10s) would have fired on Go's timers — and Err
// and Deadline say so at once.
func TestSuspendEndsLeaseAtFirstWakeUp(t *testing.T) {
	clk := &suspendClock{}
	l := newSuspendLocker(t, clk)
	slept := asleep(l, clock.MaxSleep)
	lease, err := l.Acquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if !lease.Deadline().After(time.Now().Add(20 * time.Second)) {
		t.Fatalf("Deadline %v, want about 30s ahead", time.Until(lease.Deadline()))
	}
	<-slept // the scheduler sleeps on a Go timer, which a suspend does not move

	clk.suspend(time.Minute) // the host slept for a minute; the server expired the lock
	resumed := time.Now()
	select {
	case <-lease.Done():
	case <-time.After(clock.MaxSleep + 2*time.Second):
		t.Fatalf("Done still open %v after a resume past the deadline", time.Since(resumed))
	}
	t.Logf("after %v: %v", time.Since(resumed), lease.Err())
	if err := lease.Err(); !errors.Is(err, ErrLeaseLost) || !errors.Is(err, errDeadlinePassed) {
		t.Fatalf("Err = %v, want ErrLeaseLost caused by the deadline", err)
	}
	if d := lease.Deadline(); !d.Before(resumed) {
		t.Fatalf("Deadline %v after the resume, want it in the past", d.Sub(resumed))
	}
}

// Err reads the suspend-aware clock itself: a holder that checks Err before
// writing learns of the loss without waiting for the scheduler.
func TestSuspendSeenByErrAtOnce(t *testing.T) {
	clk := &suspendClock{}
	l := newSuspendLocker(t, clk)
	lease, err := l.Acquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("Err before the suspend = %v", err)
	}
	clk.suspend(time.Minute)
	if err := lease.Err(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Err right after the resume = %v, want ErrLeaseLost", err)
	}
	select {
	case <-lease.Done():
	default:
		t.Fatal("Err reported the loss but Done is open")
	}
	if err := lease.Refresh(context.Background()); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Refresh after the resume = %v, want ErrLeaseLost", err)
	}
}

// A suspend shorter than what is left of the lease changes nothing: the
// keepalive renews it as usual.
func TestShortSuspendKeepsLease(t *testing.T) {
	clk := &suspendClock{}
	l := newSuspendLocker(t, clk)
	lease, err := l.Acquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	before := lease.Deadline()
	clk.suspend(5 * time.Second)
	if err := lease.Err(); err != nil {
		t.Fatalf("Err after a 5s suspend of a 30s lease = %v", err)
	}
	if got := before.Sub(lease.Deadline()); got < 4*time.Second || got > 6*time.Second {
		t.Fatalf("Deadline moved %v earlier, want the 5s suspend", got)
	}
	// The next renewal (due 10s after the grant, now 5s away) restores it.
	if err := lease.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !lease.Deadline().After(time.Now().Add(25 * time.Second)) {
		t.Fatalf("Deadline after a refresh %v ahead, want about 30s", time.Until(lease.Deadline()))
	}
}

// A holder resumed after a suspend (or a pause) that outlasted its lease and
// releases at once, before the keepalive looks: Release reports the loss.
func TestReleaseAfterDeadlineReportsLoss(t *testing.T) {
	clk := &suspendClock{}
	l := newSuspendLocker(t, clk)
	lease, err := l.Acquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	clk.suspend(time.Minute)
	if err := lease.Release(context.Background()); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Release after the deadline passed = %v, want ErrLeaseLost", err)
	}
	if err := lease.Err(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Err after that Release = %v, want ErrLeaseLost", err)
	}
}
