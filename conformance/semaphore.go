package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/semaphore"
)

func (s *suite) semaphore(t *testing.T, l dlock.Locker, name string, n int, opts ...semaphore.Option) *semaphore.Semaphore {
	t.Helper()
	sem, err := semaphore.New(l, name, n, opts...)
	if err != nil {
		t.Fatalf("semaphore.New(%q, %d): %v", name, n, err)
	}
	return sem
}

// semaphoreWork is how long testSemaphore's holders hold a permit. It must
// outlast an acquire under contention for holders to overlap: where the
// backend's own semaphore layout serialises acquirers through a lock
// (ZooKeeper's, Curator's InterProcessSemaphoreV2: a lock, a listing, a
// create and a delete each, one acquirer at a time), holds of 2ms never
// overlapped on a three-server ensemble, and holds of 10ms reached 2 of 3.
const semaphoreWork = 20 * time.Millisecond

// testSemaphore: 4 lockers × 3 goroutines × 15 rounds take permits of a
// semaphore of 3. Never more than 3 hold one at once, two never hold the same
// slot, the holders do run side by side, each slot's tokens pass a guard
// keyed by the slot (strictly increasing where tokens are strict), and a
// TryAcquire while all 3 are held is refused with ErrNotAcquired.
func (s *suite) testSemaphore(t *testing.T) {
	const n, lockers, goroutines, rounds = 3, 4, 3, 15
	ctx := s.ctx(t)
	name := key(t)
	var (
		guard   fencing.Guard
		inside  atomic.Int32
		most    atomic.Int32
		mu      sync.Mutex
		holders = map[int]bool{}
	)
	var wg sync.WaitGroup
	errs := make(chan error, lockers*goroutines)
	for range lockers {
		sem := s.semaphore(t, s.locker(t), name, n, semaphore.WithLeaseOptions(dlock.WithTTL(30*time.Second)))
		for range goroutines {
			wg.Go(func() {
				for range rounds {
					p, err := sem.Acquire(ctx)
					if err != nil {
						errs <- err
						return
					}
					in := inside.Add(1)
					for m := most.Load(); in > m && !most.CompareAndSwap(m, in); m = most.Load() {
					}
					mu.Lock()
					if holders[p.Slot()] {
						t.Errorf("slot %d granted while held", p.Slot())
					}
					holders[p.Slot()] = true
					mu.Unlock()
					if s.fences() {
						check := guard.Do
						if s.caps.Fencing == backend.FencingStrict {
							check = guard.Advance
						}
						if err := check(p.Key(), p.Token(), func() error { return nil }); err != nil {
							t.Errorf("permit of slot %d: %v", p.Slot(), err)
						}
					}
					time.Sleep(semaphoreWork) // the work: lets holders overlap
					mu.Lock()
					delete(holders, p.Slot())
					mu.Unlock()
					inside.Add(-1)
					if err := p.Release(context.Background()); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("semaphore: %v", err)
	}
	if m := most.Load(); m > n {
		t.Fatalf("%d holders at once, the semaphore has %d permits", m, n)
	} else if m < 2 {
		t.Errorf("at most %d holder at once over %d acquires: the permits were never held side by side", m, lockers*goroutines*rounds)
	}
	t.Logf("at most %d of %d permits held at once", most.Load(), n)

	// All held: TryAcquire is refused, and takes nothing.
	sem := s.semaphore(t, s.locker(t), name, n)
	var held []*semaphore.Permit
	for range n {
		p, err := sem.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("TryAcquire of a free permit: %v", err)
		}
		held = append(held, p)
	}
	other := s.semaphore(t, s.locker(t), name, n)
	if p, err := other.TryAcquire(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire with all %d permits held: %v, %v; want ErrNotAcquired", n, p, err)
	}
	mustRelease(t, held[1].Lease())
	p, err := other.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire after a permit was released: %v", err)
	}
	if p.Slot() != held[1].Slot() {
		t.Errorf("granted slot %d, the free one was %d", p.Slot(), held[1].Slot())
	}
	mustRelease(t, p.Lease())
	mustRelease(t, held[0].Lease())
	mustRelease(t, held[2].Lease())
}

// testSemaphoreWakes: a waiter for a full semaphore is granted the permit
// released by its holder, pushed: with a poll interval of an hour.
func (s *suite) testSemaphoreWakes(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	a := s.semaphore(t, s.locker(t), name, 1)
	b := s.semaphore(t, s.locker(t), name, 1, semaphore.WithPollInterval(time.Hour))
	p, err := a.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan *semaphore.Permit, 1)
	go func() {
		q, err := b.Acquire(wctx)
		if err != nil && wctx.Err() == nil {
			t.Errorf("waiter: %v", err)
		}
		got <- q
	}()
	s.waitQueued(t, ctx, name)
	mustRelease(t, p.Lease())
	var q *semaphore.Permit
	select {
	case q = <-got:
	case <-time.After(10 * time.Second):
		cancel()
		<-got
		t.Fatal("the waiter was not granted the released permit within 10s (it polls once an hour: the release was not pushed)")
	}
	if q == nil {
		return
	}
	if s.fences() && q.Token() <= p.Token() {
		t.Errorf("the waiter's token %v is not above the released permit's %v", q.Token(), p.Token())
	}
	mustRelease(t, q.Lease())
}

// waitQueued returns once a waiter heads the semaphore's queue.
func (s *suite) waitQueued(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	probe := s.locker(t)
	for end := time.Now().Add(s.waitBound()); ; {
		in, err := dlock.Inspect(ctx, probe, name+"/permits/queue")
		if errors.Is(err, errors.ErrUnsupported) {
			time.Sleep(500 * time.Millisecond)
			return
		}
		if err != nil {
			t.Fatalf("Inspect the queue: %v", err)
		}
		if in.Held {
			return
		}
		if time.Now().After(end) {
			t.Fatal("no waiter joined the semaphore's queue")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// testSemaphoreHolderVanishes: the permits of a holder that vanished (no
// renewal; crashed where the harness can) come back after their TTL, and
// never before their deadline.
func (s *suite) testSemaphoreHolderVanishes(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	la := s.locker(t)
	a := s.semaphore(t, la, name, 2, semaphore.WithLeaseOptions(dlock.WithTTL(s.ttl), dlock.WithAutoRenew(false)))
	gone := map[int]*semaphore.Permit{}
	for range 2 {
		p, err := a.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gone[p.Slot()] = p
	}
	if cr, ok := s.h.(Crasher); ok {
		cr.Crash(t, la)
	}
	b := s.semaphore(t, s.locker(t), name, 2, semaphore.WithPollInterval(50*time.Millisecond))
	for range 2 {
		p, err := b.Acquire(ctx)
		returned := time.Now()
		if err != nil {
			t.Fatalf("acquire after the holder vanished: %v", err)
		}
		old := gone[p.Slot()]
		notBefore(t, fmt.Sprintf("slot %d (after its vanished holder)", p.Slot()), p.Lease().GrantedAt(), returned, old.Lease().Deadline())
		if s.fences() && p.Token() <= old.Token() {
			t.Errorf("slot %d: token %v not above the vanished holder's %v", p.Slot(), p.Token(), old.Token())
		}
		defer mustRelease(t, p.Lease())
	}
	for _, p := range gone {
		waitDone(t, p.Lease(), time.Second, "vanished holder's permit")
	}
}

// testSemaphoreCancel: a waiter cancelled mid-wait returns ErrNotAcquired
// with ctx's error, and leaves nothing: no queue, no permit, and the next
// release goes to a live waiter at once.
func (s *suite) testSemaphoreCancel(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	a := s.semaphore(t, s.locker(t), name, 1)
	b := s.semaphore(t, s.locker(t), name, 1)
	p, err := a.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		q, err := b.Acquire(wctx)
		if err == nil {
			q.Release(context.Background())
		}
		done <- err
	}()
	s.waitQueued(t, ctx, name)
	cancel()
	if err := <-done; !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v, want ErrNotAcquired and context.Canceled", err)
	}
	if left := s.residue(t, name+"/permits/queue"); len(left) > 0 {
		t.Fatalf("the cancelled waiter left its queue entry: %q", left)
	}
	mustRelease(t, p.Lease())
	if left := s.residue(t, semaphore.SlotKey(name, 0)); len(left) > 0 {
		t.Fatalf("after the cancel and the release, the backend still holds %q", left)
	}
	c := s.semaphore(t, s.locker(t), name, 1)
	q, err := c.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire after the cancel and the release: %v", err)
	}
	mustRelease(t, q.Lease())
}

// testSemaphoreSize: callers that disagree on the number of permits are
// refused with ErrSizeMismatch (the later one), and the refused grant is
// given back.
func (s *suite) testSemaphoreSize(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	if _, err := dlock.List(ctx, s.locker(t), name); errors.Is(err, errors.ErrUnsupported) {
		t.Skip("the backend cannot list locks: the size check is off")
	}
	two := s.semaphore(t, s.locker(t), name, 2)
	p, err := two.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 3} {
		other := s.semaphore(t, s.locker(t), name, n)
		for range 3 { // from a random slot: each try may land anywhere
			q, err := other.TryAcquire(ctx)
			if n == 1 && p.Slot() == 0 && errors.Is(err, dlock.ErrNotAcquired) {
				continue // its only slot is held: nothing to compare yet
			}
			if !errors.Is(err, semaphore.ErrSizeMismatch) {
				if err == nil {
					q.Release(ctx)
				}
				t.Fatalf("a semaphore of %d while a holder uses 2: %v, want ErrSizeMismatch", n, err)
			}
		}
	}
	// The refused grants were given back: both slots' other one is free.
	q, err := two.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire of the second permit after the refusals: %v", err)
	}
	mustRelease(t, q.Lease())
	mustRelease(t, p.Lease())
}

// testSemaphoreFenced: a permit lost behind its holder's back (the server
// expired it) is granted to another, and a guard keyed by the slot rejects
// the old holder's token.
func (s *suite) testSemaphoreFenced(t *testing.T) {
	if !s.fences() {
		t.Skip("the backend gives no fencing tokens")
	}
	ctx := s.ctx(t)
	name := key(t)
	a := s.semaphore(t, s.locker(t), name, 1)
	b := s.semaphore(t, s.locker(t), name, 1)
	old, err := a.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var guard fencing.Guard
	if err := guard.Do(old.Key(), old.Token(), func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	s.h.Expire(t, old.Key())
	p, err := b.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, p.Lease())
	if p.Key() != old.Key() {
		t.Fatalf("new permit on %q, old on %q", p.Key(), old.Key())
	}
	if err := guard.Do(p.Key(), p.Token(), func() error { return nil }); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}
	var stale *fencing.StaleTokenError
	if err := guard.Do(old.Key(), old.Token(), func() error { return nil }); !errors.As(err, &stale) {
		t.Fatalf("the expired holder's write: %v, want a StaleTokenError", err)
	}
	if err := old.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Release of the expired permit: %v, want ErrLeaseLost", err)
	}
}

// testSemaphoreMany: AcquireN takes k permits or none. A try that finds too
// few free takes nothing; a waiter at the head of the queue keeps what it
// gathers (so a single permit freed goes to it, not to a later try) and
// completes when enough are free; one cancelled mid-gathering gives back
// what it held; k outside 1..n is refused.
func (s *suite) testSemaphoreMany(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	a := s.semaphore(t, s.locker(t), name, 3)
	b := s.semaphore(t, s.locker(t), name, 3)
	c := s.semaphore(t, s.locker(t), name, 3)
	for _, k := range []int{0, 4} {
		if _, err := a.AcquireN(ctx, k); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("AcquireN(%d) of 3: %v, want ErrInvalidOption", k, err)
		}
	}
	two, err := a.AcquireN(ctx, 2)
	if err != nil || len(two) != 2 || two[0].Slot() == two[1].Slot() {
		t.Fatalf("AcquireN(2): %v, %v", two, err)
	}
	if _, err := b.TryAcquireN(ctx, 2); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquireN(2) with one free: %v, want ErrNotAcquired", err)
	}
	last, err := c.TryAcquire(ctx) // the try above took nothing
	if err != nil {
		t.Fatalf("TryAcquire of the one free permit after a failed TryAcquireN: %v", err)
	}

	got := make(chan []*semaphore.Permit, 1)
	go func() {
		ps, err := b.AcquireN(ctx, 2)
		if err != nil {
			t.Errorf("AcquireN(2): %v", err)
		}
		got <- ps
	}()
	s.waitQueued(t, ctx, name)
	mustRelease(t, two[0].Lease())
	// The freed permit goes to the waiter, which keeps it while it waits.
	probe := s.semaphore(t, s.locker(t), name, 3)
	for end := time.Now().Add(s.waitBound()); ; {
		p, err := probe.TryAcquire(ctx)
		if errors.Is(err, dlock.ErrNotAcquired) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		mustRelease(t, p.Lease()) // the waiter had not taken it yet
		if time.Now().After(end) {
			t.Fatal("the waiter at the head of the queue never took the freed permit")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// It keeps it: the same grant a while later. (In a backend's own layout
	// the probe may be refused before the waiter has taken the slot — on
	// ZooKeeper the waiter holds Curator's lock while it waits — so the
	// grant is read once the slot shows held.)
	inspectable := true
	inspect := func() dlock.LockInfo {
		in, err := dlock.Inspect(ctx, probe.Locker(), two[0].Key())
		if errors.Is(err, errors.ErrUnsupported) {
			inspectable = false
		} else if err != nil {
			t.Fatal(err)
		}
		return in
	}
	before := inspect()
	for end := time.Now().Add(s.waitBound()); inspectable && !before.Held; before = inspect() {
		if time.Now().After(end) {
			t.Fatalf("the freed slot %s not held by the waiter within %v", two[0].Key(), s.waitBound())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(10 * s.ttl / 10)
	if after := inspect(); before.Token != after.Token || before.Held != after.Held {
		t.Errorf("the waiter did not keep the permit it gathered: held %v token %v, then held %v token %v", before.Held, before.Token, after.Held, after.Token)
	}
	mustRelease(t, last.Lease())
	var ps []*semaphore.Permit
	select {
	case ps = <-got:
	case <-time.After(s.waitBound()):
		t.Fatal("AcquireN(2) not granted once two permits were free")
	}
	if len(ps) != 2 || ps[0].Slot() == ps[1].Slot() {
		t.Fatalf("AcquireN(2) gave %d permits", len(ps))
	}

	// Cancelled while holding part of what it asked for: gives it back.
	mustRelease(t, ps[0].Lease())
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.AcquireN(wctx, 3)
		done <- err
	}()
	s.waitQueued(t, ctx, name)
	cancel()
	if err := <-done; !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled AcquireN(3): %v, want ErrNotAcquired and context.Canceled", err)
	}
	mustRelease(t, ps[1].Lease())
	mustRelease(t, two[1].Lease())
	all, err := probe.TryAcquireN(ctx, 3)
	if err != nil {
		t.Fatalf("TryAcquireN(3) once everyone left: %v", err)
	}
	for _, p := range all {
		mustRelease(t, p.Lease())
	}
}

// testNativeSemaphore: a driver that claims Capabilities().NativeSemaphore grants up to n
// permits of a key (mode.WithPermits), each the lease of a distinct slot
// key, NAME/permits/i, whose tokens increase per slot; package semaphore
// uses that layout. A driver that does not claim it refuses WithPermits
// with errors.ErrUnsupported, and package semaphore uses slot locks.
func (s *suite) testNativeSemaphore(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	l := s.locker(t)
	if sem := s.semaphore(t, l, name, 2); sem.Native() != s.caps.NativeSemaphore {
		t.Errorf("semaphore.Native() = %v, Capabilities().NativeSemaphore = %v", sem.Native(), s.caps.NativeSemaphore)
	}
	if !s.caps.NativeSemaphore {
		if lease, err := l.TryAcquire(ctx, name, mode.WithPermits(2)); !errors.Is(err, errors.ErrUnsupported) {
			if err == nil {
				mustRelease(t, lease)
			}
			t.Fatalf("WithPermits on a driver that does not claim NativeSemaphore: %v, want errors.ErrUnsupported", err)
		}
		t.Skip("the backend claims no semaphore layout of its own (Capabilities().NativeSemaphore = false)")
	}
	other := s.locker(t)
	a, err := l.TryAcquire(ctx, name, mode.WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	b, err := other.Acquire(ctx, name, mode.WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	slots := map[string]bool{semaphore.SlotKey(name, 0): true, semaphore.SlotKey(name, 1): true}
	if !slots[a.Key()] || !slots[b.Key()] || a.Key() == b.Key() {
		t.Fatalf("two permits of 2 on keys %q and %q, want %q and %q", a.Key(), b.Key(), semaphore.SlotKey(name, 0), semaphore.SlotKey(name, 1))
	}
	if c, err := other.TryAcquire(ctx, name, mode.WithPermits(2)); !errors.Is(err, dlock.ErrNotAcquired) {
		if err == nil {
			mustRelease(t, c)
		}
		t.Fatalf("a third permit of 2: %v, want ErrNotAcquired", err)
	}
	if _, err := other.TryAcquire(ctx, name, mode.WithPermits(3)); !errors.Is(err, dlock.ErrSizeMismatch) && !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a permit of 3 while holders use 2: %v, want ErrSizeMismatch (or ErrNotAcquired where the layout records no count)", err)
	}
	mustRelease(t, a)
	c, err := other.Acquire(ctx, name, mode.WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	if c.Key() != a.Key() {
		t.Errorf("the freed slot was %q, the new permit took %q", a.Key(), c.Key())
	}
	if s.caps.Fencing == backend.FencingStrict && c.Token() <= a.Token() {
		t.Errorf("slot %q: token %v after %v", c.Key(), c.Token(), a.Token())
	}
	mustRelease(t, c)
	mustRelease(t, b)
}
