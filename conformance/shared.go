package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/mode"
)

// sharedOrSkip skips t where the backend does not claim shared locks,
// having checked that it refuses WithShared as documented.
func (s *suite) sharedOrSkip(t *testing.T, ctx context.Context, l dlock.Locker, k string) {
	t.Helper()
	if s.caps.Shared {
		return
	}
	lease, err := l.TryAcquire(ctx, k, mode.WithShared())
	if err == nil {
		_ = lease.Release(context.Background())
		t.Fatal("TryAcquire WithShared succeeded on a backend that does not claim shared locks")
	}
	if !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("TryAcquire WithShared: %v, want an error matching errors.ErrUnsupported", err)
	}
	t.Skip("the backend does not claim shared locks; WithShared is refused with ErrUnsupported")
}

// testShared: shared holders coexist and exclude an exclusive one; a waiting
// exclusive acquire goes before later shared ones and is granted when the
// last shared holder leaves; a run of shared waiters is granted together
// when the exclusive holder leaves; every grant's token is above the one
// before it; Inspect counts the shared holders; nothing is left.
func (s *suite) testShared(t *testing.T) {
	ctx := s.ctx(t)
	a, b, c, d := s.locker(t), s.locker(t), s.locker(t), s.locker(t)
	k := key(t)
	s.sharedOrSkip(t, ctx, a, k)
	strict := s.caps.Fencing == backend.FencingStrict
	above := func(what string, tok, prev dlock.Token) {
		t.Helper()
		if strict && tok <= prev {
			t.Errorf("%s: token %v is not above the grant before it (%v)", what, tok, prev)
		}
	}

	ra := mustAcquire(t, ctx, a, k, mode.WithShared())
	rb, err := b.TryAcquire(ctx, k, mode.WithShared())
	if err != nil {
		t.Fatalf("a second shared TryAcquire while the key is held shared: %v", err)
	}
	if !ra.Shared() || !rb.Shared() {
		t.Errorf("Shared() of shared leases: %v, %v", ra.Shared(), rb.Shared())
	}
	above("second shared grant", rb.Token(), ra.Token())
	if in, err := dlock.Inspect(ctx, c, k); err == nil {
		if !in.Held || in.Shared != 2 {
			t.Errorf("Inspect while two hold the key shared: Held %v, Shared %d, want true, 2", in.Held, in.Shared)
		}
	} else if !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Inspect: %v", err)
	}
	expectNotAcquired(t, ctx, c, k)

	// An exclusive waiter: later shared acquires queue behind it.
	type result struct {
		lease *dlock.Lease
		err   error
	}
	wrote := make(chan result, 1)
	go func() {
		lease, err := c.Acquire(ctx, k)
		wrote <- result{lease, err}
	}()
	s.waitWaiting(t, k, 1)
	if lease, err := d.TryAcquire(ctx, k, mode.WithShared()); err == nil {
		_ = lease.Release(context.Background())
		t.Fatal("a shared TryAcquire got in ahead of a waiting exclusive Acquire")
	} else if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("shared TryAcquire while an exclusive Acquire waits: %v, want ErrNotAcquired", err)
	}
	mustRelease(t, ra)
	select {
	case r := <-wrote:
		t.Fatalf("the exclusive Acquire returned while a shared holder remained: %+v", r)
	default:
	}
	mustRelease(t, rb)
	var w result
	select {
	case w = <-wrote:
	case <-time.After(s.waitBound()):
		t.Fatalf("the exclusive Acquire was not granted %v after the last shared holder left", s.waitBound())
	}
	if w.err != nil {
		t.Fatalf("exclusive Acquire: %v", w.err)
	}
	above("exclusive grant after the shared ones", w.lease.Token(), rb.Token())
	if w.lease.Shared() {
		t.Error("Shared() of an exclusive lease is true")
	}
	if lease, err := d.TryAcquire(ctx, k, mode.WithShared()); err == nil {
		_ = lease.Release(context.Background())
		t.Fatal("a shared TryAcquire succeeded while the key is held exclusively")
	}

	// Two shared waiters are granted together when the exclusive holder
	// leaves: neither releases before the other is granted.
	read := make(chan result, 2)
	for _, l := range []dlock.Locker{a, b} {
		go func() {
			lease, err := l.Acquire(ctx, k, mode.WithShared())
			read <- result{lease, err}
		}()
	}
	s.waitWaiting(t, k, 2)
	mustRelease(t, w.lease)
	var readers []*dlock.Lease
	for range 2 {
		select {
		case r := <-read:
			if r.err != nil {
				t.Fatalf("waiting shared Acquire: %v", r.err)
			}
			above("shared grant after the exclusive one", r.lease.Token(), w.lease.Token())
			readers = append(readers, r.lease)
		case <-time.After(s.waitBound()):
			t.Fatalf("a shared waiter was not granted %v after the exclusive holder left (the other was: %d)", s.waitBound(), len(readers))
		}
	}
	for _, r := range readers {
		mustRelease(t, r)
	}
	s.leavesNothing(t, ctx, k, "after shared and exclusive holds")
}

// testSharedHolderVanishes: a shared holder that stops renewing loses its
// lease, and an exclusive acquire is granted after its deadline, never
// before.
func (s *suite) testSharedHolderVanishes(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	k := key(t)
	s.sharedOrSkip(t, ctx, a, k)
	gone := mustAcquire(t, ctx, a, k, mode.WithShared(), dlock.WithTTL(s.ttl), dlock.WithAutoRenew(false))
	if cr, ok := s.h.(Crasher); ok {
		cr.Crash(t, a)
	}
	deadline := gone.Deadline()
	lease := mustAcquire(t, ctx, b, k)
	returned := time.Now()
	defer mustRelease(t, lease)
	notBefore(t, "the exclusive lock (after a vanished shared holder)", lease.GrantedAt(), returned, deadline)
	waitDone(t, gone, time.Second, "vanished shared holder's lease")
	if !errors.Is(gone.Err(), dlock.ErrLeaseLost) {
		t.Errorf("vanished shared holder's Err() = %v, want ErrLeaseLost", gone.Err())
	}
}

// testSharedCancel: a shared Acquire cancelled while it waits behind an
// exclusive holder leaves nothing, and an exclusive waiter that gives up
// lets the shared waiters behind it in.
func (s *suite) testSharedCancel(t *testing.T) {
	ctx := s.ctx(t)
	a, b, c := s.locker(t), s.locker(t), s.locker(t)
	k := key(t)
	s.sharedOrSkip(t, ctx, a, k)
	held := mustAcquire(t, ctx, a, k)
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := b.Acquire(wctx, k, mode.WithShared())
	cancel()
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shared Acquire behind an exclusive holder, ctx ended: %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	mustRelease(t, held)

	// A shared holder, an exclusive waiter that gives up, a shared waiter
	// behind it: the shared waiter gets in once the exclusive one is gone.
	r := mustAcquire(t, ctx, a, k, mode.WithShared())
	xctx, xcancel := context.WithCancel(ctx)
	xdone := make(chan error, 1)
	go func() {
		lease, err := b.Acquire(xctx, k)
		if err == nil {
			_ = lease.Release(context.Background())
		}
		xdone <- err
	}()
	s.waitWaiting(t, k, 1)
	got := make(chan error, 1)
	var second *dlock.Lease
	go func() {
		var err error
		second, err = c.Acquire(ctx, k, mode.WithShared())
		got <- err
	}()
	s.waitWaiting(t, k, 2)
	xcancel()
	if err := <-xdone; !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("cancelled exclusive Acquire: %v, want ErrNotAcquired", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("shared Acquire behind a cancelled exclusive one: %v", err)
		}
	case <-time.After(s.waitBound()):
		t.Fatalf("the shared waiter was not let in %v after the exclusive waiter ahead of it gave up", s.waitBound())
	}
	mustRelease(t, second)
	mustRelease(t, r)
	s.leavesNothing(t, ctx, k, "after cancelled shared and exclusive waits")
}
