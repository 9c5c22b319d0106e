package conformance

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// testReentrant: under the ctx Do gives its function, an Acquire,
// TryAcquire or Do of the same key on the same Locker with WithReentrant is a
// nested hold (same token, at once, no deadlock); releasing it keeps the lock
// held; outside that ctx, or without the option, the key is held as ever.
func (s *suite) testReentrant(t *testing.T) {
	ctx := s.ctx(t)
	l, other := s.locker(t), s.locker(t)
	k := key(t)
	err := dlock.Do(ctx, l, k, func(fctx context.Context, outer *dlock.Lease) error {
		bound, cancel := context.WithTimeout(fctx, 5*time.Second)
		defer cancel()
		inner, err := l.Acquire(bound, k, dlock.WithReentrant())
		if err != nil {
			t.Fatalf("nested Acquire under Do's ctx: %v", err)
		}
		if inner.Token() != outer.Token() || inner.Key() != k {
			t.Errorf("nested hold: key %q token %v, want %q %v", inner.Key(), inner.Token(), k, outer.Token())
		}
		try, err := l.TryAcquire(fctx, k, dlock.WithReentrant())
		if err != nil {
			t.Fatalf("nested TryAcquire under Do's ctx: %v", err)
		}
		ran := false
		if err := dlock.Do(fctx, l, k, func(context.Context, *dlock.Lease) error { ran = true; return nil }, dlock.WithReentrant()); err != nil || !ran {
			t.Fatalf("nested Do: ran=%v err=%v", ran, err)
		}
		mustRelease(t, try)
		mustRelease(t, inner)
		if err := inner.Release(fctx); !errors.Is(err, dlock.ErrReleased) {
			t.Errorf("second Release of a nested hold: %v, want ErrReleased", err)
		}
		select {
		case <-inner.Done():
		default:
			t.Error("a released nested hold's Done is not closed")
		}
		if err := outer.Err(); err != nil {
			t.Fatalf("the lease after its nested holds were released: %v", err)
		}
		expectNotAcquired(t, fctx, other, k) // still held

		// Without the option, or outside the lease's ctx, the key is held.
		if _, err := l.TryAcquire(fctx, k); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("TryAcquire without WithReentrant under the lease's ctx: %v, want ErrNotAcquired", err)
		}
		if _, err := l.TryAcquire(ctx, k, dlock.WithReentrant()); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("TryAcquire WithReentrant outside the lease's ctx: %v, want ErrNotAcquired", err)
		}
		if _, err := other.TryAcquire(fctx, k, dlock.WithReentrant()); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("TryAcquire WithReentrant on another Locker under the lease's ctx: %v, want ErrNotAcquired", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	lease := mustAcquire(t, ctx, other, k) // the outermost release freed it
	mustRelease(t, lease)
}

// testReentrantLoss: when a lease with nested holds is lost, every hold sees
// the loss, and a nested Acquire under it is refused with ErrLeaseLost.
func (s *suite) testReentrantLoss(t *testing.T) {
	ctx := s.ctx(t)
	l := s.locker(t)
	k := key(t)
	outer := mustAcquire(t, ctx, l, k, dlock.WithTTL(s.ttl))
	lctx := dlock.ContextWithLease(ctx, outer)
	inner, err := l.Acquire(lctx, k, dlock.WithReentrant())
	if err != nil {
		t.Fatalf("nested Acquire under ContextWithLease: %v", err)
	}
	s.h.Expire(t, k)
	waitDone(t, outer, 5*s.ttl+5*time.Second, "lease expired behind its back")
	waitDone(t, inner, time.Second, "nested hold of a lost lease")
	if err := inner.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("nested hold's Err after the loss: %v, want ErrLeaseLost", err)
	}
	if _, err := l.Acquire(lctx, k, dlock.WithReentrant()); !errors.Is(err, dlock.ErrLeaseLost) || !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("nested Acquire under a lost lease: %v, want ErrNotAcquired and ErrLeaseLost", err)
	}
	if err := inner.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Release of a nested hold of a lost lease: %v, want ErrLeaseLost", err)
	}
}

// testAcquireAllOverlapping: lockers take overlapping sets of keys with
// AcquireAll from many goroutines: none deadlocks (all finish within the
// bound), no key ever has two holders, and each lease of a set holds its key
// while the set is held.
func (s *suite) testAcquireAllOverlapping(t *testing.T) {
	ctx := s.ctx(t)
	base := key(t)
	keys := make([]string, 5)
	for i := range keys {
		keys[i] = base + "/" + strconv.Itoa(i)
	}
	const lockers, rounds = 4, 6
	var mu sync.Mutex
	inUse := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, lockers*rounds)
	for g := range lockers {
		l := s.locker(t)
		r := rand.New(rand.NewPCG(uint64(g), 7))
		wg.Go(func() {
			for range rounds {
				set := make([]string, 0, 3)
				for _, i := range r.Perm(len(keys))[:3] {
					set = append(set, keys[i])
				}
				ls, err := dlock.AcquireAll(ctx, l, set)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, k := range set {
					if inUse[k] {
						errs <- errors.New("key " + k + " has two holders")
					}
					inUse[k] = true
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				for _, k := range set {
					inUse[k] = false
				}
				mu.Unlock()
				if ls.Err() != nil {
					errs <- ls.Err()
				}
				if err := ls.Release(ctx); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// testAcquireAllNothingLeft: AcquireAll whose ctx ends while it waits for one
// key, and TryAcquireAll that finds one key held, leave none of the set's
// other keys held or queued; a set's Done closes when one of its leases is
// lost, and Release frees every key.
func (s *suite) testAcquireAllNothingLeft(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	base := key(t)
	keys := []string{base + "/a", base + "/b", base + "/c"}
	blocker := mustAcquire(t, ctx, b, keys[1])

	if _, err := dlock.TryAcquireAll(ctx, a, keys); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll with one key held: %v, want ErrNotAcquired", err)
	}
	for _, k := range []string{keys[0], keys[2]} {
		s.leavesNothing(t, ctx, k, "TryAcquireAll was refused")
	}

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := dlock.AcquireAll(cctx, a, keys)
		errc <- err
	}()
	s.waitWaiting(t, keys[1], 1)
	cancel()
	if err := <-errc; !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled AcquireAll: %v, want ErrNotAcquired and context.Canceled", err)
	}
	s.noWaiters(t, keys[1], "the cancelled AcquireAll returned")
	mustRelease(t, blocker)
	for _, k := range keys {
		s.leavesNothing(t, ctx, k, "an AcquireAll was cancelled")
	}

	set, err := dlock.AcquireAll(ctx, a, keys, dlock.WithTTL(s.ttl))
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Lease(keys[2]); got == nil || got.Key() != keys[2] {
		t.Fatalf("set.Lease(%q) = %v", keys[2], got)
	}
	if s.fences() {
		for _, lease := range set.Leases() {
			if lease.Token() == 0 {
				t.Errorf("lease of %q in a set has token 0", lease.Key())
			}
		}
	}
	s.h.Expire(t, keys[2])
	select {
	case <-set.Done():
	case <-time.After(5*s.ttl + 5*time.Second):
		t.Fatal("the set's Done was not closed after one of its leases was lost")
	}
	if err := set.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("set.Err() after a lease was lost: %v, want ErrLeaseLost", err)
	}
	if err := set.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Release of a set with a lost lease: %v, want ErrLeaseLost", err)
	}
	for _, k := range keys[:2] {
		s.leavesNothing(t, ctx, k, "the set was released")
	}
}
