package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/memlock"
)

// WithPermits is refused on a backend that does not claim NativeSemaphore (before
// the driver sees it), with a count that is not > 0, beside WithShared, and
// for a key whose slot keys would be too long; a counted acquire under a
// re-entrant hold of the same key is not nested in it.
func TestPermitsOptions(t *testing.T) {
	ctx := context.Background()
	plain, err := dlock.New(unclaimed{memlock.NewStore().NewDriver(), func(c *backend.Capabilities) { c.NativeSemaphore = false }})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.TryAcquire(ctx, "k", mode.WithPermits(2)); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("WithPermits on a backend without NativeSemaphore: %v, want errors.ErrUnsupported", err)
	}
	l, err := dlock.Open(ctx, "mem://permits-options", dlock.WithReentrant())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct {
		key  string
		opts []dlock.AcquireOption
		want error
	}{
		{"k", []dlock.AcquireOption{mode.WithPermits(0)}, dlock.ErrInvalidOption},
		{"k", []dlock.AcquireOption{mode.WithPermits(-1)}, dlock.ErrInvalidOption},
		{"k", []dlock.AcquireOption{mode.WithPermits(2), mode.WithShared()}, dlock.ErrInvalidOption},
		{strings.Repeat("k", dlock.MaxKeyLen-len("/permits/1")+1), []dlock.AcquireOption{mode.WithPermits(2)}, dlock.ErrInvalidKey},
	} {
		if lease, err := l.TryAcquire(ctx, tc.key, tc.opts...); !errors.Is(err, tc.want) {
			if err == nil {
				_ = lease.Release(ctx)
			}
			t.Errorf("TryAcquire(%d-byte key, %d options): %v, want %v", len(tc.key), len(tc.opts), err, tc.want)
		}
	}
	outer, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Release(ctx)
	p, err := l.TryAcquire(dlock.ContextWithLease(ctx, outer), "k", mode.WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	if p.Key() != "k/permits/0" || p == outer {
		t.Errorf("a counted acquire under a hold of the key: key %q (nested: %v), want a permit on k/permits/0", p.Key(), p == outer)
	}
	_ = p.Release(ctx)
}
