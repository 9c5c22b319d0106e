package dlock_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// scripted wraps a memlock driver so a test can make refreshes fail or hang and
// shift a grant's Start, to pin down the portable type's keepalive rules.
type scripted struct {
	backend.Driver
	mu           sync.Mutex
	refreshErr   error
	refreshBlock chan struct{} // if non-nil, Refresh waits for it or ctx
	refreshBegan chan struct{} // if non-nil, a Refresh about to wait on refreshBlock sends on it
	refreshEnded chan error    // if non-nil, a Refresh that waited on refreshBlock sends its ctx's error
	refreshes    int
	noLost       bool            // strip Grant.Lost, as a TTL backend would
	answerDelay  time.Duration   // time between Start and the answer
	lateAnswers  []time.Duration // delays of the next answers, before answerDelay applies
	acquires     int
	releases     int
	releaseLeft  time.Duration // time left before the last Release ctx's deadline (-1: none)
}

func newScripted() *scripted { return &scripted{Driver: memlock.NewStore().NewDriver()} }

func (d *scripted) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	g, err := d.Driver.Acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	if d.noLost {
		g.Lost = nil
	}
	d.mu.Lock()
	d.acquires++
	delay := d.answerDelay
	if len(d.lateAnswers) > 0 {
		delay, d.lateAnswers = d.lateAnswers[0], d.lateAnswers[1:]
	}
	d.mu.Unlock()
	time.Sleep(delay) // a slow reply: the grant's Start stays when it was asked
	return g, nil
}

func (d *scripted) Refresh(ctx context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	d.mu.Lock()
	d.refreshes++
	err, block, began, ended := d.refreshErr, d.refreshBlock, d.refreshBegan, d.refreshEnded
	d.mu.Unlock()
	if block != nil {
		if began != nil {
			began <- struct{}{}
		}
		select {
		case <-block:
		case <-ctx.Done():
			if ended != nil {
				ended <- ctx.Err()
			}
			return 0, ctx.Err()
		}
	}
	if err != nil {
		return 0, err
	}
	return d.Driver.Refresh(ctx, g, ttl)
}

func (d *scripted) Release(ctx context.Context, g *backend.Grant) error {
	d.mu.Lock()
	d.releases++
	d.releaseLeft = -1
	if dl, ok := ctx.Deadline(); ok {
		d.releaseLeft = time.Until(dl)
	}
	d.mu.Unlock()
	return d.Driver.Release(ctx, g)
}

func newLocker(t *testing.T, d backend.Driver, opts ...dlock.Option) dlock.Locker {
	t.Helper()
	l, err := dlock.New(d, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestRefreshFailureEndsLease(t *testing.T) {
	d := newScripted()
	d.noLost = true
	l := newLocker(t, d)
	lease, err := l.Acquire(context.Background(), "k", dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("connection reset")
	d.mu.Lock()
	d.refreshErr = boom
	d.mu.Unlock()
	select {
	case <-lease.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("Done not closed after a failed renewal")
	}
	if err := lease.Err(); !errors.Is(err, dlock.ErrLeaseLost) || !errors.Is(err, boom) {
		t.Fatalf("Err() = %v, want ErrLeaseLost wrapping the renewal's cause", err)
	}
	// The first failure ended it, before the deadline.
	if time.Now().After(lease.Deadline()) {
		t.Errorf("lease ended only after its deadline; the failed renewal should have ended it")
	}
}

func TestHungRefreshEndsLeaseAtDeadline(t *testing.T) {
	d := newScripted()
	d.noLost = true
	d.refreshBlock = make(chan struct{}) // never closed: the backend hangs
	l := newLocker(t, d)
	ttl := 300 * time.Millisecond
	lease, err := l.Acquire(context.Background(), "k", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	deadline := lease.Deadline()
	closed := make(chan time.Time, 1)
	go func() { // owned by the test: ends when Done closes
		<-lease.Done()
		closed <- time.Now()
	}()
	// Once the deadline has passed, Err says the lease is lost at once,
	// however late the timer that closes Done runs on a loaded machine.
	time.Sleep(time.Until(deadline)) // to reach a time, not to wait for an event
	if err := lease.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Err() at the deadline, the renewal hung = %v, want ErrLeaseLost", err)
	}
	// Done closes though the renewal never returns (refreshBlock is never
	// closed): it follows the deadline, not the renewal, and not before it.
	// The bound is only there to fail instead of hanging (CI once saw Done
	// close 156ms late on a loaded machine).
	select {
	case ended := <-closed:
		if ended.Before(deadline) {
			t.Fatalf("lease ended %v before its deadline", deadline.Sub(ended))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed 5s after the deadline while the renewal hung")
	}
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err() = %v", lease.Err())
	}
}

// Release of a lease whose auto-renewal hangs ends the renewal at once: its
// ctx is cancelled, not left to run to the lease's deadline.
func TestReleaseCancelsRenewalInFlight(t *testing.T) {
	d := newScripted()
	d.noLost = true
	d.refreshBlock = make(chan struct{}) // never closed: the backend hangs
	d.refreshBegan = make(chan struct{}, 1)
	d.refreshEnded = make(chan error, 1)
	l := newLocker(t, d)
	// The first renewal starts 300ms in; it could run until the deadline, 900ms.
	lease, err := l.Acquire(context.Background(), "k", dlock.WithTTL(900*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-d.refreshBegan
	deadline := lease.Deadline()
	released := time.Now()
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.refreshEnded:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the hung renewal ended with %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the renewal in flight still runs %v after Release", time.Since(released))
	}
	// context.Canceled above says Release ended it; a renewal left to run
	// would have ended at the deadline, with context.DeadlineExceeded.
	if took := time.Since(released); time.Now().After(deadline) {
		t.Errorf("the renewal in flight ended %v after Release, past the lease's deadline; want at once", took)
	}
}

// The deadline counts from when the request was sent, not answered.
func TestDeadlineCountsFromStart(t *testing.T) {
	d := newScripted()
	d.answerDelay = 200 * time.Millisecond
	l := newLocker(t, d)
	before := time.Now()
	ttl := 5 * time.Second
	lease, err := l.Acquire(context.Background(), "k", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	// The answer came 200ms after the grant; a deadline counted from the answer
	// would be that much later.
	if got, latest := lease.Deadline(), before.Add(ttl+d.answerDelay/2); got.After(latest) {
		t.Fatalf("Deadline %v after request time + TTL: it counted from the answer", got.Sub(before.Add(ttl)))
	}
	lease.Release(context.Background())
}

// A grant that reaches the Locker after its deadline (its reply was slower
// than its validity) is given back: a TryAcquire fails, a waiting Acquire
// asks again, and no lease is handed out already expired.
func TestGrantPastItsDeadlineIsGivenBack(t *testing.T) {
	ctx := context.Background()
	ttl := 200 * time.Millisecond
	d := newScripted()
	d.lateAnswers = []time.Duration{2 * ttl}
	l := newLocker(t, d)
	lease, err := l.TryAcquire(ctx, "k", dlock.WithTTL(ttl))
	if err == nil {
		lease.Release(ctx)
		t.Fatalf("TryAcquire handed out a lease whose grant came %v after it was asked, TTL %v (Deadline %v ago)", 2*ttl, ttl, time.Since(lease.Deadline()))
	}
	if errors.Is(err, dlock.ErrNotAcquired) || !strings.Contains(err.Error(), "after its deadline") || !strings.Contains(err.Error(), `"k"`) {
		t.Errorf("TryAcquire of a late grant: %v; want an error saying the grant came after its deadline, naming the key, not ErrNotAcquired", err)
	}
	d.mu.Lock()
	released := d.releases
	d.mu.Unlock()
	if released != 1 {
		t.Errorf("the late grant was released %d times, want 1", released)
	}
	// Given back: the key is free at once, not after the TTL.
	lease, err = l.TryAcquire(ctx, "k", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("TryAcquire after the late grant was given back: %v", err)
	}
	lease.Release(ctx)

	d.mu.Lock()
	d.lateAnswers, d.acquires = []time.Duration{2 * ttl}, 0
	d.mu.Unlock()
	lease, err = l.Acquire(ctx, "k", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatalf("waiting Acquire whose first grant came late: %v", err)
	}
	defer lease.Release(ctx)
	if left := time.Until(lease.Deadline()); left <= 0 {
		t.Errorf("waiting Acquire handed out a lease %v past its deadline", -left)
	}
	d.mu.Lock()
	asked := d.acquires
	d.mu.Unlock()
	if asked != 2 {
		t.Errorf("waiting Acquire asked the driver %d times, want 2 (the late grant, then one in time)", asked)
	}
}

func TestAutoRenewOffEndsAtDeadline(t *testing.T) {
	d := newScripted()
	d.noLost = true
	l := newLocker(t, d, dlock.WithAutoRenew(false))
	lease, err := l.Acquire(context.Background(), "k", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-lease.Done()
	if time.Now().Before(lease.Deadline()) {
		t.Fatal("lease ended before its deadline")
	}
	d.mu.Lock()
	n := d.refreshes
	d.mu.Unlock()
	if n != 0 {
		t.Fatalf("auto-renew off, yet %d refreshes ran", n)
	}
}

// One scheduler per Locker: holding many leases does not add a goroutine each.
func TestKeepaliveIsOneScheduler(t *testing.T) {
	d := newScripted()
	d.noLost = true
	l := newLocker(t, d)
	before := runtime.NumGoroutine()
	var leases []*dlock.Lease
	for i := range 300 {
		lease, err := l.TryAcquire(context.Background(), "k"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+time.Duration(i).String(), dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	if after := runtime.NumGoroutine(); after-before > 10 {
		t.Fatalf("goroutines grew by %d for 300 leases", after-before)
	}
	for _, lease := range leases {
		lease.Release(context.Background())
	}
}

// A Release whose ctx is already done still frees the lock, on a detached,
// bounded context.
func TestReleaseWithDoneContext(t *testing.T) {
	d := newScripted()
	l := newLocker(t, d)
	lease, err := l.Acquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release with a cancelled ctx: %v", err)
	}
	l2, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatalf("lock not freed: %v", err)
	}
	l2.Release(context.Background())
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		dsn     string
		is      error
		contain []string
	}{
		{"nosuch://user:s3cret@host/x", dlock.ErrUnknownScheme, []string{`"nosuch"`, "mem", "forgotten import"}},
		{"mem://?ttl=0s", dlock.ErrInvalidOption, []string{"ttl"}},
		{"mem://?ttl=banana", dlock.ErrInvalidOption, []string{"ttl"}},
		{"mem://?autorenew=maybe", dlock.ErrInvalidOption, []string{"autorenew"}},
		{"mem://?colour=blue", dlock.ErrInvalidOption, []string{`unknown DSN parameter "colour"`}},
		{"mem://?ttl=2s;autorenew=false", dlock.ErrInvalidOption, []string{"semicolon"}},
		{"", dlock.ErrInvalidOption, []string{"empty DSN"}},
		{"redis://user:s3cret@host:notaport/0", dlock.ErrInvalidOption, []string{"malformed DSN"}},
		{"://user:s3cret@host", dlock.ErrInvalidOption, []string{"malformed DSN"}},
		{"mem://x/some/path", nil, []string{"path"}},
	}
	for _, c := range cases {
		l, err := dlock.Open(ctx, c.dsn)
		if err == nil {
			l.Close()
			t.Errorf("Open(%q) succeeded", c.dsn)
			continue
		}
		var de *dlock.Error
		if !errors.As(err, &de) || de.Op != "open" {
			t.Errorf("Open(%q): %v is not a *dlock.Error with Op open", c.dsn, err)
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("Open(%q): %v, want %v", c.dsn, err, c.is)
		}
		for _, s := range c.contain {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("Open(%q): %q does not mention %q", c.dsn, err, s)
			}
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%q): error leaks the password: %v", c.dsn, err)
		}
	}
}

func TestOpenDSNParameters(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://dsn-params?ttl=750ms&autorenew=false")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	lease, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d := lease.Deadline().Sub(start); d <= 0 || d > 760*time.Millisecond {
		t.Fatalf("deadline %v after acquire, want ≤ the DSN's ttl of 750ms", d)
	}
	<-lease.Done() // autorenew=false: it ends by itself
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Fatal(lease.Err())
	}
	// Options given in code take precedence over the DSN.
	l2, err := dlock.Open(ctx, "mem://dsn-params?ttl=750ms", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	lease2, err := l2.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(lease2.Deadline()); d < 30*time.Second {
		t.Fatalf("deadline in %v; WithTTL(1m) should have overridden ttl=750ms", d)
	}
	lease2.Release(ctx)
}

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := dlock.New(nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("New(nil): %v", err)
	}
	d := &closeCounter{Driver: memlock.NewStore().NewDriver()}
	if _, err := dlock.New(d, dlock.WithTTL(-1)); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("New with TTL -1: %v", err)
	}
	if d.closes != 1 {
		t.Errorf("New failed but closed the driver it owns %d times, want 1", d.closes)
	}
	if _, err := dlock.New(memlock.NewStore().NewDriver(), dlock.WithReleaseTimeout(0)); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("New with release timeout 0: %v", err)
	}
}

type closeCounter struct {
	backend.Driver
	closes int
}

func (c *closeCounter) Close() error { c.closes++; return c.Driver.Close() }

func TestErrorMessage(t *testing.T) {
	l := newLocker(t, memlock.NewStore().NewDriver())
	ctx := context.Background()
	lease, err := l.Acquire(ctx, "jobs/nightly")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	_, err = l.TryAcquire(ctx, "jobs/nightly")
	want := `dlock: try-acquire "jobs/nightly" (mem): lock not acquired: lock held by another owner`
	if err == nil || err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("%v does not match ErrNotAcquired and backend.ErrHeld", err)
	}
}

// A Do whose fn fails returns fn's error and still releases the lock.
func TestDoReturnsFnError(t *testing.T) {
	l := newLocker(t, memlock.NewStore().NewDriver())
	ctx := context.Background()
	boom := errors.New("boom")
	if err := dlock.Do(ctx, l, "k", func(context.Context, *dlock.Lease) error { return boom }); err != boom {
		t.Fatalf("Do: %v, want fn's error", err)
	}
	lease, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("lock not released after a failed fn: %v", err)
	}
	lease.Release(ctx)
	// fn may release the lease itself.
	err = dlock.Do(ctx, l, "k", func(ctx context.Context, lease *dlock.Lease) error { return lease.Release(ctx) })
	if err != nil {
		t.Fatalf("Do whose fn released the lease: %v", err)
	}
}

// TestReleaseBoundedWithoutDeadline: Release with a ctx that has no deadline
// gives the driver one bounded by WithReleaseTimeout (up to 9/8 of it, shared);
// a ctx with a deadline is passed on as it is.
func TestReleaseBoundedWithoutDeadline(t *testing.T) {
	d := newScripted()
	l := newLocker(t, d, dlock.WithReleaseTimeout(3*time.Second))
	lease, err := l.Acquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	left := d.releaseLeft
	d.mu.Unlock()
	// Releases that cannot be cancelled share a deadline: each gets at least
	// the release timeout and at most 9/8 of it (WithReleaseTimeout).
	if left < 2*time.Second || left > 3*time.Second*9/8 {
		t.Fatalf("driver's Release ctx for a Release(Background): %v left, want a deadline between the 3s release timeout and 9/8 of it", left)
	}
	lease, err = l.Acquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	left = d.releaseLeft
	d.mu.Unlock()
	if left <= 3*time.Second {
		t.Fatalf("driver's Release ctx for a Release(ctx with 1m): %v left, want the caller's deadline", left)
	}
}
