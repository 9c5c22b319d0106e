package conformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// BreakHooker is an optional interface on a Harness whose driver can pause
// Break between its read of the holder and its removal, so that the suite
// can hand the key to another holder in that window.
type BreakHooker interface {
	// HookBreak makes every Break of key, by any Locker of the harness, call
	// hook after it has read the holder and before it removes it, until t
	// ends.
	HookBreak(t testing.TB, key string, hook func())
}

// breakRaceFor is how long RacingHandOffs breaks a key that clients keep
// handing to each other.
const breakRaceFor = 3 * time.Second

// testBreakRace: Break is a compare-and-remove. It removes the holder it
// read and reports, or, if the key changed hands between its read and its
// removal, nobody (ErrNotHeld): the next holder, and every other lease of
// the first holder's client, survive it.
func (s *suite) testBreakRace(t *testing.T) {
	t.Run("HandOff", s.testBreakHandOff)
	t.Run("RacingHandOffs", s.testBreakRacingHandOffs)
}

// matches reports whether a holder Break reported (info) describes lease,
// which holds label: the same label, and the same token where the backend
// reported one. A report that cannot tell two leases apart (token 0, the
// same label) matches both.
func matches(info dlock.LockInfo, lease *dlock.Lease, label string) bool {
	return info.Label == label && (info.Token == 0 || info.Token == uint64(lease.Token()))
}

// stillHeld fails t unless lease is held: it renews at the server and
// Inspect (where supported) reports it as the holder.
func (s *suite) stillHeld(t *testing.T, ctx context.Context, viewer dlock.Locker, lease *dlock.Lease, label, what string) {
	t.Helper()
	if err := lease.Refresh(ctx); err != nil {
		t.Errorf("%s: Refresh after the Break: %v, want it still held", what, err)
		return
	}
	info, err := dlock.Inspect(ctx, viewer, lease.Key())
	if errors.Is(err, errors.ErrUnsupported) {
		return
	}
	if err != nil {
		t.Errorf("%s: Inspect: %v", what, err)
		return
	}
	if !info.Held || !matches(info, lease, label) {
		t.Errorf("%s: Inspect after the Break: %+v, want it held by %q with token %d", what, info, label, lease.Token())
	}
}

// testBreakHandOff: between Break's read of the holder and its removal
// (BreakHooker), the holder releases and another lease takes the key: from
// another client, or from the same one (on PostgreSQL, in the same
// session). Break must not remove the new holder, unless what it reported
// cannot tell the two apart; nor the first client's lease of another key.
func (s *suite) testBreakHandOff(t *testing.T) {
	bh, ok := s.h.(BreakHooker)
	if !ok {
		t.Skip("the harness cannot pause Break between its read and its removal (BreakHooker); RacingHandOffs races real hand-offs instead")
	}
	for _, tc := range []struct {
		name string
		same bool // the new holder is the first holder's client, with its label
	}{{"AnotherClient", false}, {"SameClient", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := s.ctx(t)
			first, admin := s.locker(t), s.locker(t)
			second, labelB := s.locker(t), "conformance-second"
			const labelA = "conformance-first"
			if tc.same {
				second, labelB = first, labelA
			}
			k := key(t)
			// A lease of another key, as the first holder's: on PostgreSQL it
			// shares the first lease's session.
			other := mustAcquire(t, ctx, first, k+"/other", dlock.WithLabel(labelA))
			defer other.Release(context.Background())
			a := mustAcquire(t, ctx, first, k, dlock.WithLabel(labelA))
			var b *dlock.Lease
			var hookErr error
			hooked := false
			bh.HookBreak(t, k, func() {
				if hooked {
					return
				}
				hooked = true
				if hookErr = a.Release(ctx); hookErr == nil {
					b, hookErr = second.Acquire(ctx, k, dlock.WithLabel(labelB))
				}
			})
			info, err := dlock.Break(ctx, admin, k)
			if !hooked {
				t.Fatalf("Break returned (%+v, %v) without calling the hook", info, err)
			}
			if hookErr != nil {
				t.Fatalf("hand-off inside Break: %v", hookErr)
			}
			defer b.Release(context.Background())
			t.Logf("Break: (%+v, %v); first token %d, second %d", info, err, a.Token(), b.Token())
			if err == nil && matches(info, b, labelB) && !matches(info, a, labelA) {
				t.Fatalf("Break reported the second holder (%+v), which it had not read", info)
			}
			if err == nil && matches(info, b, labelB) {
				// The report cannot tell the two apart (the same label, no
				// token): removing the second holder removes what it reported.
				t.Logf("Break's report (%+v) cannot tell the first holder from the second; it removed the second", info)
				waitDone(t, b, 5*s.ttl+5*time.Second, "second holder's lease")
				return
			}
			if !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("Break whose holder (token %d) handed the key on (to token %d) between its read and its removal: (%+v, %v), want ErrNotHeld",
					a.Token(), b.Token(), info, err)
			}
			s.stillHeld(t, ctx, admin, b, labelB, "the second holder")
			s.stillHeld(t, ctx, admin, other, labelA, "the first holder's lease of another key")
		})
	}
}

// raceLease is what RacingHandOffs knows of one lease.
type raceLease struct {
	label    string
	token    uint64
	released time.Time // when its holder called Release
	err      error     // Release's
}

// raceBreak is one Break of RacingHandOffs that removed a holder.
type raceBreak struct {
	info     dlock.LockInfo
	returned time.Time
}

// testBreakRacingHandOffs: clients hand a key to each other as fast as
// they can (waiting and trying, the same client again or another), while
// another breaks it again and again. Every lease that ends lost must be
// one a Break reported (by its token, or its label where the report has no
// token); a lease a Break reported must not be released by its holder
// after that Break returned (it was not removed).
func (s *suite) testBreakRacingHandOffs(t *testing.T) {
	ctx := s.ctx(t)
	k := key(t)
	admin := s.locker(t)
	clients := []dlock.Locker{s.locker(t), s.locker(t)}
	hctx, stop := context.WithCancel(ctx)
	defer stop()

	var (
		mu       sync.Mutex
		leases   []raceLease
		acqErrs  int
		firstErr error
		wg       sync.WaitGroup
	)
	for w := range 3 {
		l, label := clients[w%2], fmt.Sprintf("conformance-race-%d", w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; hctx.Err() == nil; i++ {
				var lease *dlock.Lease
				var err error
				if i%2 == 0 {
					lease, err = l.Acquire(hctx, k, dlock.WithLabel(label))
				} else {
					lease, err = l.TryAcquire(hctx, k, dlock.WithLabel(label))
				}
				if err != nil {
					if !errors.Is(err, dlock.ErrNotAcquired) {
						mu.Lock()
						acqErrs++
						firstErr = cmp.Or(firstErr, err)
						mu.Unlock()
					}
					time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond) // pacing
					continue
				}
				time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond) // pacing: a short hold
				r := raceLease{label: label, token: uint64(lease.Token()), released: time.Now()}
				r.err = lease.Release(context.WithoutCancel(hctx))
				mu.Lock()
				leases = append(leases, r)
				mu.Unlock()
			}
		}()
	}

	var breaks []raceBreak
	notHeld, breakErrs := 0, 0
	var firstBreakErr error
	for end := time.Now().Add(breakRaceFor); time.Now().Before(end); {
		info, err := dlock.Break(ctx, admin, k)
		returned := time.Now()
		switch {
		case errors.Is(err, errors.ErrUnsupported):
			stop()
			wg.Wait()
			t.Skipf("the backend cannot break locks: %v", err)
		case errors.Is(err, dlock.ErrNotHeld):
			notHeld++
		case err != nil:
			// Not a safety matter (a backend may give up reading a holder
			// that keeps changing); a holder it removed unreported shows
			// below.
			breakErrs++
			firstBreakErr = cmp.Or(firstBreakErr, err)
		default:
			breaks = append(breaks, raceBreak{info, returned})
		}
		time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond) // pacing
	}
	stop()
	wg.Wait()

	lost, unknown, violations := 0, 0, 0
	violation := func(format string, args ...any) {
		t.Helper()
		if violations++; violations <= 5 {
			t.Errorf(format, args...)
		}
	}
	for _, r := range leases {
		switch {
		case r.err == nil:
			for _, b := range breaks {
				if b.info.Token != 0 && b.info.Token == r.token && r.released.After(b.returned) {
					violation("Break reported it removed the holder %q with token %d, which released the key itself after Break returned", r.label, r.token)
				}
			}
			continue
		case errors.Is(r.err, dlock.ErrLeaseLost):
			lost++
		default:
			unknown++
			t.Logf("lease %q token %d: Release: %v", r.label, r.token, r.err)
			continue
		}
		reported := false
		for _, b := range breaks {
			if b.info.Label == r.label && (b.info.Token == 0 || b.info.Token == r.token) {
				reported = true
				break
			}
		}
		if !reported {
			violation("the lease %q with token %d was lost, but no Break reported it: a Break removed a holder it did not report (Release: %v); the Breaks reported %s",
				r.label, r.token, r.err, reports(breaks))
		}
	}
	if violations > 5 {
		t.Errorf("%d violations in all", violations)
	}
	t.Logf("%d leases (%d lost, %d with an unknown outcome), %d acquire errors (first: %v); %d Breaks removed a holder, %d found none, %d failed (first: %v)",
		len(leases), lost, unknown, acqErrs, firstErr, len(breaks), notHeld, breakErrs, firstBreakErr)
	if len(breaks) == 0 {
		t.Errorf("no Break removed a holder in %v: the race proved nothing", breakRaceFor)
	}
}

// reports lists the holders breaks reported, as token/label.
func reports(breaks []raceBreak) string {
	var b strings.Builder
	for i, br := range breaks {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d/%s", br.info.Token, br.info.Label)
	}
	return b.String()
}
