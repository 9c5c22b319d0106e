package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/postgres"
)

// HookBreak makes Break of key call hook between its read of the holder and
// its removal, until t ends.
func (h *harness) HookBreak(t testing.TB, key string, hook func()) {
	restore := postgres.SetBreakHook(func(k string) {
		if k == key {
			hook()
		}
	})
	t.Cleanup(restore)
}

var _ conformance.BreakHooker = (*harness)(nil)

// TestBreakHandOff: the holder's session (the Locker's shared session) also
// holds a lease of another key. Between Break's read of the holder and its
// removal, the holder releases and another lease takes the key: on another
// Locker's session, or on the same session (told apart by the token, or,
// with tokens=sequence, by the statements the session ran). Break must
// return ErrNotHeld and end no session: the new holder and the other key's
// lease survive it.
func TestBreakHandOff(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name   string
		params string
		same   bool
	}{
		{"AnotherSession", "", false},
		{"SameSession", "", true},
		{"AnotherSession/tokens=sequence", "&tokens=sequence", false},
		{"SameSession/tokens=sequence", "&tokens=sequence", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			first, admin := openLocker(t, h.srv.URL()+tc.params), openLocker(t, h.srv.URL()+tc.params)
			second := openLocker(t, h.srv.URL()+tc.params)
			if tc.same {
				second = first
			}
			k := "break/hand-off/" + tc.name
			// Same TTL and label, taken without a wait: one shared session.
			other, err := first.TryAcquire(ctx, k+"/other")
			if err != nil {
				t.Fatal(err)
			}
			defer other.Release(context.Background())
			a, err := first.TryAcquire(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			pidA := holderPID(t, h.srv, postgres.Options{}.AdvisoryKey(k))
			if pidOther := holderPID(t, h.srv, postgres.Options{}.AdvisoryKey(k+"/other")); pidOther != pidA {
				t.Fatalf("the two leases are in sessions %d and %d, want one", pidA, pidOther)
			}
			var b *dlock.Lease
			var pidB int
			h.HookBreak(t, k, func() {
				if b != nil {
					return
				}
				if err := a.Release(ctx); err != nil {
					t.Fatalf("release inside Break: %v", err)
				}
				if b, err = second.TryAcquire(ctx, k); err != nil {
					t.Fatalf("acquire inside Break: %v", err)
				}
				pidB = holderPID(t, h.srv, postgres.Options{}.AdvisoryKey(k))
			})
			info, err := dlock.Break(ctx, admin, k)
			if b == nil {
				t.Fatalf("Break returned (%+v, %v) without calling the hook", info, err)
			}
			defer b.Release(context.Background())
			if tc.same != (pidB == pidA) {
				t.Fatalf("the second lease's session is %d, the first's %d: the test needs them %s", pidB, pidA,
					map[bool]string{true: "equal", false: "different"}[tc.same])
			}
			if !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("Break whose holder (token %d, pid %d) handed the key to token %d (pid %d) between its read and its removal: (%+v, %v), want ErrNotHeld",
					a.Token(), pidA, b.Token(), pidB, info, err)
			}
			for _, l := range []struct {
				what  string
				lease *dlock.Lease
			}{{"the second holder", b}, {"the first holder's lease of another key", other}} {
				if err := l.lease.Refresh(ctx); err != nil {
					t.Errorf("%s after the Break: %v", l.what, err)
				}
			}
		})
	}
}

// TestBreakEndsTheSessionsOtherLeases: advisory locks can be released only
// by their session, so Break ends the holder's session, and with it the
// other leases that session holds (the same Locker's, TTL and label, granted
// without a wait), as docs/postgres.md says: they end lost, and their keys
// are free. A lease with a label of its own has a session of its own, and
// survives.
func TestBreakEndsTheSessionsOtherLeases(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	holder, admin := openLocker(t, h.srv.URL()), openLocker(t, h.srv.URL())
	const k = "break/session"
	a, err := holder.TryAcquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	sameSession, err := holder.TryAcquire(ctx, k+"/same-session")
	if err != nil {
		t.Fatal(err)
	}
	ownSession, err := holder.TryAcquire(ctx, k+"/own-session", dlock.WithLabel("a label of its own"))
	if err != nil {
		t.Fatal(err)
	}
	defer ownSession.Release(context.Background())
	info, err := dlock.Break(ctx, admin, k)
	if err != nil {
		t.Fatalf("Break: %v", err)
	}
	if !info.Held || info.Token != uint64(a.Token()) {
		t.Errorf("Break reported %+v, want the holder with token %d", info, a.Token())
	}
	for _, l := range []*dlock.Lease{a, sameSession} {
		select {
		case <-l.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("the lease of %q, in the broken session, did not end", l.Key())
		}
		if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
			t.Errorf("the lease of %q, in the broken session: Err() = %v, want ErrLeaseLost", l.Key(), l.Err())
		}
		next, err := admin.TryAcquire(ctx, l.Key())
		if err != nil {
			t.Fatalf("TryAcquire(%q) after the Break: %v", l.Key(), err)
		}
		_ = next.Release(ctx)
	}
	if err := ownSession.Refresh(ctx); err != nil {
		t.Errorf("the lease with a session of its own after the Break: %v", err)
	}
}

// TestBreakHoldsGrantsBack: once Break has checked the key's token (its row
// locked), no grant of the key can commit until Break has ended the
// holder's session. Here, in that window, the holder releases and its
// Locker takes the key again in the same shared session: that grant must
// not commit in the session Break then ends; if the TryAcquire returns a
// lease, it keeps it.
func TestBreakHoldsGrantsBack(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	first, admin := openLocker(t, h.srv.URL()), openLocker(t, h.srv.URL())
	const k = "break/holds-grants-back"
	a, err := first.TryAcquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	pidA := holderPID(t, h.srv, postgres.Options{}.AdvisoryKey(k))
	raw := connect(t, ctx, h.srv)
	defer raw.Close(ctx)
	type result struct {
		lease *dlock.Lease
		err   error
	}
	got := make(chan result, 1)
	hooked := false
	restore := postgres.SetBreakCheckedHook(func(key string) {
		if key != k || hooked {
			return
		}
		hooked = true
		if err := a.Release(ctx); err != nil {
			t.Errorf("release inside Break: %v", err)
			got <- result{err: err}
			return
		}
		go func() {
			l, err := first.TryAcquire(ctx, k)
			got <- result{l, err}
		}()
		// Until the new grant waits, in A's session, for the key's row, or
		// has completed.
		for {
			var waiting bool
			err := raw.QueryRow(ctx, "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1", pidA).Scan(&waiting)
			if err != nil {
				t.Errorf("pg_stat_activity: %v", err)
				return
			}
			if waiting {
				return
			}
			select {
			case r := <-got:
				got <- r
				t.Logf("the grant completed inside Break's check")
				return
			case <-time.After(time.Millisecond): // poll
			}
		}
	})
	t.Cleanup(restore)
	info, err := dlock.Break(ctx, admin, k)
	restore()
	t.Logf("Break: (%+v, %v)", info, err)
	if !hooked {
		t.Fatalf("Break returned (%+v, %v) without calling the hook between its check and its removal", info, err)
	}
	if err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Break: %v", err)
	}
	r := <-got
	if r.err != nil {
		t.Logf("the TryAcquire held back by the Break: %v", r.err)
		return
	}
	defer r.lease.Release(context.Background())
	if err := r.lease.Refresh(ctx); err != nil {
		t.Fatalf("the lease granted while Break held grants back, after the Break: %v", err)
	}
}
