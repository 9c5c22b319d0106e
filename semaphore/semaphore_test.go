package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/semaphore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// portable is a mem:// Locker with its own semaphore layout hidden
// (Capabilities().NativeSemaphore false), so that a semaphore on it is made of
// slot locks, as on a backend without one.
type portable struct{ dlock.Locker }

func (p portable) Capabilities() dlock.Capabilities {
	c := p.Locker.Capabilities()
	c.NativeSemaphore = false
	return c
}

func (p portable) Inspect(ctx context.Context, key string) (dlock.LockInfo, error) {
	return dlock.Inspect(ctx, p.Locker, key)
}

func (p portable) List(ctx context.Context, prefix string) ([]dlock.LockInfo, error) {
	return dlock.List(ctx, p.Locker, prefix)
}

func (p portable) Watch(ctx context.Context, key string, changed func()) error {
	return dlock.Watch(ctx, p.Locker, key, changed)
}

func openPortable(t *testing.T, dsn string) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return portable{l}
}

func TestNewRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://semaphore-new")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct {
		name string
		n    int
		opts []semaphore.Option
		want error
	}{
		{"", 1, nil, dlock.ErrInvalidKey},
		{"a\x00b", 1, nil, dlock.ErrInvalidKey},
		{"\xff", 1, nil, dlock.ErrInvalidKey},
		{strings.Repeat("k", dlock.MaxKeyLen), 1, nil, dlock.ErrInvalidKey},
		{"ok", 0, nil, dlock.ErrInvalidOption},
		{"ok", semaphore.MaxPermits + 1, nil, dlock.ErrInvalidOption},
		{"ok", 1, []semaphore.Option{semaphore.WithPollInterval(0)}, dlock.ErrInvalidOption},
	} {
		if _, err := semaphore.New(l, tc.name, tc.n, tc.opts...); !errors.Is(err, tc.want) {
			t.Errorf("New(%q, %d): %v, want %v", tc.name, tc.n, err, tc.want)
		}
	}
	if _, err := semaphore.New(nil, "ok", 1); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("New(nil Locker): %v, want ErrInvalidOption", err)
	}
	s, err := semaphore.New(l, "ok", semaphore.MaxPermits)
	if err != nil {
		t.Fatal(err)
	}
	if s.SlotKey(7) != "ok/permits/7" || s.Permits() != semaphore.MaxPermits || s.Name() != "ok" {
		t.Errorf("SlotKey(7) = %q, Permits() = %d, Name() = %q", s.SlotKey(7), s.Permits(), s.Name())
	}
}

func TestParseLabel(t *testing.T) {
	for label, want := range map[string]int{
		"permits=3 host:12": 3, "permits=1024": 1024, "permits=0": 0, "permits=x y": 0, "host:12": 0, "": 0, "permits=-2": 0,
	} {
		n, ok := semaphore.ParseLabel(label)
		if ok != (want > 0) || n != want && ok {
			t.Errorf("ParseLabel(%q) = %d, %v; want %d", label, n, ok, want)
		}
	}
}

// A holder of permit 3 of 4 makes a semaphore of 2 refuse every grant: it
// holds a slot beyond 2.
func TestSizeMismatchBeyondRange(t *testing.T) {
	ctx := context.Background()
	l := openPortable(t, "mem://semaphore-size")
	held, err := l.Acquire(ctx, semaphore.SlotKey("s", 3), dlock.WithLabel("someone else"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	two, _ := semaphore.New(l, "s", 2)
	if _, err := two.TryAcquire(ctx); !errors.Is(err, semaphore.ErrSizeMismatch) || !strings.Contains(err.Error(), "permit 3 is held") {
		t.Fatalf("TryAcquire while slot 3 is held: %v, want ErrSizeMismatch naming permit 3", err)
	}
	unchecked, _ := semaphore.New(l, "s", 2, semaphore.WithSizeCheck(false))
	p, err := unchecked.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire without the size check: %v", err)
	}
	_ = p.Release(ctx)
}

// slowList is a Locker whose List answers only when its ctx ends, as a
// List that a partition holds up does.
type slowList struct{ dlock.Locker }

func (slowList) Inspect(ctx context.Context, key string) (dlock.LockInfo, error) {
	return dlock.LockInfo{}, errors.ErrUnsupported
}

func (slowList) List(ctx context.Context, prefix string) ([]dlock.LockInfo, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A size check that outlasts the permit's lease never hands out the lost
// permit: a try is refused, and nothing is left held.
func TestSizeCheckOutlastingTheLease(t *testing.T) {
	ctx := context.Background()
	l := openPortable(t, "mem://semaphore-slow-list")
	sem, _ := semaphore.New(slowList{l}, "s", 1,
		semaphore.WithLeaseOptions(dlock.WithTTL(200*time.Millisecond), dlock.WithAutoRenew(false)))
	p, err := sem.TryAcquire(ctx)
	if err == nil {
		t.Fatalf("TryAcquire returned a permit (lease Err %v) although its lease ended during the size check", p.Err())
	}
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("TryAcquire: %v, want ErrNotAcquired and ErrLeaseLost", err)
	}
	other, _ := semaphore.New(l, "s", 1)
	q, err := other.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire after the refused grant: %v", err)
	}
	_ = q.Release(ctx)
}

// cancelOnTry is a Locker whose nth TryAcquire cancels the caller's wait (as
// a caller that gives up while a try is out does) before it tries.
type cancelOnTry struct {
	dlock.Locker
	n      int
	tries  *int
	cancel context.CancelFunc
}

func (c cancelOnTry) TryAcquire(ctx context.Context, key string, opts ...dlock.AcquireOption) (*dlock.Lease, error) {
	if *c.tries++; *c.tries == c.n {
		c.cancel()
	}
	return c.Locker.TryAcquire(context.WithoutCancel(ctx), key, opts...)
}

// AcquireN cancelled while a try is out, which finds the slot held, reports
// the cancelled wait (ErrNotAcquired and ctx's error), as a cancelled Acquire
// does, and leaves nothing held: in its first try (the first call) and in
// its wait (the third, after a first pass over both slots).
func TestAcquireNCancelledDuringATry(t *testing.T) {
	ctx := context.Background()
	l := openPortable(t, "mem://semaphore-cancelled-try")
	full, err := semaphore.New(l, "s", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 3} {
		held, err := full.TryAcquireN(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		tries := 0
		s, err := semaphore.New(cancelOnTry{l, n, &tries, cancel}, "s", 2)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.AcquireN(cctx, 1)
		cancel()
		t.Logf("cancelled during try %d: %v", n, err)
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Errorf("AcquireN cancelled during try %d: %v, want ErrNotAcquired and context.Canceled", n, err)
		}
		for _, p := range held {
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		ps, err := full.TryAcquireN(ctx, 2)
		if err != nil {
			t.Fatalf("both permits after the cancelled AcquireN: %v", err)
		}
		for _, p := range ps {
			_ = p.Release(ctx)
		}
	}
}
