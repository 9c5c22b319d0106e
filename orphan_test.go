package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memlock"
)

// TestOrphanOutlivesClose: an orphaned lease ends (Done, ErrReleased) but
// its lock stays on the backend through the Locker's Close, renewed by no
// one, until its TTL runs out; a driver that cannot leave a lock to expire
// on its own refuses with errors.ErrUnsupported and the lease stays held.
func TestOrphanOutlivesClose(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore()
	a, err := dlock.New(store.NewDriver())
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 300 * time.Millisecond
	lease, err := a.TryAcquire(ctx, "record", dlock.WithTTL(ttl), dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	if err := lease.Orphan(ctx); err != nil {
		t.Fatalf("Orphan: %v", err)
	}
	<-lease.Done()
	if !errors.Is(lease.Err(), dlock.ErrReleased) {
		t.Fatalf("orphaned lease's Err: %v, want ErrReleased", lease.Err())
	}
	if err := lease.Orphan(ctx); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("second Orphan: %v, want ErrReleased", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !store.Held("record") {
		t.Fatal("the orphaned lock was released by Close")
	}
	b, err := dlock.New(store.NewDriver())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for {
		l2, err := b.TryAcquire(ctx, "record")
		if err == nil {
			if age := time.Since(granted); age < ttl-50*time.Millisecond {
				t.Fatalf("the orphaned lock freed after %v, before its TTL %v", age, ttl)
			}
			_ = l2.Release(ctx)
			break
		}
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	c, err := dlock.New(unclaimed{store.NewDriver(), func(*backend.Capabilities) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	held, err := c.TryAcquire(ctx, "session-bound")
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Orphan(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Orphan on a driver without backend.Orphaner: %v, want ErrUnsupported", err)
	}
	if err := held.Err(); err != nil {
		t.Fatalf("the lease after a refused Orphan: %v, want still held", err)
	}
}
