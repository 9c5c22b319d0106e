package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/observe"
)

// TestAcquireAllRejectsBadSets: an empty set, a key listed twice and an
// invalid key are refused with ErrInvalidKey before anything is taken.
func TestAcquireAllRejectsBadSets(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://acquire-all-bad")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, keys := range [][]string{nil, {"a", "b", "a"}, {"a", ""}} {
		if _, err := dlock.AcquireAll(ctx, l, keys); !errors.Is(err, dlock.ErrInvalidKey) {
			t.Errorf("AcquireAll(%q): %v, want ErrInvalidKey", keys, err)
		}
	}
	lease, err := l.TryAcquire(ctx, "a")
	if err != nil {
		t.Fatalf("a refused set left key a held: %v", err)
	}
	_ = lease.Release(ctx)
}

// TestReentrantDSNParameter: reentrant=true in the DSN makes every acquire
// of the Locker re-entrant; a bad value is refused.
func TestReentrantDSNParameter(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://reentrant-dsn?reentrant=true")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = dlock.Do(ctx, l, "k", func(ctx context.Context, outer *dlock.Lease) error {
		inner, err := l.TryAcquire(ctx, "k")
		if err != nil {
			return err
		}
		if inner.Token() != outer.Token() {
			t.Errorf("nested token %v, want %v", inner.Token(), outer.Token())
		}
		return inner.Release(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dlock.Open(ctx, "mem://reentrant-dsn-bad?reentrant=maybe"); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("reentrant=maybe: %v, want ErrInvalidOption", err)
	}
}

// TestNestedHoldEndsWithOutermost: releasing the outermost lease ends the
// holds nested in it (ErrReleased), and frees the lock.
func TestNestedHoldEndsWithOutermost(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://nested-ends")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	outer, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	inner, err := l.Acquire(dlock.ContextWithLease(ctx, outer), "k", dlock.WithReentrant())
	if err != nil {
		t.Fatal(err)
	}
	if !inner.Deadline().Equal(outer.Deadline()) {
		t.Errorf("nested deadline %v, want the lease's %v", inner.Deadline(), outer.Deadline())
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-inner.Done()
	if err := inner.Err(); !errors.Is(err, dlock.ErrReleased) {
		t.Errorf("nested hold after the outermost release: %v, want ErrReleased", err)
	}
	again, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("key still held after the outermost release: %v", err)
	}
	_ = again.Release(ctx)
}

// TestLabelValidation: a label longer than backend.MaxLabelLen or with a
// character that is not printable is refused at Open and at Acquire; the
// DSN parameter label sets it.
func TestLabelValidation(t *testing.T) {
	ctx := context.Background()
	for _, bad := range []string{strings.Repeat("x", 129), "tab\there", "nl\n", string([]byte{0xff})} {
		if _, err := dlock.Open(ctx, "mem://label-bad", dlock.WithLabel(bad)); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("WithLabel(%q) at Open: %v, want ErrInvalidOption", bad, err)
		}
	}
	l, err := dlock.Open(ctx, "mem://label-dsn?label=from-dsn")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Acquire(ctx, "k", dlock.WithLabel("bad\x00")); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("WithLabel with NUL at Acquire: %v, want ErrInvalidOption", err)
	}
	lease, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	info, err := dlock.Inspect(ctx, l, "k")
	if err != nil {
		t.Fatal(err)
	}
	if info.Label != "from-dsn" {
		t.Errorf("label from the DSN: %q, want from-dsn", info.Label)
	}
}

// flakyTries is a Locker whose TryAcquire fails as a slow node does, while
// its Acquire rides such failures out.
type flakyTries struct{ dlock.Locker }

var errSlowNode = errors.New("no reply within 100ms")

func (flakyTries) TryAcquire(context.Context, string, ...dlock.AcquireOption) (*dlock.Lease, error) {
	return nil, errSlowNode
}

// A waiting AcquireAll whose first, all-at-once try fails for another reason
// than a held key goes on one key at a time, as a waiting Acquire would; a
// TryAcquireAll reports the failure.
func TestAcquireAllRidesOutAFailedTry(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://acquire-all-flaky")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	set, err := dlock.AcquireAll(ctx, flakyTries{l}, []string{"a", "b", "c"})
	if err != nil {
		t.Fatalf("AcquireAll after a failed try: %v", err)
	}
	if n := len(set.Leases()); n != 3 {
		t.Errorf("%d leases, want 3", n)
	}
	_ = set.Release(ctx)
	if _, err := dlock.TryAcquireAll(ctx, flakyTries{l}, []string{"a", "b"}); !errors.Is(err, errSlowNode) {
		t.Errorf("TryAcquireAll with failing tries: %v, want the tries' error", err)
	}
}

// lossSignal is an Observer that sends the key of each lease lost.
type lossSignal chan string

func (s lossSignal) StartAcquire(ctx context.Context, a observe.AcquireInfo) (context.Context, func(observe.AcquireOutcome) observe.LeaseObserver) {
	return ctx, func(observe.AcquireOutcome) observe.LeaseObserver { return lossOf{s, a.Key} }
}

type lossOf struct {
	s   lossSignal
	key string
}

func (lossOf) Renewed(time.Duration, error) {}
func (lossOf) StartRelease(ctx context.Context) (context.Context, func(error)) {
	return ctx, func(error) {}
}
func (o lossOf) Ended(e observe.LeaseEnd) {
	if e.Lost {
		o.s <- o.key
	}
}

// cancelOnTry is a Locker whose TryAcquire cancels the caller's wait (as a
// caller that gives up while the first, all-at-once try is out does) before
// it tries.
type cancelOnTry struct {
	dlock.Locker
	cancel context.CancelFunc
}

func (c cancelOnTry) TryAcquire(ctx context.Context, key string, opts ...dlock.AcquireOption) (*dlock.Lease, error) {
	c.cancel()
	return c.Locker.TryAcquire(context.WithoutCancel(ctx), key, opts...)
}

// A waiting AcquireAll cancelled while its first, all-at-once try is out
// reports the cancelled wait (ErrNotAcquired and ctx's error), as a
// cancelled Acquire does, whatever the try found, and leaves nothing held.
func TestAcquireAllCancelledDuringItsTry(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://acquire-all-cancelled-try")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	blocker, err := l.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Release(ctx)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err = dlock.AcquireAll(cctx, cancelOnTry{l, cancel}, []string{"a", "b", "c"})
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireAll cancelled during its try: %v, want ErrNotAcquired and context.Canceled", err)
	}
	for _, k := range []string{"a", "c"} {
		lease, err := l.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("%s after the cancelled AcquireAll: %v", k, err)
		}
		_ = lease.Release(ctx)
	}
}

// A waiting AcquireAll whose lease of an earlier key is lost while it waits
// for a later one does not return a set that is already lost: it takes the
// keys again.
func TestAcquireAllLostWhileWaiting(t *testing.T) {
	ctx := context.Background()
	lost := make(lossSignal, 4)
	l, err := dlock.Open(ctx, "mem://acquire-all-lost", dlock.WithObserver(lost))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err := l.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		set *dlock.LeaseSet
		err error
	}
	got := make(chan result, 1)
	go func() {
		set, err := dlock.AcquireAll(ctx, l, []string{"a", "b"})
		got <- result{set, err}
	}()
	// It holds "a" and waits for "b".
	var broken dlock.LockInfo
	for {
		info, err := dlock.Inspect(ctx, l, "a")
		if err != nil {
			t.Fatal(err)
		}
		if info.Held {
			broken = info
			break
		}
		time.Sleep(time.Millisecond) // polling the backend: a waiter sends no signal
	}
	if _, err := dlock.Break(ctx, l, "a"); err != nil {
		t.Fatal(err)
	}
	// The lease learns of the break from the backend's loss signal, a moment
	// later; only then is the set known to be lost while it waits.
	if k := <-lost; k != "a" {
		t.Fatalf("lease of %q lost, want a", k)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if res.err != nil {
		t.Fatalf("AcquireAll after its first key was broken while it waited: %v", res.err)
	}
	defer res.set.Release(ctx)
	if err := res.set.Err(); err != nil {
		t.Fatalf("AcquireAll returned a set that had already ended: %v", err)
	}
	if a := res.set.Leases()[0]; a.Key() != "a" || uint64(a.Token()) <= broken.Token {
		t.Errorf("lease of %q with token %v, want \"a\" with a token above the broken one's %v (taken again)", a.Key(), a.Token(), broken.Token)
	}
}
