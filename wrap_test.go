package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memlock"
)

// atomicCount is a memlock driver that counts its atomic multi-key tries
// (backend.MultiAcquirer).
type atomicCount struct {
	backend.Driver
	tries atomic.Int32
}

func (d *atomicCount) TryAcquireAll(ctx context.Context, reqs []backend.AcquireRequest) ([]*backend.Grant, error) {
	d.tries.Add(1)
	return d.Driver.(backend.MultiAcquirer).TryAcquireAll(ctx, reqs)
}

// plainWrapper wraps a Locker and forwards the Locker interface only.
type plainWrapper struct{ dlock.Locker }

// forwardingWrapper wraps a Locker and forwards dlock.MultiAcquirer too.
type forwardingWrapper struct{ dlock.Locker }

func (w forwardingWrapper) AcquireAll(ctx context.Context, keys []string, opts ...dlock.AcquireOption) (*dlock.LeaseSet, error) {
	return dlock.AcquireAll(ctx, w.Locker, keys, opts...)
}

func (w forwardingWrapper) TryAcquireAll(ctx context.Context, keys []string, opts ...dlock.AcquireOption) (*dlock.LeaseSet, error) {
	return dlock.TryAcquireAll(ctx, w.Locker, keys, opts...)
}

// TestWrapperKeepsAtomicAcquireAll: AcquireAll and TryAcquireAll take a set
// in one atomic step of the driver through a Locker of this package and
// through a wrapper that forwards dlock.MultiAcquirer, and the forwarding
// wrapper keeps the lock-order check (ErrLockOrder); a wrapper that forwards
// only the Locker interface takes the keys one by one.
func TestWrapperKeepsAtomicAcquireAll(t *testing.T) {
	ctx := context.Background()
	d := &atomicCount{Driver: memlock.NewStore().NewDriver()}
	l := newLocker(t, d)
	for _, tc := range []struct {
		name   string
		l      dlock.Locker
		atomic bool
	}{
		{"the Locker", l, true},
		{"a wrapper forwarding MultiAcquirer", forwardingWrapper{l}, true},
		{"a wrapper forwarding the Locker interface only", plainWrapper{l}, false},
	} {
		for _, all := range []func(context.Context, dlock.Locker, []string, ...dlock.AcquireOption) (*dlock.LeaseSet, error){dlock.AcquireAll, dlock.TryAcquireAll} {
			before := d.tries.Load()
			set, err := all(ctx, tc.l, []string{"w/a", "w/b", "w/c"})
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if err := set.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if got := d.tries.Load()-before > 0; got != tc.atomic {
				t.Errorf("%s: atomic step taken: %v, want %v", tc.name, got, tc.atomic)
			}
		}
	}
	err := dlock.Do(ctx, l, "w/b", func(fctx context.Context, _ *dlock.Lease) error {
		_, err := dlock.AcquireAll(fctx, forwardingWrapper{l}, []string{"w/a", "w/b"}, dlock.WithReentrant())
		if !errors.Is(err, dlock.ErrLockOrder) {
			t.Errorf("a re-entrant AcquireAll out of order through a forwarding wrapper: %v, want ErrLockOrder", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
