package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// AcquireAll with WithReentrant under a ctx that holds a key of the set
// above a key it must still take would take the lower key after the higher
// one: another AcquireAll of the same keys, holding the lower and waiting
// for the higher, deadlocks with it. It is refused at once with
// ErrLockOrder, and the other AcquireAll completes once the hold ends.
func TestAcquireAllReentrantRefusesOutOfOrder(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore()
	a, b, probe := newLocker(t, store.NewDriver()), newLocker(t, store.NewDriver()), newLocker(t, store.NewDriver())
	keys := []string{"set/a", "set/b"}
	other := make(chan error, 1)
	err := dlock.Do(ctx, a, "set/b", func(fctx context.Context, _ *dlock.Lease) error {
		go func() { // owned by the test: it reads other before returning
			set, err := dlock.AcquireAll(ctx, b, keys)
			if err == nil {
				err = set.Release(ctx)
			}
			other <- err
		}()
		// The other AcquireAll holds set/a and waits for set/b.
		for {
			lease, err := probe.TryAcquire(ctx, "set/a")
			if errors.Is(err, dlock.ErrNotAcquired) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
		bounded, cancel := context.WithTimeout(fctx, 2*time.Second)
		defer cancel()
		start := time.Now()
		set, err := dlock.AcquireAll(bounded, a, keys, dlock.WithReentrant())
		if err == nil {
			t.Error("AcquireAll of set/a under a hold of set/b was granted while another holder had set/a")
			return set.Release(ctx)
		}
		if !errors.Is(err, dlock.ErrLockOrder) || !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("AcquireAll of set/a and set/b under a hold of set/b, after %v: %v; want ErrLockOrder and ErrNotAcquired at once (a deadlock with the other AcquireAll otherwise)",
				time.Since(start).Round(time.Millisecond), err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-other:
		if err != nil {
			t.Fatalf("the other AcquireAll: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other AcquireAll was not granted within 10s of the hold's end")
	}
}

// What WithReentrant still allows in AcquireAll: held keys that sort below
// every key still to take (they are taken first anyway), keys held outside
// the set, and TryAcquireAll, which does not wait.
func TestAcquireAllReentrantInOrder(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, memlock.NewStore().NewDriver())
	err := dlock.Do(ctx, l, "set/b", func(fctx context.Context, outer *dlock.Lease) error {
		set, err := dlock.AcquireAll(fctx, l, []string{"set/b", "set/c"}, dlock.WithReentrant())
		if err != nil {
			t.Fatalf("AcquireAll of set/b (held) and set/c: %v", err)
		}
		if set.Lease("set/b").Token() != outer.Token() {
			t.Error("set/b in the set is not a nested hold of the held lease")
		}
		if err := set.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if outer.Err() != nil {
			t.Fatalf("the held lease after the set's release: %v", outer.Err())
		}
		set, err = dlock.TryAcquireAll(fctx, l, []string{"set/a", "set/b"}, dlock.WithReentrant())
		if err != nil {
			t.Fatalf("TryAcquireAll of set/a and set/b (held): %v", err)
		}
		if err := set.Release(ctx); err != nil {
			t.Fatal(err)
		}
		set, err = dlock.AcquireAll(fctx, l, []string{"other/a", "other/c"}, dlock.WithReentrant())
		if err != nil {
			t.Fatalf("AcquireAll of keys outside the hold: %v", err)
		}
		return set.Release(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
}
