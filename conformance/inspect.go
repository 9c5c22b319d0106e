package conformance

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// supports returns false, after skipping t, when err says the backend cannot
// do what was asked.
func supports(t *testing.T, err error, what string) bool {
	t.Helper()
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("the backend cannot %s: %v", what, err)
		return false
	}
	return true
}

// testInspect: Inspect, from another client, reports the holder's token and
// label, a grant time and expiry consistent with the lease, and the waiter it
// knows of; List lists the held key with the same holder; a free key is not
// held and not listed.
func (s *suite) testInspect(t *testing.T) {
	ctx := s.ctx(t)
	holder, viewer, waiterL := s.locker(t), s.locker(t), s.locker(t)
	base := key(t)
	k, free := base+"/held", base+"/free"
	const label = "conformance-holder:42"

	info, err := dlock.Inspect(ctx, viewer, free)
	if !supports(t, err, "report its locks") {
		return
	}
	if err != nil {
		t.Fatalf("Inspect of a free key: %v", err)
	}
	if info.Held || info.Key != free {
		t.Fatalf("Inspect of a free key: %+v, want not held", info)
	}

	before := time.Now()
	lease := mustAcquire(t, ctx, holder, k, dlock.WithLabel(label))
	defer lease.Release(context.Background())
	after := time.Now()
	info, err = dlock.Inspect(ctx, viewer, k)
	if err != nil {
		t.Fatalf("Inspect of a held key: %v", err)
	}
	t.Logf("Inspect: %+v", info)
	switch {
	case !info.Held:
		t.Fatalf("Inspect of a held key: not held (%+v)", info)
	case info.Key != k:
		t.Errorf("Inspect: key %q, want %q", info.Key, k)
	case s.fences() && info.Token != 0 && info.Token != uint64(lease.Token()): // 0: the backend cannot tell (Redlock)
		t.Errorf("Inspect: token %d, want the holder's %d", info.Token, lease.Token())
	case info.Label != label:
		t.Errorf("Inspect: label %q, want the holder's %q", info.Label, label)
	}
	const skew = 2 * time.Second // one machine: the server's clock is ours, give or take its resolution
	if !info.Granted.IsZero() && (info.Granted.Before(before.Add(-skew)) || info.Granted.After(after.Add(skew))) {
		t.Errorf("Inspect: granted %v, want between %v and %v", info.Granted, before, after)
	}
	if !info.Expires.IsZero() {
		// (Within a second: etcd reports a lease's time to live in whole
		// seconds.)
		if info.Expires.Before(lease.Deadline().Add(-time.Second)) {
			t.Errorf("Inspect: the server expires the lock at %v, before the holder's deadline %v", info.Expires, lease.Deadline())
		}
		if info.Expires.After(after.Add(dlock.DefaultTTL + skew)) {
			t.Errorf("Inspect: expires %v, more than a TTL (%v) after the grant", info.Expires, dlock.DefaultTTL)
		}
	}

	if info.Waiters >= 0 {
		if info.Waiters != 0 {
			t.Errorf("Inspect: %d waiters, want 0", info.Waiters)
		}
		wctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := waiterL.Acquire(wctx, k)
			errc <- err
		}()
		deadline := time.Now().Add(s.waitBound())
		for {
			info, err = dlock.Inspect(ctx, viewer, k)
			if err != nil {
				t.Fatal(err)
			}
			if info.Waiters == 1 {
				break
			}
			if info.Waiters > 1 || time.Now().After(deadline) {
				t.Fatalf("Inspect with one client waiting: %d waiters", info.Waiters)
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-errc; !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("cancelled waiter: %v", err)
		}
	}

	infos, err := dlock.List(ctx, viewer, base)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Logf("the backend cannot list its locks: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(infos) != 1 || infos[0].Key != k || infos[0].Label != label || s.fences() && infos[0].Token != info.Token {
		t.Fatalf("List(%q) = %+v, want only %q held by %q with token %d", base, infos, k, label, lease.Token())
	}
}

// testBreak: Break, from another client, removes the holder and says whom it
// removed; the holder's lease ends as lost; the next holder's token is
// higher, and a guard rejects the broken holder's write after the next
// holder's. Breaking a free key matches ErrNotHeld.
func (s *suite) testBreak(t *testing.T) {
	ctx := s.ctx(t)
	holder, admin, next := s.locker(t), s.locker(t), s.locker(t)
	k := key(t)

	_, err := dlock.Break(ctx, admin, k)
	if !supports(t, err, "break locks") {
		return
	}
	if !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Break of a free key: %v, want ErrNotHeld", err)
	}
	s.testBreakRace(t)

	var storage fencing.Guard
	lease := mustAcquire(t, ctx, holder, k, dlock.WithTTL(s.ttl))
	if err := storage.Do(k, lease.Token(), func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	info, err := dlock.Break(ctx, admin, k)
	if err != nil {
		t.Fatalf("Break of a held key: %v", err)
	}
	if !info.Held || s.fences() && info.Token != 0 && info.Token != uint64(lease.Token()) {
		t.Errorf("Break returned %+v, want the holder with token %d", info, lease.Token())
	}
	waitDone(t, lease, 5*s.ttl+5*time.Second, "broken holder's lease")
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("broken holder's Err() = %v, want ErrLeaseLost", lease.Err())
	}
	nextLease := mustAcquire(t, ctx, next, k)
	defer mustRelease(t, nextLease)
	if !s.fences() {
		return
	}
	if nextLease.Token() <= lease.Token() {
		t.Fatalf("token after a break %d ≤ the broken holder's %d", nextLease.Token(), lease.Token())
	}
	if err := storage.Do(k, nextLease.Token(), func() error { return nil }); err != nil {
		t.Fatalf("next holder's write: %v", err)
	}
	if err := storage.Do(k, lease.Token(), func() error { return nil }); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("broken holder's write after the next holder's: %v, want ErrStaleToken", err)
	}
}

// testRelabel: SetLabel changes the label Inspect reports (from another
// client) while the lease stays held, renewals racing it included; setting
// the label it has keeps the lease; a Watch of the key hears the change;
// Refresh and Release still work after it; a label that cannot be stored is
// refused; a broken (lost) or released lease's SetLabel says so.
func (s *suite) testRelabel(t *testing.T) {
	ctx := s.ctx(t)
	holder, viewer := s.locker(t), s.locker(t)
	k := key(t)
	ttl := max(s.ttl, 300*time.Millisecond) // renewals every third of it race the relabels below
	lease := mustAcquire(t, ctx, holder, k, dlock.WithTTL(ttl), dlock.WithLabel("before"))
	err := lease.SetLabel(ctx, "after")
	if !supports(t, err, "change a held lock's label") {
		mustRelease(t, lease)
		return
	}
	if err != nil {
		t.Fatalf("SetLabel: %v", err)
	}
	readLabel := func(want string) {
		t.Helper()
		info, err := dlock.Inspect(ctx, viewer, k)
		if errors.Is(err, errors.ErrUnsupported) {
			return
		}
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		if !info.Held || info.Label != want {
			t.Fatalf("Inspect after SetLabel(%q): %+v", want, info)
		}
		if s.fences() && info.Token != 0 && info.Token != uint64(lease.Token()) {
			t.Fatalf("Inspect after SetLabel: token %d, want the holder's %d", info.Token, lease.Token())
		}
	}
	readLabel("after")

	// Setting the label it already has changes nothing and keeps the lease
	// (election's Proclaim of the current value).
	if err := lease.SetLabel(ctx, "after"); err != nil {
		t.Fatalf("SetLabel to the label the lease already has: %v", err)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("after SetLabel to the same label the lease ended: %v", err)
	}
	readLabel("after")

	// A follower hears the change, where the backend pushes changes.
	heard := make(chan struct{}, 1)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watching := dlock.Watch(wctx, viewer, k, func() {
		select {
		case heard <- struct{}{}:
		default:
		}
	}) == nil
	if watching {
		select { // a spurious call at the start is allowed: drain it
		case <-heard:
		default:
		}
		if err := lease.SetLabel(ctx, "pushed"); err != nil {
			t.Fatalf("SetLabel: %v", err)
		}
		select {
		case <-heard:
		case <-time.After(PushWaitBound + time.Second):
			t.Fatalf("a Watch of the key did not hear SetLabel within %v", PushWaitBound+time.Second)
		}
		readLabel("pushed")
	}
	stopWatch()

	// Relabels racing the keepalive's renewals lose nothing.
	end := time.Now().Add(2 * ttl)
	n := 0
	for time.Now().Before(end) {
		time.Sleep(ttl / 50) // pacing: about a hundred relabels over the renewals of two TTLs
		n++
		if err := lease.SetLabel(ctx, fmt.Sprintf("racing-%d", n)); err != nil {
			t.Fatalf("SetLabel #%d racing renewals: %v", n, err)
		}
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("after %d relabels racing renewals the lease ended: %v", n, err)
	}
	readLabel(fmt.Sprintf("racing-%d", n))
	if err := lease.Refresh(ctx); err != nil {
		t.Fatalf("Refresh after SetLabel: %v", err)
	}
	if err := lease.SetLabel(ctx, "bad\x00label"); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("SetLabel of an unprintable label: %v, want ErrInvalidOption", err)
	}
	mustRelease(t, lease)
	if err := lease.SetLabel(ctx, "late"); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("SetLabel after Release: %v, want ErrReleased", err)
	}

	// A lease broken behind its holder's back: SetLabel reports it lost.
	lease = mustAcquire(t, ctx, holder, k, dlock.WithTTL(s.ttl))
	if _, err := dlock.Break(ctx, viewer, k); err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			mustRelease(t, lease)
			return
		}
		t.Fatalf("Break: %v", err)
	}
	if err := lease.SetLabel(ctx, "after-break"); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("SetLabel of a broken lease: %v, want ErrLeaseLost", err)
	}
	if info, err := dlock.Inspect(ctx, viewer, k); err == nil && info.Held {
		t.Fatalf("after a broken lease's SetLabel the lock is held: %+v", info)
	}
}
