package mysql_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/mysql"
)

// HookBreak makes Break of key call hook between its read of the holder and
// its removal, until t ends.
func (h *harness) HookBreak(t testing.TB, key string, hook func()) {
	restore := mysql.SetBreakHook(func(k string) {
		if k == key {
			hook()
		}
	})
	t.Cleanup(restore)
}

var _ conformance.BreakHooker = (*harness)(nil)

// TestBreakHandOff: between Break's read of the holder and its removal, the
// holder releases and another lease takes the key, on another session or
// on the same one (the first lease's connection, back in its Locker's
// pool). Break must return ErrNotHeld and leave the new holder alone.
func TestBreakHandOff(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name string
		same bool
	}{{"AnotherSession", false}, {"SameSession", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			first, admin := h.NewLocker(t), h.NewLocker(t)
			second := h.NewLocker(t)
			if tc.same {
				second = first
			}
			k := "break/hand-off/" + tc.name
			a, err := first.Acquire(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			sessionA := h.holder(t, k)
			var b *dlock.Lease
			var sessionB int64
			h.HookBreak(t, k, func() {
				if b != nil {
					return
				}
				if err := a.Release(ctx); err != nil {
					t.Fatalf("release inside Break: %v", err)
				}
				if b, err = second.Acquire(ctx, k); err != nil {
					t.Fatalf("acquire inside Break: %v", err)
				}
				sessionB = h.holder(t, k)
			})
			info, err := dlock.Break(ctx, admin, k)
			if b == nil {
				t.Fatalf("Break returned (%+v, %v) without calling the hook", info, err)
			}
			defer b.Release(context.Background())
			if tc.same != (sessionB == sessionA) {
				t.Fatalf("the second lease's session is %d, the first's %d: the test needs them %s", sessionB, sessionA,
					map[bool]string{true: "equal", false: "different"}[tc.same])
			}
			if !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("Break whose holder (token %d, session %d) handed the key to token %d (session %d) between its read and its removal: (%+v, %v), want ErrNotHeld",
					a.Token(), sessionA, b.Token(), sessionB, info, err)
			}
			if err := b.Refresh(ctx); err != nil {
				t.Fatalf("the second holder after the Break: %v", err)
			}
			if got := h.holder(t, k); got != sessionB {
				t.Fatalf("after the Break the key is held by session %d, want the second holder's %d", got, sessionB)
			}
		})
	}
}

// TestBreakHoldsGrantsBack: once Break has checked that the holder it read
// still holds the key, no grant can complete until it has killed that
// session. Here, in that window, the holder releases and its Locker asks
// for the key again on the same session (the connection back in its pool):
// the grant must not complete on the session Break then kills; the Acquire
// gets the key on another session, and keeps it.
func TestBreakHoldsGrantsBack(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	first, admin := h.NewLocker(t), h.NewLocker(t)
	const k = "break/holds-grants-back"
	a, err := first.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	sessionA := h.holder(t, k)
	type result struct {
		lease *dlock.Lease
		err   error
	}
	got := make(chan result, 1)
	hooked := false
	restore := mysql.SetBreakCheckedHook(func(key string) {
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
			l, err := first.Acquire(ctx, k)
			got <- result{l, err}
		}()
		// Until the new grant holds the lock on A's session and waits to
		// record its token, or has completed.
		for {
			var waiting []int64
			rows, err := h.admin.QueryContext(ctx, "SELECT ID FROM information_schema.PROCESSLIST WHERE STATE = 'Waiting for table metadata lock' AND INFO LIKE 'INSERT INTO%'")
			if err == nil {
				for rows.Next() {
					var id int64
					if err = rows.Scan(&id); err != nil {
						break
					}
					waiting = append(waiting, id)
				}
				rows.Close()
			}
			if err != nil {
				t.Errorf("PROCESSLIST: %v", err)
				return
			}
			if len(waiting) > 0 {
				if len(waiting) != 1 || waiting[0] != sessionA {
					t.Errorf("the new grant waits on sessions %v, the test needs it on the first lease's session %d", waiting, sessionA)
				}
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
		t.Fatalf("the Acquire held back by the Break: %v", r.err)
	}
	defer r.lease.Release(context.Background())
	if err := r.lease.Refresh(ctx); err != nil {
		t.Fatalf("the lease granted while Break held grants back, after the Break: %v", err)
	}
}

// TestBreakAnotherProgramsLock: Break kills a session of another program
// that holds the lock with GET_LOCK (no record of its own: the key's record
// is an earlier dlock grant's), and the key is free when it returns.
func TestBreakAnotherProgramsLock(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	l := h.NewLocker(t)
	const k = "break/another-program"
	lease, err := l.TryAcquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	raw, err := h.admin.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var got int
	if err := raw.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", mysql.LockName(mysql.DefaultNamespace, k)).Scan(&got); err != nil || got != 1 {
		t.Fatalf("GET_LOCK: %d, %v", got, err)
	}
	info, err := dlock.Break(ctx, l, k)
	if err != nil {
		t.Fatalf("Break of a lock another program holds: %v", err)
	}
	if !info.Held || info.Token != 0 {
		t.Errorf("Break reported %+v, want held, no token", info)
	}
	next, err := l.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire right after the Break: %v", err)
	}
	_ = next.Release(ctx)
}
