package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/memlock"
)

// TestRejectedOptions: every value or combination of options that the
// compiler cannot refuse is refused at run time with an error matching
// ErrInvalidOption, in every place the option can be given — Open, New, a
// DSN parameter, Acquire, TryAcquire, Do, AcquireAll and TryAcquireAll — and
// a refused acquire leaves the key free.
func TestRejectedOptions(t *testing.T) {
	ctx := context.Background()
	bad := []struct {
		name string
		opts []dlock.LeaseOption
	}{
		{"ttl 0", []dlock.LeaseOption{dlock.WithTTL(0)}},
		{"ttl < 0", []dlock.LeaseOption{dlock.WithTTL(-time.Second)}},
		{"release timeout 0", []dlock.LeaseOption{dlock.WithReleaseTimeout(0)}},
		{"release timeout < 0", []dlock.LeaseOption{dlock.WithReleaseTimeout(-time.Second)}},
		{"label too long", []dlock.LeaseOption{dlock.WithLabel(strings.Repeat("x", 129))}},
		{"label not printable", []dlock.LeaseOption{dlock.WithLabel("a\x00b")}},
		{"label not UTF-8", []dlock.LeaseOption{dlock.WithLabel("\xff")}},
	}
	for _, tc := range bad {
		lockerOpts := make([]dlock.Option, len(tc.opts))
		acquireOpts := make([]dlock.AcquireOption, len(tc.opts))
		for i, o := range tc.opts {
			lockerOpts[i], acquireOpts[i] = o, o
		}
		if l, err := dlock.Open(ctx, "mem://rejected", lockerOpts...); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s: Open: %v, want ErrInvalidOption", tc.name, err)
			if err == nil {
				_ = l.Close()
			}
		}
		if l, err := dlock.New(memlock.NewStore().NewDriver(), lockerOpts...); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s: New: %v, want ErrInvalidOption", tc.name, err)
			if err == nil {
				_ = l.Close()
			}
		}
		checkAcquires(t, tc.name, acquireOpts)
	}
	// The acquire modes, given only to an acquire.
	for _, tc := range []struct {
		name string
		opts []dlock.AcquireOption
	}{
		{"permits 0", []dlock.AcquireOption{mode.WithPermits(0)}},
		{"permits < 0", []dlock.AcquireOption{mode.WithPermits(-1)}},
		{"permits and shared", []dlock.AcquireOption{mode.WithPermits(2), mode.WithShared()}},
		{"shared and permits", []dlock.AcquireOption{mode.WithShared(), mode.WithPermits(2)}},
	} {
		checkAcquires(t, tc.name, tc.opts)
	}
	for _, dsn := range []string{"mem://rejected?ttl=0s", "mem://rejected?ttl=-1s", "mem://rejected?autorenew=maybe",
		"mem://rejected?reentrant=2", "mem://rejected?label=a&label=b", "mem://rejected?ttl=1s&ttl=2s"} {
		if l, err := dlock.Open(ctx, dsn); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("Open(%q): %v, want ErrInvalidOption", dsn, err)
			if err == nil {
				_ = l.Close()
			}
		}
	}
	if _, err := dlock.New(nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("New(nil): %v, want ErrInvalidOption", err)
	}
	// A nil option and the zero LeaseOption change nothing.
	l, err := dlock.Open(ctx, "mem://rejected-nil", nil, dlock.LeaseOption{})
	if err != nil {
		t.Fatalf("Open with a nil option and a zero LeaseOption: %v", err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, "k", nil, dlock.LeaseOption{})
	if err != nil {
		t.Fatalf("TryAcquire with a nil option and a zero LeaseOption: %v", err)
	}
	_ = lease.Release(ctx)
}

// checkAcquires gives opts to every acquire of a Locker and wants each
// refused with ErrInvalidOption, the keys left free.
func checkAcquires(t *testing.T, name string, opts []dlock.AcquireOption) {
	t.Helper()
	// A refusal is immediate; the bound only ends an acquire that was let
	// through and waits.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, "mem://rejected-acquire")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	calls := map[string]func() error{
		"Acquire":    func() error { _, err := l.Acquire(ctx, "k", opts...); return err },
		"TryAcquire": func() error { _, err := l.TryAcquire(ctx, "k", opts...); return err },
		"Do": func() error {
			return dlock.Do(ctx, l, "k", func(context.Context, *dlock.Lease) error { return nil }, opts...)
		},
		"AcquireAll":    func() error { _, err := dlock.AcquireAll(ctx, l, []string{"k", "k2"}, opts...); return err },
		"TryAcquireAll": func() error { _, err := dlock.TryAcquireAll(ctx, l, []string{"k", "k2"}, opts...); return err },
	}
	for call, f := range calls {
		if err := f(); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s: %s: %v, want ErrInvalidOption", name, call, err)
		}
	}
	set, err := dlock.TryAcquireAll(ctx, l, []string{"k", "k2"})
	if err != nil {
		t.Fatalf("%s: the refused acquires left a key held: %v", name, err)
	}
	_ = set.Release(ctx)
}
