package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/memlock"
)

// unclaimed is a driver that claims less than it can: its Capabilities
// pass through drop, so that a test sees what a Locker does for a backend
// without them.
type unclaimed struct {
	backend.Driver
	drop func(*backend.Capabilities)
}

func (d unclaimed) Capabilities() backend.Capabilities {
	c := d.Driver.Capabilities()
	d.drop(&c)
	return c
}

// A Locker whose backend cannot hold a lock shared refuses WithShared before
// the driver sees it, and says why.
func TestSharedUnsupported(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.New(unclaimed{memlock.NewStore().NewDriver(), func(c *backend.Capabilities) { c.Shared = false }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, acquire := range []func(context.Context, string, ...dlock.AcquireOption) (*dlock.Lease, error){l.Acquire, l.TryAcquire} {
		lease, err := acquire(ctx, "k", mode.WithShared())
		if err == nil {
			_ = lease.Release(ctx)
			t.Fatal("a shared acquire succeeded on a backend that does not claim shared locks")
		}
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("shared acquire: %v, want errors.ErrUnsupported", err)
		}
	}
	if _, err := dlock.AcquireAll(ctx, l, []string{"a", "b"}, mode.WithShared()); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("shared AcquireAll: %v, want errors.ErrUnsupported", err)
	}
	lease, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("the refused shared acquires left k held: %v", err)
	}
	_ = lease.Release(ctx)
}

// With WithReentrant, a shared acquire nests in a hold of the same key, and
// an exclusive one under a shared hold is refused with ErrUpgrade instead of
// waiting for itself.
func TestSharedReentrant(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://shared-reentrant", dlock.WithReentrant())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	err = dlock.Do(ctx, l, "k", func(ctx context.Context, r *dlock.Lease) error {
		nested, err := l.TryAcquire(ctx, "k", mode.WithShared())
		if err != nil {
			return fmt.Errorf("shared under shared: %w", err)
		}
		if nested.Token() != r.Token() || !nested.Shared() {
			t.Errorf("nested shared hold: token %v shared %v, want %v true", nested.Token(), nested.Shared(), r.Token())
		}
		_ = nested.Release(ctx)
		_, err = l.Acquire(ctx, "k")
		if !errors.Is(err, dlock.ErrUpgrade) || !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("exclusive under shared: %v, want ErrUpgrade and ErrNotAcquired", err)
		}
		return nil
	}, mode.WithShared())
	if err != nil {
		t.Fatal(err)
	}

	err = dlock.Do(ctx, l, "k", func(ctx context.Context, w *dlock.Lease) error {
		r, err := l.TryAcquire(ctx, "k", mode.WithShared())
		if err != nil {
			return fmt.Errorf("shared under exclusive: %w", err)
		}
		if r.Token() != w.Token() || r.Shared() {
			t.Errorf("shared hold nested in an exclusive one: token %v shared %v, want %v false", r.Token(), r.Shared(), w.Token())
		}
		return r.Release(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Readers share a key; a writer waits for them, and readers that come after
// a waiting writer wait behind it.
func ExampleWithShared() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://example-shared") // a Locker whose Capabilities().Shared is true
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()

	r1, _ := locker.Acquire(ctx, "config", mode.WithShared())
	r2, _ := locker.Acquire(ctx, "config", mode.WithShared())
	fmt.Println("two readers:", r1.Shared(), r2.Shared(), r2.Token() > r1.Token())

	if _, err := locker.TryAcquire(ctx, "config"); errors.Is(err, dlock.ErrNotAcquired) {
		fmt.Println("a writer must wait")
	}
	_ = r1.Release(ctx)
	_ = r2.Release(ctx)

	w, _ := locker.Acquire(ctx, "config")
	fmt.Println("writer's token is above the readers':", w.Token() > r2.Token())
	_ = w.Release(ctx)
	// Output:
	// two readers: true true true
	// a writer must wait
	// writer's token is above the readers': true
}
