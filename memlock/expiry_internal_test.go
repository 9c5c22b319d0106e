package memlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
)

// A holder whose expiry has passed is forgotten even if its timer has not
// run yet (a loaded machine runs it late): nothing sees it held, its owner
// cannot refresh it back to life, and the next Acquire gets the key.
func TestExpiredHolderForgottenBeforeItsTimer(t *testing.T) {
	ctx := context.Background()
	s := NewStore()
	d := s.NewDriver()
	defer d.Close()
	g, err := d.Acquire(ctx, backend.AcquireRequest{Key: "k", Owner: "a", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// Past its expiry, as if the hour had gone by and the timer were late.
	s.mu.Lock()
	s.locks["k"].expires = time.Now().Add(-time.Millisecond)
	s.mu.Unlock()

	if s.Held("k") {
		t.Error("Held reports an expired holder")
	}
	if in, _ := d.(backend.Inspector).Inspect(ctx, "k"); in.Held {
		t.Errorf("Inspect reports an expired holder: %+v", in)
	}
	if ins, _ := d.(backend.Inspector).List(ctx, ""); len(ins) != 0 {
		t.Errorf("List reports an expired holder: %+v", ins)
	}
	select {
	case <-g.Lost:
	default:
		t.Error("the expired holder's Lost is still open")
	}
	if _, err := d.Refresh(ctx, g, time.Hour); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Refresh after expiry: %v, want ErrNotHeld", err)
	}
	g2, err := d.Acquire(ctx, backend.AcquireRequest{Key: "k", Owner: "b", TTL: time.Hour})
	if err != nil {
		t.Fatalf("Acquire of an expired key: %v", err)
	}
	if g2.Token <= g.Token {
		t.Errorf("token %d after %d", g2.Token, g.Token)
	}
}

// An expired holder found by a touch hands the key to the first waiter.
func TestExpiredHolderHandsToWaiter(t *testing.T) {
	ctx := context.Background()
	s := NewStore()
	d := s.NewDriver()
	defer d.Close()
	if _, err := d.Acquire(ctx, backend.AcquireRequest{Key: "k", Owner: "a", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := make(chan *backend.Grant, 1)
	go func() {
		g, _ := d.Acquire(wctx, backend.AcquireRequest{Key: "k", Owner: "w", TTL: time.Hour, Wait: true})
		got <- g
	}()
	for s.Waiters("k") == 0 {
		time.Sleep(time.Millisecond) // no signal for "queued" but the count
	}
	s.mu.Lock()
	s.locks["k"].expires = time.Now().Add(-time.Millisecond)
	s.mu.Unlock()
	if _, err := d.Acquire(ctx, backend.AcquireRequest{Key: "k", Owner: "c", TTL: time.Hour}); !errors.Is(err, backend.ErrHeld) {
		t.Errorf("a try after the expiry: %v, want ErrHeld (the waiter comes first)", err)
	}
	if g := <-got; g == nil || g.Owner != "w" {
		t.Fatalf("the waiter got %+v, want the key", g)
	}
}
