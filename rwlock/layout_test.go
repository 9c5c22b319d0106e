package rwlock_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memlock"
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
