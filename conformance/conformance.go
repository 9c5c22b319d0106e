package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/fencing"
)

// Crasher is an optional interface on a Harness whose holders keep their
// locks without renewing (a ZooKeeper session): Crash drops l's connections
// and sessions without a release, as a vanished process would. Without it,
// the suite turns auto-renew off instead.
type Crasher interface {
	Crash(t testing.TB, l dlock.Locker)
}

// Run runs the whole suite against h. Each test is a subtest with a stable name
// (TestX/Conformance/MutualExclusion, …), so `go test -run` can pick one.
func Run(t *testing.T, h Harness) {
	t.Helper()
	s := &suite{h: h, ttl: DefaultShortTTL}
	if st, ok := h.(ShortTTLer); ok {
		s.ttl = st.ShortTTL()
	}
	probe := s.locker(t)
	s.caps = probe.Capabilities()
	t.Logf("capabilities: fencing=%v fifo=%v fault-tolerant=%v time=%v push-wait=%v loss-notify=%v shared=%v counted=%v",
		s.caps.Fencing, s.caps.FIFO, s.caps.FaultTolerant, s.caps.TimeAuthority, s.caps.PushWait, s.caps.LossNotify, s.caps.Shared, s.caps.NativeSemaphore)

	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"MutualExclusion", s.testMutualExclusion},
		{"TokensIncrease", s.testTokensIncrease},
		{"TryAcquireHeld", s.testTryAcquireHeld},
		{"AcquireWakesAfterRelease", s.testWakesAfterRelease},
		{"FIFO", s.testFIFO},
		{"CancelMidWait", s.testCancelMidWait},
		{"CancelLeavesNothing", s.testCancelLeavesNothing},
		{"TryAcquireLeavesNothing", s.testTryAcquireLeavesNothing},
		{"GrantRacingCancel", s.testGrantRacingCancel},
		{"WaitRacingDeadline", s.testWaitRacingDeadline},
		{"CancelledBeforeCall", s.testCancelledBeforeCall},
		{"StaleLeaseCannotTouchNewHolder", s.testStaleLease},
		{"HolderVanishes", s.testHolderVanishes},
		{"AutoRenew", s.testAutoRenew},
		{"ExpireEndsLease", s.testExpireEndsLease},
		{"ManualRefresh", s.testManualRefresh},
		{"DoubleRelease", s.testDoubleRelease},
		{"CloseReleases", s.testCloseReleases},
		{"CloseStopsGoroutines", s.testCloseStopsGoroutines},
		{"DriverClose", s.testDriverClose},
		{"ErrorsHideSecrets", s.testErrorsHideSecrets},
		{"Keys", s.testKeys},
		{"InvalidInput", s.testInvalidInput},
		{"DoCancelsOnLoss", s.testDoCancelsOnLoss},
		{"PausedHolderFenced", s.testPausedHolder},
		{"Reentrant", s.testReentrant},
		{"ReentrantLoss", s.testReentrantLoss},
		{"AcquireAllOverlapping", s.testAcquireAllOverlapping},
		{"AcquireAllNothingLeft", s.testAcquireAllNothingLeft},
		{"Inspect", s.testInspect},
		{"Break", s.testBreak},
		{"Relabel", s.testRelabel},
		{"Election", s.testElection},
		{"ElectionHandover", s.testElectionHandover},
		{"ElectionLossCancelsRun", s.testElectionLossCancelsRun},
		{"ElectionObservePush", s.testElectionObservePush},
		{"Semaphore", s.testSemaphore},
		{"SemaphoreWakes", s.testSemaphoreWakes},
		{"SemaphoreHolderVanishes", s.testSemaphoreHolderVanishes},
		{"SemaphoreCancel", s.testSemaphoreCancel},
		{"SemaphoreSize", s.testSemaphoreSize},
		{"SemaphoreFenced", s.testSemaphoreFenced},
		{"SemaphoreMany", s.testSemaphoreMany},
		{"NativeSemaphore", s.testNativeSemaphore},
		{"RWExclusion", s.testRWExclusion},
		{"RWWriterNotStarved", s.testRWWriterNotStarved},
		{"RWWriterFirst", s.testRWWriterFirst},
		{"RWHolderVanishes", s.testRWHolderVanishes},
		{"RWWriteLoss", s.testRWWriteLoss},
		{"RWNested", s.testRWNested},
		{"RWCancel", s.testRWCancel},
		{"Shared", s.testShared},
		{"SharedHolderVanishes", s.testSharedHolderVanishes},
		{"SharedCancel", s.testSharedCancel},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct {
	h    Harness
	caps backend.Capabilities
	ttl  time.Duration // the short TTL, for tests that wait for expiry
}

// waitBound caps every wait in the suite, so a broken driver fails a test
// instead of hanging it.
func (s *suite) waitBound() time.Duration { return 20*s.ttl + 10*time.Second }

func (s *suite) locker(t *testing.T) dlock.Locker {
	t.Helper()
	l := s.h.NewLocker(t)
	t.Cleanup(func() {
		if err := l.Close(); err != nil && !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.waitBound())
	t.Cleanup(cancel)
	return ctx
}

// key returns a key unique to this test run, so runs against a shared server
// never see each other's locks.
func key(t *testing.T, parts ...string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.ReplaceAll(t.Name(), "/", ".")
	return "conformance/" + name + "/" + hex.EncodeToString(b[:]) + strings.Join(parts, "")
}

func mustAcquire(t *testing.T, ctx context.Context, l dlock.Locker, k string, opts ...dlock.AcquireOption) *dlock.Lease {
	t.Helper()
	lease, err := l.Acquire(ctx, k, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", k, err)
	}
	if lease.Key() != k {
		t.Fatalf("lease.Key() = %q, want %q", lease.Key(), k)
	}
	return lease
}

func mustRelease(t *testing.T, lease *dlock.Lease) {
	t.Helper()
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release(%q): %v", lease.Key(), err)
	}
}

func expectNotAcquired(t *testing.T, ctx context.Context, l dlock.Locker, k string) {
	t.Helper()
	lease, err := l.TryAcquire(ctx, k)
	if err == nil {
		lease.Release(context.Background())
		t.Fatalf("TryAcquire(%q) succeeded while another owner holds it", k)
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) on a held key: %v, want ErrNotAcquired", k, err)
	}
}

func (s *suite) fences() bool { return s.caps.Fencing != backend.FencingNone }

// waitDone waits for the lease to end, up to d.
func waitDone(t *testing.T, lease *dlock.Lease, d time.Duration, what string) {
	t.Helper()
	select {
	case <-lease.Done():
	case <-time.After(d):
		t.Fatalf("%s: lease Done not closed within %v", what, d)
	}
}

// notBefore checks the safety property of a lease: the later grant came no
// sooner than the earlier holder's deadline. The later grant's request was
// sent at granted (Lease.Granted) and its answer was back at returned; the
// server granted it somewhere between. An answer back before the deadline is
// a violation whatever the request's time in flight. A request sent before
// the deadline and answered after it is not: it is what a correct driver gives
// when this request spent longer in flight than the earlier holder's did (its
// deadline counts from its own send), and this test cannot place the grant
// inside that round trip, so it is logged, not failed. The soak and the fault
// matrix, which fence every write, catch an overlap inside it.
func notBefore(t *testing.T, what string, granted, returned, deadline time.Time) {
	t.Helper()
	switch {
	case returned.Before(deadline):
		t.Fatalf("%s granted, and the grant was back, %v before the earlier holder's deadline", what, deadline.Sub(returned))
	case granted.Before(deadline):
		t.Logf("%s: the winning request was sent %v before the earlier holder's deadline and answered %v after it (a longer time in flight than the earlier holder's request)", what, deadline.Sub(granted), returned.Sub(deadline))
	}
}

// testMutualExclusion: 4 lockers × 4 goroutines × 50 rounds do a
// read-modify-write on one shared value under one key, through a fencing guard.
// No two holders may overlap, no update may be lost, and every grant's token
// must be higher than the previous grant's.
func (s *suite) testMutualExclusion(t *testing.T) {
	const lockers, goroutines, rounds = 4, 4, 50
	ctx := s.ctx(t)
	k := key(t)
	var (
		guard    fencing.Guard
		value    int // the shared state; only touched through the guard
		inside   atomic.Int32
		overlaps atomic.Int32
		stale    atomic.Int32
		mu       sync.Mutex
		tokens   []dlock.Token // in grant order (appended while holding)
	)
	var wg sync.WaitGroup
	errs := make(chan error, lockers*goroutines)
	for range lockers {
		l := s.locker(t)
		for range goroutines {
			wg.Go(func() {
				for range rounds {
					lease, err := l.Acquire(ctx, k, dlock.WithTTL(30*time.Second))
					if err != nil {
						errs <- err
						return
					}
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					mu.Lock()
					tokens = append(tokens, lease.Token())
					mu.Unlock()

					var read int
					if err := guard.Do(k, lease.Token(), func() error { read = value; return nil }); err != nil {
						stale.Add(1)
					}
					runtime.Gosched() // widen the window a broken lock would show in
					if err := guard.Do(k, lease.Token(), func() error { value = read + 1; return nil }); err != nil {
						stale.Add(1)
					}
					inside.Add(-1)
					if err := lease.Release(context.Background()); err != nil {
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
		t.Fatal(err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d grants overlapped another holder", n)
	}
	if want := lockers * goroutines * rounds; value != want {
		t.Errorf("shared value = %d after %d increments: %d updates lost", value, want, want-value)
	}
	if !s.fences() {
		return
	}
	if n := stale.Load(); n != 0 {
		t.Errorf("the guard rejected %d writes of current holders", n)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d has token %d, not above grant %d's token %d", i, tokens[i], i-1, tokens[i-1])
		}
	}
}

// testTokensIncrease: tokens strictly increase per key across lockers,
// releases, forced expiries and TTL expiries, and are never 0.
func (s *suite) testTokensIncrease(t *testing.T) {
	if !s.fences() {
		t.Skip("backend claims no fencing (Capabilities().Fencing = none)")
	}
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	k := key(t)
	var last dlock.Token
	check := func(step string, lease *dlock.Lease) {
		t.Helper()
		tok := lease.Token()
		if tok == 0 {
			t.Fatalf("%s: token 0", step)
		}
		if tok <= last {
			t.Fatalf("%s: token %d not above the previous grant's %d", step, tok, last)
		}
		last = tok
	}

	l1 := mustAcquire(t, ctx, a, k)
	check("first grant", l1)
	mustRelease(t, l1)

	l2 := mustAcquire(t, ctx, b, k)
	check("grant to another locker after release", l2)
	mustRelease(t, l2)

	l3 := mustAcquire(t, ctx, a, k)
	check("grant to the same locker again", l3)
	s.h.Expire(t, k)
	l4 := mustAcquire(t, ctx, b, k)
	check("grant after the backend forgot the holder", l4)

	// l4's holder vanishes; the next grant comes after its TTL.
	mustRelease(t, l4)
	l5 := mustAcquire(t, ctx, a, k, dlock.WithTTL(s.ttl), dlock.WithAutoRenew(false))
	check("grant with a short TTL", l5)
	l6 := mustAcquire(t, ctx, b, k)
	check("grant after the previous holder's TTL expired", l6)
	mustRelease(t, l6)

	// Other keys have their own sequence, which does not disturb this one.
	other := mustAcquire(t, ctx, a, k+"/other")
	mustRelease(t, other)
	l7 := mustAcquire(t, ctx, b, k)
	check("grant after another key was used", l7)
	mustRelease(t, l7)
}

func (s *suite) testTryAcquireHeld(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	k := key(t)
	lease := mustAcquire(t, ctx, a, k, dlock.WithTTL(30*time.Second))
	start := time.Now()
	expectNotAcquired(t, ctx, b, k)
	expectNotAcquired(t, ctx, a, k) // not reentrant, even for the same Locker
	// "At once" means without waiting for the holder: far below its TTL.
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("TryAcquire on a held key took %v", d)
	} else {
		t.Logf("two TryAcquire on a held key took %v", d)
	}
	mustRelease(t, lease)
	l2, err := b.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire after release: %v", err)
	}
	mustRelease(t, l2)
}

// testWakesAfterRelease measures release → grant for a waiting Acquire. The
// holder's TTL is long, so only a wake-up (or a poll) can explain a prompt
// grant.
func (s *suite) testWakesAfterRelease(t *testing.T) {
	ctx := s.ctx(t)
	a := s.locker(t)
	b := s.locker(t)
	if sp, ok := s.h.(SlowPoller); ok {
		b = sp.NewSlowPollLocker(t) // only a push can wake it within the bound
		t.Cleanup(func() { _ = b.Close() })
	}
	k := key(t)
	const ttl = 60 * time.Second
	lease := mustAcquire(t, ctx, a, k, dlock.WithTTL(ttl))
	got := make(chan time.Time, 1)
	var waited *dlock.Lease
	var werr error
	go func() {
		waited, werr = b.Acquire(ctx, k, dlock.WithTTL(ttl))
		got <- time.Now()
	}()
	if wc, ok := s.h.(WaiterCounter); ok {
		// The backend itself says b is waiting: a release now must wake it.
		deadline := time.Now().Add(10 * time.Second)
		for wc.Waiters(t, k) < 1 {
			if time.Now().After(deadline) {
				t.Fatalf("the backend never saw the waiter on %q", k)
			}
			time.Sleep(5 * time.Millisecond)
		}
	} else {
		// No signal from the backend: give b a moment. If it has not begun
		// waiting, it acquires after the release, and the bound proves less.
		t.Log("harness has no WaiterCounter: the waiter is given 200ms to start waiting")
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case <-got:
		t.Fatalf("Acquire returned while the lock was held: %v", werr)
	default:
	}
	released := time.Now()
	mustRelease(t, lease)
	at := <-got
	if werr != nil {
		t.Fatalf("waiting Acquire: %v", werr)
	}
	defer mustRelease(t, waited)
	d := at.Sub(released)
	bound := 3 * time.Second // a fallback poll may be needed without push waits
	if s.caps.PushWait {
		bound = PushWaitBound
	}
	t.Logf("release → waiting Acquire granted: %v", d)
	if d > bound {
		t.Errorf("waiting Acquire took %v after the release (bound %v, push-wait=%v)", d, bound, s.caps.PushWait)
	}
}

// testFIFO proves a FIFO claim: waiters are granted in the order they began
// waiting.
func (s *suite) testFIFO(t *testing.T) {
	if !s.caps.FIFO {
		t.Skip("backend does not claim FIFO waiting")
	}
	ctx := s.ctx(t)
	k := key(t)
	holder := s.locker(t)
	lease := mustAcquire(t, ctx, holder, k)
	const n = 4
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		l := s.locker(t)
		wg.Go(func() {
			w, err := l.Acquire(ctx, k)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				order <- -1
				return
			}
			order <- i
			mustRelease(t, w)
		})
		// Let waiter i queue before waiter i+1 starts; there is no signal for it.
		time.Sleep(300 * time.Millisecond)
	}
	mustRelease(t, lease)
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("grant %d went to waiter %d, want waiter %d (FIFO)", want, got, want)
		}
		want++
	}
}

// testCancelMidWait: cancelling a waiting Acquire returns an error matching both
// ErrNotAcquired and the context's error, and leaves nothing behind: once the
// holder releases, another locker's TryAcquire succeeds at once.
func (s *suite) testCancelMidWait(t *testing.T) {
	ctx := s.ctx(t)
	a, b, c := s.locker(t), s.locker(t), s.locker(t)
	k := key(t)
	lease := mustAcquire(t, ctx, a, k)

	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.Acquire(wctx, k)
	if err == nil {
		t.Fatal("Acquire succeeded while the lock was held")
	}
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with an expiring ctx: %v; want it to match ErrNotAcquired and context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Acquire returned %v after its ctx deadline of 300ms", d)
	}

	// Explicit cancel, with a cause.
	cctx, ccancel := context.WithCancelCause(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(cctx, k)
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	ccancel(errors.New("caller gave up"))
	if err := <-errc; !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled ctx: %v; want ErrNotAcquired and context.Canceled", err)
	}

	mustRelease(t, lease)
	l2, err := c.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire after the holder released, with two cancelled waiters: %v (residue left behind?)", err)
	}
	mustRelease(t, l2)
}

func (s *suite) testCancelledBeforeCall(t *testing.T) {
	l := s.locker(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	k := key(t)
	for _, try := range []bool{false, true} {
		var err error
		if try {
			_, err = l.TryAcquire(ctx, k)
		} else {
			_, err = l.Acquire(ctx, k)
		}
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("acquire (try=%v) with a cancelled ctx: %v; want ErrNotAcquired and context.Canceled", try, err)
		}
	}
	lease, err := s.locker(t).TryAcquire(s.ctx(t), k)
	if err != nil {
		t.Fatalf("TryAcquire after calls with a cancelled ctx: %v", err)
	}
	mustRelease(t, lease)
}

// testStaleLease: a lease the backend has forgotten, whose key another owner
// now holds, can neither refresh nor release the new holder's lock.
func (s *suite) testStaleLease(t *testing.T) {
	ctx := s.ctx(t)
	a, b, c := s.locker(t), s.locker(t), s.locker(t)
	k := key(t)
	old := mustAcquire(t, ctx, a, k, dlock.WithAutoRenew(false), dlock.WithTTL(30*time.Second))
	s.h.Expire(t, k)
	current := mustAcquire(t, ctx, b, k)

	if err := old.Refresh(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Refresh of a stale lease: %v, want ErrLeaseLost", err)
	}
	if err := old.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Release of a stale lease: %v, want ErrLeaseLost", err)
	}
	waitDone(t, old, time.Second, "stale lease after failed Release")
	if !errors.Is(old.Err(), dlock.ErrLeaseLost) {
		t.Errorf("stale lease Err() = %v, want ErrLeaseLost", old.Err())
	}
	// The new holder is untouched.
	expectNotAcquired(t, ctx, c, k)
	if err := current.Refresh(ctx); err != nil {
		t.Fatalf("Refresh of the current holder after a stale release: %v", err)
	}
	if current.Err() != nil {
		t.Fatalf("current holder's lease ended: %v", current.Err())
	}
	mustRelease(t, current)
}

// testHolderVanishes: a holder that disappears without releasing blocks others
// until its TTL runs out, and not a moment before its own lease's deadline.
func (s *suite) testHolderVanishes(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	k := key(t)
	gone := mustAcquire(t, ctx, a, k, dlock.WithTTL(s.ttl), dlock.WithAutoRenew(false))
	if cr, ok := s.h.(Crasher); ok {
		cr.Crash(t, a)
	}
	deadline := gone.Deadline()
	lease := mustAcquire(t, ctx, b, k)
	returned := time.Now()
	granted := lease.GrantedAt()
	defer mustRelease(t, lease)
	// The safety property of a lease lock: nobody else is granted the lock
	// before the old holder's lease has ended by its own clock.
	notBefore(t, "the lock", granted, returned, deadline)
	if late := granted.Sub(deadline); late > 5*s.ttl+2*time.Second {
		t.Errorf("lock granted %v after the vanished holder's deadline (TTL %v)", late, s.ttl)
	} else {
		t.Logf("granted %v after the vanished holder's deadline (TTL %v)", late, s.ttl)
	}
	waitDone(t, gone, time.Second, "vanished holder's lease")
	if !errors.Is(gone.Err(), dlock.ErrLeaseLost) {
		t.Errorf("vanished holder's Err() = %v, want ErrLeaseLost", gone.Err())
	}
}

// testAutoRenew: with auto-renew on, a lease outlives five TTLs and nobody else
// gets the lock meanwhile.
func (s *suite) testAutoRenew(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	k := key(t)
	lease := mustAcquire(t, ctx, a, k, dlock.WithTTL(s.ttl))
	first := lease.Deadline()
	for i := range 5 {
		select {
		case <-lease.Done():
			t.Fatalf("lease ended after %d TTLs: %v", i, lease.Err())
		case <-time.After(s.ttl):
		}
		expectNotAcquired(t, ctx, b, k)
	}
	if !lease.Deadline().After(first.Add(3 * s.ttl)) {
		t.Errorf("Deadline moved from %v to only %v over 5 TTLs", first, lease.Deadline())
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("Err() = %v while held", err)
	}
	mustRelease(t, lease)
	waitDone(t, lease, time.Second, "released lease")
	if !errors.Is(lease.Err(), dlock.ErrReleased) {
		t.Fatalf("Err() after Release = %v, want ErrReleased", lease.Err())
	}
}

// testExpireEndsLease: when the backend forgets the holder, the lease ends
// (Done closed, Err ErrLeaseLost) — at once on a backend claiming LossNotify,
// at the next renewal otherwise — and Release reports ErrLeaseLost.
func (s *suite) testExpireEndsLease(t *testing.T) {
	ctx := s.ctx(t)
	a := s.locker(t)
	k := key(t)
	ttl, bound := s.ttl, 2*s.ttl
	if s.caps.LossNotify {
		// A TTL so long that only a loss notification explains a prompt end.
		ttl, bound = 60*time.Second, 5*time.Second
	}
	lease := mustAcquire(t, ctx, a, k, dlock.WithTTL(ttl))
	expired := time.Now()
	s.h.Expire(t, k)
	waitDone(t, lease, bound, fmt.Sprintf("after Expire (loss-notify=%v)", s.caps.LossNotify))
	t.Logf("lease ended %v after the backend forgot it", time.Since(expired))
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", lease.Err())
	}
	if err := lease.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of a lost lease: %v, want ErrLeaseLost", err)
	}
	if err := lease.Refresh(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Refresh of a lost lease: %v, want ErrLeaseLost", err)
	}
	next := mustAcquire(t, ctx, s.locker(t), k)
	mustRelease(t, next)
}

// testManualRefresh: with auto-renew off, Refresh keeps the lease past its
// TTL; without it, the lease ends at its deadline.
func (s *suite) testManualRefresh(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	k := key(t)
	lease := mustAcquire(t, ctx, a, k, dlock.WithTTL(s.ttl), dlock.WithAutoRenew(false))
	for range 3 {
		time.Sleep(s.ttl / 3)
		before := lease.Deadline()
		if err := lease.Refresh(ctx); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if !lease.Deadline().After(before) {
			t.Fatalf("Refresh did not move the deadline (%v → %v)", before, lease.Deadline())
		}
	}
	expectNotAcquired(t, ctx, b, k)
	// Stop refreshing: the lease ends by its deadline, on the local clock.
	deadline := lease.Deadline()
	waitDone(t, lease, time.Until(deadline)+s.ttl, "unrefreshed lease")
	if ended := time.Now(); ended.Before(deadline) && !s.caps.LossNotify {
		t.Errorf("lease ended %v before its deadline", deadline.Sub(ended))
	}
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", lease.Err())
	}
}

func (s *suite) testDoubleRelease(t *testing.T) {
	ctx := s.ctx(t)
	l := s.locker(t)
	lease := mustAcquire(t, ctx, l, key(t))
	mustRelease(t, lease)
	if err := lease.Release(ctx); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("second Release: %v, want ErrReleased", err)
	}
	if err := lease.Refresh(ctx); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("Refresh after Release: %v, want ErrReleased", err)
	}
	if errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err() after Release = %v: a release is not a loss", lease.Err())
	}
}

// testCloseReleases: Close releases every lease the Locker holds, and every
// call after Close returns ErrClosed.
func (s *suite) testCloseReleases(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	k1, k2 := key(t, "/1"), key(t, "/2")
	l1 := mustAcquire(t, ctx, a, k1, dlock.WithTTL(60*time.Second))
	l2 := mustAcquire(t, ctx, a, k2, dlock.WithTTL(60*time.Second))

	// A waiter inside Acquire when Close starts returns ErrClosed.
	blocker := mustAcquire(t, ctx, b, k1+"/blocked")
	waitErr := make(chan error, 1)
	go func() {
		_, err := a.Acquire(ctx, k1+"/blocked")
		waitErr <- err
	}()
	time.Sleep(100 * time.Millisecond)

	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-waitErr; !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Acquire in flight during Close: %v, want ErrClosed", err)
	}
	for _, l := range []*dlock.Lease{l1, l2} {
		waitDone(t, l, time.Second, "lease of a closed Locker")
		if !errors.Is(l.Err(), dlock.ErrReleased) {
			t.Errorf("lease Err() after Close = %v, want ErrReleased", l.Err())
		}
		lease, err := b.TryAcquire(ctx, l.Key())
		if err != nil {
			t.Fatalf("TryAcquire of a key released by Close: %v", err)
		}
		mustRelease(t, lease)
	}
	mustRelease(t, blocker)
	if _, err := a.Acquire(ctx, k1); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
	if _, err := a.TryAcquire(ctx, k1); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("TryAcquire after Close: %v, want ErrClosed", err)
	}
	if err := a.Close(); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
}

// testKeys: odd keys work and stay distinct — including pairs that a naive
// escaping scheme would map onto one backend key.
func (s *suite) testKeys(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	base := key(t)
	suffixes := []string{
		"", "/", "//", "/a", "/a/", "/a/b", "/a%2Fb", "/a b", " ", "/ключ", "/🔒",
		"/{x}", "/%7Bx%7D", "/}{", "/{", "/}", "/%", "/%25", "/:fence", ":fence",
		"/_c_", "/-lock-", "/.", "/..", "/\t\n", "/\\", "/'\"", "/*?[]",
		"/" + strings.Repeat("k", dlock.MaxKeyLen-len(base)-1),
	}
	leases := make([]*dlock.Lease, 0, len(suffixes))
	for _, suf := range suffixes {
		k := base + suf
		// Every key is distinct: all are held at once by one Locker.
		lease, err := a.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("TryAcquire(%q) while the other keys are held: %v (keys collide?)", k, err)
		}
		if s.fences() && lease.Token() == 0 {
			t.Errorf("key %q: token 0", k)
		}
		leases = append(leases, lease)
	}
	for _, lease := range leases {
		expectNotAcquired(t, ctx, b, lease.Key())
	}
	for _, lease := range leases {
		mustRelease(t, lease)
	}
}

// testInvalidInput: bad keys and options are rejected with clear errors before
// reaching the backend, never with a panic or a silent default.
func (s *suite) testInvalidInput(t *testing.T) {
	ctx := s.ctx(t)
	l := s.locker(t)
	for _, k := range []string{"", strings.Repeat("x", dlock.MaxKeyLen+1), "bad\xffutf8", "nul\x00byte"} {
		for _, try := range []bool{false, true} {
			var err error
			if try {
				_, err = l.TryAcquire(ctx, k)
			} else {
				_, err = l.Acquire(ctx, k)
			}
			if !errors.Is(err, dlock.ErrInvalidKey) {
				t.Errorf("acquire (try=%v) of key %.20q: %v, want ErrInvalidKey", try, k, err)
			}
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second} {
		if _, err := l.Acquire(ctx, key(t), dlock.WithTTL(ttl)); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("Acquire with TTL %v: %v, want ErrInvalidOption", ttl, err)
		} else if !strings.Contains(err.Error(), "ttl") {
			t.Errorf("error for TTL %v does not name the TTL: %v", ttl, err)
		}
	}
}

// testDoCancelsOnLoss: Do's fn context is cancelled with cause ErrLeaseLost when
// the lease is lost, and Do reports the loss.
func (s *suite) testDoCancelsOnLoss(t *testing.T) {
	ctx := s.ctx(t)
	l := s.locker(t)
	k := key(t)
	ran := false
	err := dlock.Do(ctx, l, k, func(ctx context.Context, lease *dlock.Lease) error {
		ran = true
		if lease.Token() == 0 && s.fences() {
			t.Error("Do gave a lease with token 0")
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Do: ran=%v err=%v", ran, err)
	}
	// Released afterwards.
	lease, err := s.locker(t).TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire after Do returned: %v", err)
	}
	mustRelease(t, lease)

	var cause error
	err = dlock.Do(ctx, l, k, func(fctx context.Context, lease *dlock.Lease) error {
		s.h.Expire(t, k)
		select {
		case <-fctx.Done():
			cause = context.Cause(fctx)
			return fctx.Err()
		case <-time.After(5*s.ttl + 5*time.Second):
			return errors.New("fn's ctx was not cancelled after the lease was lost")
		}
	}, dlock.WithTTL(s.ttl))
	if !errors.Is(cause, dlock.ErrLeaseLost) {
		t.Errorf("context.Cause(fn ctx) = %v, want ErrLeaseLost", cause)
	}
	if !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Do after losing the lease: %v, want ErrLeaseLost", err)
	}
}

// testPausedHolder is the scenario of Kleppmann's "How to do distributed
// locking": A holds the lock with token t and pauses (stops renewing) past its
// TTL; B acquires with a higher token and writes; A wakes and writes with t —
// the resource must reject it.
func (s *suite) testPausedHolder(t *testing.T) {
	if !s.fences() {
		t.Skip("backend claims no fencing (Capabilities().Fencing = none)")
	}
	ctx := s.ctx(t)
	a, b := s.locker(t), s.locker(t)
	k := key(t)
	var storage fencing.Guard
	resource := "file:" + k
	var contents string // what the storage holds, written only through the Guard
	write := func(tok dlock.Token, v string) error {
		return storage.Do(resource, tok, func() error { contents = v; return nil })
	}

	// A holds the lock and writes. Then it pauses: it renews nothing (a
	// stopped process's keepalive does not run either).
	leaseA := mustAcquire(t, ctx, a, k, dlock.WithTTL(s.ttl), dlock.WithAutoRenew(false))
	tokA := leaseA.Token()
	if err := write(tokA, "A1"); err != nil {
		t.Fatalf("A's write while it held the lock: %v", err)
	}
	// B waits for the lock meanwhile.
	type result struct {
		lease    *dlock.Lease
		err      error
		returned time.Time
	}
	got := make(chan result, 1)
	go func() {
		lease, err := b.Acquire(ctx, k)
		got <- result{lease, err, time.Now()}
	}()
	// A's lease is lost while A is paused, and says so to anyone who looks:
	// Done closes, by A's own clock, no later than the backend can grant the
	// lock to B.
	waitDone(t, leaseA, s.waitBound(), "paused holder's lease")
	if !errors.Is(leaseA.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("paused holder's Err() = %v, want ErrLeaseLost", leaseA.Err())
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("B's Acquire after A's lease was lost: %v", r.err)
	}
	leaseB := r.lease
	defer mustRelease(t, leaseB)
	notBefore(t, "B's lock (after the paused holder's)", leaseB.GrantedAt(), r.returned, leaseA.Deadline())
	tokB := leaseB.Token()
	if err := write(tokB, "B1"); err != nil {
		t.Fatalf("B's write with token %d: %v", tokB, err)
	}
	// A wakes up and, without looking at its lease, writes with its old
	// token: the Guard must refuse it, and the storage keep B's write.
	err := write(tokA, "A2 (stale)")
	if !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("the paused holder's write with token %d after B's %d: %v, want ErrStaleToken", tokA, tokB, err)
	}
	if contents != "B1" {
		t.Fatalf("storage holds %q after the paused holder's write, want B's %q", contents, "B1")
	}
}
