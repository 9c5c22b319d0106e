package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/goroutines"
)

// DSNer is an optional interface on a Harness: DSN returns a DSN that opens
// the deployment with dlock.Open, or "" if there is none, for the
// DriverClose and ErrorsHideSecrets tests.
type DSNer interface {
	DSN(t testing.TB) string
}

// LiveDeployment is an optional marker on a Harness whose deployment is not
// the test's own (dlock check): the suite skips what would trouble it, such as
// logging in with a wrong password.
type LiveDeployment interface {
	LiveDeployment()
}

// settle is how long the tests below give a driver to finish what it does
// after a call returns (an unsubscribe, a connection going back to its
// pool) before they call a leftover a leftover.
const settle = 5 * time.Second

// residue returns what h still stores for k, waiting up to settle for it
// to go, and says why it cannot look when h is not an Inspector.
func (s *suite) residue(t *testing.T, k string) []string {
	t.Helper()
	in, ok := s.h.(Inspector)
	if !ok {
		return nil
	}
	var left []string
	for end := time.Now().Add(settle); ; {
		if left = in.Residue(t, k); len(left) == 0 || time.Now().After(end) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// noWaiters fails t when the backend still counts a waiter for k settle
// after the last one gave up (WaiterCounter harnesses only).
func (s *suite) noWaiters(t *testing.T, k, after string) {
	t.Helper()
	wc, ok := s.h.(WaiterCounter)
	if !ok {
		return
	}
	for end := time.Now().Add(settle); wc.Waiters(t, k) != 0; {
		if time.Now().After(end) {
			t.Fatalf("%s, the backend still counts %d waiter(s) for the key after %v", after, wc.Waiters(t, k), settle)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitWaiting returns once the backend counts n waiters for k (WaiterCounter
// harnesses), or after a moment for the others.
func (s *suite) waitWaiting(t *testing.T, k string, n int) {
	t.Helper()
	wc, ok := s.h.(WaiterCounter)
	if !ok {
		time.Sleep(200 * time.Millisecond)
		return
	}
	for end := time.Now().Add(s.waitBound()); wc.Waiters(t, k) < n; {
		if time.Now().After(end) {
			t.Fatalf("the backend counts %d waiter(s) for the key after %v, want %d", wc.Waiters(t, k), s.waitBound(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// leavesNothing checks, once every lease of k is released, that the backend
// stores nothing for k and that another locker can take it at once.
func (s *suite) leavesNothing(t *testing.T, ctx context.Context, k, after string) {
	t.Helper()
	if left := s.residue(t, k); len(left) > 0 {
		t.Fatalf("%s and the holder released, the backend still holds %q", after, left)
	}
	lease, err := s.locker(t).TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("%s and the holder released, TryAcquire from another locker: %v", after, err)
	}
	mustRelease(t, lease)
}

// testTryAcquireLeavesNothing: TryAcquire on a held key fails with
// ErrNotAcquired and leaves nothing behind (no queued node, key or
// subscription), so a poller cannot fill the backend.
func (s *suite) testTryAcquireLeavesNothing(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	k := key(t)
	lease := mustAcquire(t, ctx, a, k)
	for range 5 {
		if _, err := b.TryAcquire(ctx, k); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a held key: %v, want ErrNotAcquired", err)
		}
	}
	s.noWaiters(t, k, "5 failed TryAcquire calls returned")
	mustRelease(t, lease)
	s.leavesNothing(t, ctx, k, "5 failed TryAcquire calls returned")
}

// testCancelLeavesNothing: a waiting Acquire whose ctx ends stops waiting
// on the backend (its queued node, key, subscription or blocked session go)
// and is never granted afterwards.
func (s *suite) testCancelLeavesNothing(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	k := key(t)
	lease := mustAcquire(t, ctx, a, k)
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { // owned by the test: it reads errc before returning
		l, err := b.Acquire(wctx, k)
		if err == nil {
			err = fmt.Errorf("granted %v", l.Token())
			_ = l.Release(ctx)
		}
		errc <- err
	}()
	s.waitWaiting(t, k, 1)
	cancel()
	if err := <-errc; !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v, want ErrNotAcquired and context.Canceled", err)
	}
	s.noWaiters(t, k, "the cancelled Acquire returned")
	mustRelease(t, lease)
	s.leavesNothing(t, ctx, k, "a waiter was cancelled")
}

// testGrantRacingCancel cancels acquires of a free key at moments spread
// over one round trip, so that some cancels land while the winning request
// is in flight: an acquire that returns an error must have given the lock
// back (or never taken it) by the time it returns, and one that returns a
// lease holds the lock.
func (s *suite) testGrantRacingCancel(t *testing.T) {
	ctx := s.ctx(t)
	l := s.locker(t)
	k := key(t)
	start := time.Now()
	const warm = 3
	for range warm {
		mustRelease(t, mustAcquire(t, ctx, l, k))
	}
	rtt := time.Since(start) / (2 * warm) // an acquire or a release
	// A release returns once a quorum has it (Redlock); the other nodes get
	// it a moment later. Let it reach them all before the next round, so
	// that what a round finds left is that round's.
	released := func(when string) {
		t.Helper()
		if left := s.residue(t, k); len(left) > 0 {
			t.Fatalf("%s, the backend still holds %q", when, left)
		}
	}
	released("after the warm-up releases")
	// The cancels come at moments from 0 to 1.5 round trips, denser near
	// the start: a backend whose client cannot abandon a request in flight
	// refuses only those that land before the request is written, a small
	// part of the round trip, and a loaded host may miss them all. So the
	// rounds go on, their cancels early, until one has landed (at most
	// maxRounds).
	const rounds, maxRounds = 24, 96
	delay := func(i int) time.Duration {
		f := float64(i%rounds) / rounds
		if i >= rounds {
			f /= 4
		}
		return time.Duration(float64(rtt) * 1.5 * f * f)
	}
	var granted, refused int
	for i := 0; i < rounds || refused == 0 && i < maxRounds; i++ {
		try := i%2 == 0
		cctx, cancel := context.WithCancel(ctx)
		timer := time.AfterFunc(delay(i), cancel)
		var lease *dlock.Lease
		var err error
		if try {
			lease, err = l.TryAcquire(cctx, k)
		} else {
			lease, err = l.Acquire(cctx, k)
		}
		timer.Stop()
		cancel()
		if err == nil {
			granted++
			mustRelease(t, lease)
			released(fmt.Sprintf("round %d: after its lease was released", i))
			continue
		}
		refused++
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d (try=%v): %v, want ErrNotAcquired and context.Canceled", i, try, err)
		}
		// Not granted: nothing may be left that holds or queues for k.
		if in, ok := s.h.(Inspector); ok {
			if left := in.Residue(t, k); len(left) > 0 {
				t.Fatalf("round %d (try=%v): the acquire returned %v, and the backend still holds %q", i, try, err, left)
			}
		}
		other, err := s.locker(t).TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("round %d (try=%v): after a cancelled acquire returned, TryAcquire from another locker: %v", i, try, err)
		}
		mustRelease(t, other)
		released(fmt.Sprintf("round %d: after the other locker released", i))
	}
	t.Logf("round trip %v; %d cancelled acquires returned a lease, %d an error", rtt, granted, refused)
	if refused == 0 {
		if rtt < time.Millisecond {
			t.Skipf("no cancel landed before the grant in %d rounds: the backend answers in %v, faster than a timer fires", granted, rtt)
		}
		t.Errorf("no cancel landed before the grant in %d rounds: the test proved nothing", granted)
	}
}

// testWaitRacingDeadline gives waiting acquires of a held key deadlines at
// moments spread over one round trip, so that some pass while the first
// request is in flight and its reply is lost to the deadline, as on a
// loaded host. Each must return ErrNotAcquired with the deadline, and leave
// nothing that waits for the key: once the holder releases, the backend
// keeps nothing for it (a waiter's mark, a place in a queue), and another
// Locker's TryAcquire takes it at once (a fair queue that still named the
// waiter would have handed it the lock).
func (s *suite) testWaitRacingDeadline(t *testing.T) {
	ctx := s.ctx(t)
	holder, l := s.locker(t), s.locker(t)
	k := key(t)
	start := time.Now()
	const warm = 3
	for range warm {
		mustRelease(t, mustAcquire(t, ctx, l, k))
	}
	rtt := time.Since(start) / (2 * warm)
	const rounds = 24
	for i := range rounds {
		held := mustAcquire(t, ctx, holder, k)
		dctx, cancel := context.WithTimeout(ctx, rtt*time.Duration(i)/rounds*3/2)
		lease, err := l.Acquire(dctx, k, dlock.WithTTL(time.Minute))
		cancel()
		if err == nil {
			t.Fatalf("round %d: a waiting Acquire was granted a held key (token %d; the holder's is %d)", i, lease.Token(), held.Token())
		}
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("round %d: %v, want ErrNotAcquired and context.DeadlineExceeded", i, err)
		}
		mustRelease(t, held)
		if left := s.residue(t, k); len(left) > 0 {
			t.Fatalf("round %d: the waiter's Acquire returned %v and the holder released, and the backend still holds %q", i, err, left)
		}
		other, err := s.locker(t).TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("round %d: after the waiter's deadline and the holder's release, TryAcquire from another locker: %v", i, err)
		}
		mustRelease(t, other)
	}
	t.Logf("round trip %v; %d waiting acquires ended by their deadlines", rtt, rounds)
}

// testCloseStopsGoroutines: a Locker's goroutines (pub/sub, watchers,
// sessions, renewals) end with Close, also when a call was waiting.
func (s *suite) testCloseStopsGoroutines(t *testing.T) {
	ctx := s.ctx(t)
	a := s.locker(t)
	k := key(t)
	lease := mustAcquire(t, ctx, a, k)
	before := goroutines.Steady()

	b := s.h.NewLocker(t)
	other := mustAcquire(t, ctx, b, k+"/b") // a held lease: renewals, loss watch
	errc := make(chan error, 1)
	go func() { // owned by the test: it reads errc before returning
		_, err := b.Acquire(ctx, k)
		errc <- err
	}()
	s.waitWaiting(t, k, 1)
	during := runtime.NumGoroutine()
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-errc; !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("an Acquire waiting across Close: %v, want ErrClosed", err)
	}
	if !errors.Is(other.Err(), dlock.ErrReleased) {
		t.Errorf("a lease of the closed Locker: Err() = %v, want ErrReleased", other.Err())
	}
	var after int
	for end := time.Now().Add(settle); ; time.Sleep(20 * time.Millisecond) {
		if after = runtime.NumGoroutine(); after <= before || time.Now().After(end) {
			break
		}
	}
	t.Logf("goroutines: %d before the Locker, %d while it held a lease and waited, %d after Close", before, during, after)
	if after > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines %v after Close, %d before the Locker was made:\n%s", after, settle, before, buf[:runtime.Stack(buf, true)])
	}
	mustRelease(t, lease)
	s.leavesNothing(t, ctx, k, "a waiter's Locker was closed")
}

// driverOf opens a bare backend.Driver on the harness's DSN.
func (s *suite) driverOf(t *testing.T) backend.Driver {
	t.Helper()
	dn, ok := s.h.(DSNer)
	if !ok || dn.DSN(t) == "" {
		t.Skip("the harness has no DSN (DSNer)")
	}
	u, err := backend.ParseDSN(dn.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	open, ok := backend.Lookup(u.Scheme)
	if !ok {
		t.Fatalf("no driver registered for %q", u.Scheme)
	}
	q := u.Query()
	for _, p := range []string{"ttl", "autorenew"} { // dlock.Open's, not the driver's
		q.Del(p)
	}
	u.RawQuery = q.Encode()
	d, err := open(s.ctx(t), u)
	if err != nil {
		t.Fatalf("open %s: %v", backend.Redact(u), err)
	}
	return d
}

// testDriverClose holds every driver to one rule: Close releases the
// driver's resources once, and a second Close, like any call after the
// first, returns an error wrapping backend.ErrClosed (dlock.ErrClosed).
func (s *suite) testDriverClose(t *testing.T) {
	d := s.driverOf(t)
	ctx := s.ctx(t)
	k := key(t)
	g, err := d.Acquire(ctx, backend.AcquireRequest{Key: k, Owner: backend.NewOwnerID(), TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := d.Close(); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("second Close: %v, want an error wrapping backend.ErrClosed", err)
	}
	_, err = d.Acquire(ctx, backend.AcquireRequest{Key: k, Owner: backend.NewOwnerID(), TTL: 30 * time.Second})
	if !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want an error wrapping backend.ErrClosed", err)
	}
}

// testErrorsHideSecrets puts a password in the harness's DSN and checks
// that no error shows it, raw or escaped: a wrong password the server
// refuses (or ignores), an unknown parameter, a malformed value.
func (s *suite) testErrorsHideSecrets(t *testing.T) {
	dn, ok := s.h.(DSNer)
	if !ok || dn.DSN(t) == "" {
		t.Skip("the harness has no DSN (DSNer)")
	}
	if _, live := s.h.(LiveDeployment); live {
		t.Skip("would log in to a live deployment with a wrong password")
	}
	const secret = "s3cr/et@x"
	escaped := url.QueryEscape(secret)
	with := func(extra string) string {
		u, err := url.Parse(dn.DSN(t))
		if err != nil {
			t.Fatal(err)
		}
		user := "dlock"
		if u.User != nil && u.User.Username() != "" {
			user = u.User.Username()
		}
		u.User = url.UserPassword(user, secret)
		if extra != "" {
			if u.RawQuery != "" {
				u.RawQuery += "&"
			}
			u.RawQuery += extra
		}
		return u.String()
	}
	shows := func(err error) bool {
		msg := fmt.Sprintf("%v %+v %#v", err, err, err)
		return slices.ContainsFunc([]string{secret, escaped, url.PathEscape(secret), "s3cr%2Fet"}, func(p string) bool {
			return strings.Contains(msg, p)
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, extra string
		invalid     bool
	}{
		{"unknown parameter", "bogus=1", true},
		{"malformed value", "ttl=soon", true},
		{"wrong password", "", false},
	} {
		dsn := with(tc.extra)
		if red := backend.Redact(mustParse(t, dsn)); strings.Contains(red, secret) || strings.Contains(red, escaped) || strings.Contains(red, "s3cr%2Fet") {
			t.Errorf("%s: backend.Redact shows the password: %s", tc.name, red)
		}
		l, err := dlock.Open(ctx, dsn)
		if tc.invalid {
			if !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("%s: Open: %v, want ErrInvalidOption", tc.name, err)
			} else if n := strings.Count(err.Error(), dlock.ErrInvalidOption.Error()); n != 1 {
				t.Errorf("%s: Open: %v: says %q %d times (wrapped more than once)", tc.name, err, dlock.ErrInvalidOption.Error(), n)
			}
		} else if err == nil {
			// The server may refuse the password at the first request, or
			// not check passwords at all: either way no error shows it.
			var lease *dlock.Lease
			lease, err = l.TryAcquire(ctx, key(t))
			if err == nil {
				err = lease.Release(ctx)
			}
			if cerr := l.Close(); err == nil {
				err = cerr
			}
		}
		t.Logf("%s: %v", tc.name, err)
		if err != nil && shows(err) {
			t.Errorf("%s: the error shows the password: %v", tc.name, err)
		}
	}
}

func mustParse(t *testing.T, dsn string) *url.URL {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
