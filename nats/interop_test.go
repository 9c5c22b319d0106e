package nats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	dlocknats "github.com/dlock-go/dlock/nats"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestInteropRawCreate: a plain nats.go client taking the same key with the
// key-value store's create-only write excludes dlock's holders and is
// excluded by them, and a dlock waiter is woken when it deletes the key.
func TestInteropRawCreate(t *testing.T) {
	h := startHarness(t)
	ctx := testCtx(t)
	l := h.NewLocker(t)
	const key = "interop/raw create.1"
	name := dlocknats.KeyName(key)

	// dlock holds: the raw create is refused.
	lease, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.kv.Create(ctx, name, []byte("raw"), jetstream.KeyTTL(time.Minute)); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("raw Create while dlock holds %q: %v, want ErrKeyExists", name, err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The raw client holds: dlock is refused, and a waiter gets the lock
	// once the raw client deletes its key.
	rev, err := h.kv.Create(ctx, name, []byte("raw"), jetstream.KeyTTL(time.Minute))
	if err != nil {
		t.Fatalf("raw Create after dlock released: %v", err)
	}
	if _, err := l.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while a raw client holds %q: %v, want ErrNotAcquired", name, err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		lease, err := l.Acquire(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	for end := time.Now().Add(10 * time.Second); h.Waiters(t, key) < 1; {
		if time.Now().After(end) {
			t.Fatal("no waiter counted 10s after Acquire began")
		}
		time.Sleep(10 * time.Millisecond) // polling the server: no signal to wait for
	}
	deleted := time.Now()
	if err := h.kv.Delete(ctx, name, jetstream.LastRevision(rev)); err != nil {
		t.Fatal(err)
	}
	lease = <-got
	if lease == nil {
		t.FailNow()
	}
	if took := time.Since(deleted); took > time.Second {
		t.Errorf("the waiter got the lock %v after the raw client's delete, want a push", took)
	}
	if uint64(lease.Token()) <= rev {
		t.Errorf("token %d after the raw holder's revision %d", lease.Token(), rev)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLossOnRawWrite: a holder learns at once that another client took its
// key (a purge, then a create of its own), ending the lease with ErrLeaseLost.
func TestLossOnRawWrite(t *testing.T) {
	h := startHarness(t)
	ctx := testCtx(t)
	l := h.NewLocker(t)
	const key = "interop/taken"
	lease, err := l.Acquire(ctx, key, dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	taken := time.Now()
	if err := h.kv.Purge(ctx, dlocknats.KeyName(key)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.kv.Create(ctx, dlocknats.KeyName(key), []byte("raw")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease not ended 5s after its key was taken (TTL 30s)")
	}
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Errorf("lease.Err() = %v, want ErrLeaseLost", lease.Err())
	}
	t.Logf("lease ended %v after its key was taken", time.Since(taken))
}

// TestStaleGrantCannotTouchNewHolder drives the driver directly, with no
// loss signal to stop it: once a grant's key was purged and taken by
// another client, the grant's Refresh and Release fail with ErrNotHeld and
// leave the new holder's key as it was.
func TestStaleGrantCannotTouchNewHolder(t *testing.T) {
	h := startHarness(t)
	ctx := testCtx(t)
	nc, err := natsgo.Connect(h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	d, err := dlocknats.NewDriver(ctx, nc, &dlocknats.Options{Bucket: testBucket})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const key = "stale/grant"
	name := dlocknats.KeyName(key)
	g, err := d.Acquire(ctx, backend.AcquireRequest{Key: key, Owner: backend.NewOwnerID(), TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Refresh(ctx, g, 30*time.Second); err != nil {
		t.Fatalf("Refresh of the holder: %v", err)
	}
	if err := h.kv.Purge(ctx, name); err != nil {
		t.Fatal(err)
	}
	rev, err := h.kv.Create(ctx, name, []byte("new holder"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Refresh(ctx, g, 30*time.Second); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("stale Refresh: %v, want ErrNotHeld", err)
	}
	if err := d.Release(ctx, g); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("stale Release: %v, want ErrNotHeld", err)
	}
	e, err := h.kv.Get(ctx, name)
	if err != nil {
		t.Fatalf("the new holder's key after the stale calls: %v", err)
	}
	if e.Revision() != rev || string(e.Value()) != "new holder" {
		t.Errorf("the new holder's key is at revision %d (%q), want %d (%q)", e.Revision(), e.Value(), rev, "new holder")
	}
}
