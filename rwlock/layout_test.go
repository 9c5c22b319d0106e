package rwlock_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/observe"
	"github.com/dlock-go/dlock/rwlock"
)

// exclusiveOnly is a driver that does not claim shared locks.
type exclusiveOnly struct{ backend.Driver }

func (d exclusiveOnly) Capabilities() backend.Capabilities {
	c := d.Driver.Capabilities()
	c.Shared = false
	return c
}

// The layout follows the Locker: its own shared lock NAME where it claims
// one, a write lock and read slots elsewhere; either way readers share and a
// writer is refused while one reads.
func TestLayoutFollowsTheLocker(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore()
	shared, err := dlock.New(store.NewDriver())
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	portable, err := dlock.New(exclusiveOnly{memlock.NewStore().NewDriver()})
	if err != nil {
		t.Fatal(err)
	}
	defer portable.Close()
	for _, c := range []struct {
		l      dlock.Locker
		shared bool
		write  string
		reads  int
	}{{shared, true, "cfg", 0}, {portable, false, "cfg/write", rwlock.Readers}} {
		m, err := rwlock.New(c.l, "cfg")
		if err != nil {
			t.Fatal(err)
		}
		if m.Shared() != c.shared || m.WriteKey() != c.write || len(m.ReadKeys()) != c.reads {
			t.Errorf("Shared %v, WriteKey %q, %d read keys; want %v, %q, %d", m.Shared(), m.WriteKey(), len(m.ReadKeys()), c.shared, c.write, c.reads)
		}
		r1, err := m.TryRLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := m.TryRLock(ctx)
		if err != nil {
			t.Fatalf("a second reader (shared %v): %v", c.shared, err)
		}
		if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("TryLock while two read (shared %v): %v, want ErrNotAcquired", c.shared, err)
		}
		if c.shared {
			infos, _ := dlock.List(ctx, c.l, "")
			if len(infos) != 1 || infos[0].Key != "cfg" || infos[0].Shared != 2 {
				t.Errorf("two readers of the backend's own lock: %+v, want cfg held shared by 2", infos)
			}
		} else if r1.Lease().Key() == r2.Lease().Key() || !slices.Contains(m.ReadKeys(), r1.Lease().Key()) {
			t.Errorf("portable readers hold %q and %q, want two read slots", r1.Lease().Key(), r2.Lease().Key())
		}
		_ = r1.Release(ctx)
		_ = r2.Release(ctx)
		w, err := m.TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock once the readers left (shared %v): %v", c.shared, err)
		}
		if w.Token() <= r2.Token() {
			t.Errorf("write token %v not above the read's %v", w.Token(), r2.Token())
		}
		_ = w.Release(ctx)
	}
}

// breaker is a driver that reports and breaks its locks.
type breaker interface {
	backend.Inspector
	backend.Breaker
}

// breakable is exclusiveOnly that reports and breaks its locks.
type breakable struct {
	exclusiveOnly
	breaker
}

// A writer of the portable layout whose write lock is lost while it waits for
// the readers' slots does not come back with a hold that is already lost: it
// takes the write lock again.
// lossSignal is an Observer that sends the key of each lease lost.
type lossSignal chan string

func (s lossSignal) StartAcquire(ctx context.Context, a observe.AcquireInfo) (context.Context, func(observe.AcquireOutcome) observe.LeaseObserver) {
	return ctx, func(observe.AcquireOutcome) observe.LeaseObserver { return lossOf{s, a.Key} }
}

type lossOf struct {
	s   lossSignal
	key string
}

func (lossOf) Renewed(time.Duration, error) {}
func (lossOf) StartRelease(ctx context.Context) (context.Context, func(error)) {
	return ctx, func(error) {}
}
func (o lossOf) Ended(e observe.LeaseEnd) {
	if e.Lost {
		o.s <- o.key
	}
}

func TestWriteLockLostWhileSlotsAreTaken(t *testing.T) {
	ctx := context.Background()
	drv := memlock.NewStore().NewDriver()
	lost := make(lossSignal, 4)
	l, err := dlock.New(breakable{exclusiveOnly{drv}, drv.(breaker)}, dlock.WithObserver(lost))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	m, err := rwlock.New(l, "cfg")
	if err != nil {
		t.Fatal(err)
	}
	if m.Shared() {
		t.Fatal("the Locker claims shared locks: the test needs the portable layout")
	}
	r, err := m.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		h   *rwlock.Hold
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := m.Lock(ctx)
		got <- result{h, err}
	}()
	// The writer holds the write lock and waits for the reader's slot.
	var broken dlock.LockInfo
	for {
		info, err := dlock.Inspect(ctx, l, m.WriteKey())
		if err != nil {
			t.Fatal(err)
		}
		if info.Held { // the reader let go of it when TryRLock returned: the writer holds it
			broken = info
			break
		}
		time.Sleep(time.Millisecond) // polling the backend: a waiter sends no signal
	}
	if _, err := dlock.Break(ctx, l, m.WriteKey()); err != nil {
		t.Fatal(err)
	}
	// The lease learns of the break from the backend's loss signal, a moment
	// later; only then is the hold known to be lost while it waits.
	if k := <-lost; k != m.WriteKey() {
		t.Fatalf("lease of %q lost, want %q", k, m.WriteKey())
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if res.err != nil {
		t.Fatalf("Lock after its write lock was broken while it waited: %v", res.err)
	}
	defer res.h.Release(ctx)
	select {
	case <-res.h.Done():
		t.Fatalf("Lock returned a hold that had already ended: %v", res.h.Err())
	default:
	}
	if res.h.Token() <= dlock.Token(broken.Token) {
		t.Errorf("hold's token %v, want one above the broken write lock's %v (taken again)", res.h.Token(), broken.Token)
	}
}
