package dlock

import (
	"context"
	"errors"
	"testing"
	"unsafe"

	"github.com/dlock-go/dlock/memlock"
)

func newMemLocker(t *testing.T) *locker {
	t.Helper()
	l := newLocker(memlock.NewStore().NewDriver(), "mem", defaultSettings())
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// A lease's Done is made on demand: asked for before the end it closes at
// the end; asked for after, it is closed already; the end closes it whether
// or not anyone asked.
func TestDoneMadeOnDemand(t *testing.T) {
	ctx := context.Background()
	l := newMemLocker(t)
	a, err := l.TryAcquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	done := a.Done()
	if a.Done() != done {
		t.Error("Done returned two channels")
	}
	select {
	case <-done:
		t.Fatal("Done closed while held")
	default:
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	b, err := l.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-b.Done() // first asked for after the end
	if !errors.Is(b.Err(), ErrReleased) {
		t.Errorf("Err after release: %v", b.Err())
	}
}

// Nested holds and Do register with their lease until they end, and leave
// nothing behind: a long-held lease does not grow with each nested hold.
// (That a nested hold still open ends with its lease is
// TestNestedHoldEndsWithOutermost's.)
func TestNestedHoldsLeaveNothingOnTheLease(t *testing.T) {
	ctx := context.Background()
	l := newMemLocker(t)
	outer, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	lctx := ContextWithLease(ctx, outer)
	for range 100 {
		n, err := l.Acquire(lctx, "k", WithReentrant())
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := Do(lctx, l, "k", func(context.Context, *Lease) error { return nil }, WithReentrant()); err != nil {
			t.Fatal(err)
		}
	}
	outer.mu.Lock()
	left := len(outer.onEnd)
	outer.mu.Unlock()
	if left != 0 {
		t.Errorf("%d functions left on the lease after 200 nested holds ended", left)
	}
}

// A lease's own size: a held lease is one of these plus what its driver
// keeps (docs/BENCHMARKS.md, Scale). 192 B is a size class of Go's
// allocator; one byte more costs 16.
func TestLeaseSize(t *testing.T) {
	if s := unsafe.Sizeof(Lease{}); s > 192 {
		t.Errorf("a Lease is %d B, more than 192", s)
	}
}
