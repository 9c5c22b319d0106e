package redis_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/observe"
	"github.com/dlock-go/dlock/rwlock"
)

// writeObserver watches one Locker's leases of a read/write lock in the
// portable layout: it reports the read slot a read hold takes and its loss,
// and holds up the first release of the write lock until release is called.
type writeObserver struct {
	write, slots string

	slot    chan string   // the key of a read slot granted
	lost    chan struct{} // a read slot's lease ended lost
	blocked chan struct{} // closed when the first release of the write lock is held up
	unblock chan struct{}
	held    sync.Once
	freed   sync.Once
}

func (o *writeObserver) release() { o.freed.Do(func() { close(o.unblock) }) }

func (o *writeObserver) StartAcquire(ctx context.Context, a observe.AcquireInfo) (context.Context, func(observe.AcquireOutcome) observe.LeaseObserver) {
	return ctx, func(out observe.AcquireOutcome) observe.LeaseObserver {
		switch {
		case out.Result != observe.ResultGranted:
			return nil
		case a.Key == o.write:
			return writeLease{o}
		case strings.HasPrefix(a.Key, o.slots) && !strings.HasSuffix(a.Key, "/queue"):
			o.slot <- a.Key
			return slotLease{o}
		}
		return nil
	}
}

type writeLease struct{ o *writeObserver }

func (writeLease) Renewed(time.Duration, error) {}
func (writeLease) Ended(observe.LeaseEnd)       {}
func (w writeLease) StartRelease(ctx context.Context) (context.Context, func(error)) {
	first := false
	w.o.held.Do(func() { first = true })
	if first {
		close(w.o.blocked)
		<-w.o.unblock
	}
	return ctx, func(error) {}
}

type slotLease struct{ o *writeObserver }

func (slotLease) Renewed(time.Duration, error) {}
func (slotLease) StartRelease(ctx context.Context) (context.Context, func(error)) {
	return ctx, func(error) {}
}
func (s slotLease) Ended(e observe.LeaseEnd) {
	if e.Lost {
		s.o.lost <- struct{}{}
	}
}

// A read hold in the portable layout takes the write lock, a read slot,
// and gives the write lock back before it returns: a round trip, longer on
// a loaded host. A read slot lost meanwhile must not be handed out as a
// read hold: a writer may take that slot, and write beside the reader. The
// test holds the write lock's release up and breaks the reader's slot
// meanwhile; RLock must then fail (or return a hold of its own), not
// return the lost one.
func TestRLockHandsOutNoSlotLostGivingBackTheWriteLock(t *testing.T) {
	srv := testenv.StartRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const name = "rw/giving-back"
	obs := &writeObserver{write: name + "/write", slots: name + "/read/permits/",
		slot: make(chan string, 8), lost: make(chan struct{}, 8), blocked: make(chan struct{}), unblock: make(chan struct{})}
	// Fair mode claims no shared locks: the portable layout.
	a := openLocker(t, srv, "fair=true", dlock.WithObserver(obs), dlock.WithTTL(time.Second))
	b := openLocker(t, srv, "fair=true")
	t.Cleanup(obs.release) // before the Lockers close: a failed test must not leave A's release held up
	m, err := rwlock.New(a, name)
	if err != nil {
		t.Fatal(err)
	}
	if m.Shared() {
		t.Fatal("Redis in fair mode has no shared locks: the read/write lock should take the portable layout")
	}
	type result struct {
		h   *rwlock.Hold
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := m.RLock(ctx)
		got <- result{h, err}
	}()
	slot := <-obs.slot
	select {
	case <-obs.blocked:
	case r := <-got:
		t.Fatalf("RLock returned (%v, %v) without giving the write lock back", r.h, r.err)
	}
	if _, err := dlock.Break(ctx, b, slot); err != nil {
		t.Fatalf("break the reader's slot %q: %v", slot, err)
	}
	<-obs.lost // at the slot lease's next renewal at the latest
	obs.release()
	r := <-got
	if r.err == nil {
		defer r.h.Release(context.Background())
		if err := r.h.Err(); err != nil {
			t.Fatalf("RLock returned a read hold whose slot %q was lost before it returned: %v", slot, err)
		}
	} else if !errors.Is(r.err, dlock.ErrNotAcquired) {
		t.Fatalf("RLock: %v, want a hold or ErrNotAcquired", r.err)
	}
}
