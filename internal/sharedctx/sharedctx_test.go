package sharedctx

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

type key struct{}

func TestSharesOneDeadline(t *testing.T) {
	const d = 8 * time.Second
	b := New(d)
	defer b.Stop()
	before := time.Now()
	c1, cancel1 := b.Context(context.Background())
	defer cancel1()
	c2, cancel2 := b.Context(context.WithValue(context.Background(), key{}, "v"))
	defer cancel2()
	dl, ok := c1.Deadline()
	if !ok {
		t.Fatal("no deadline")
	}
	if dl.Before(before.Add(d)) || dl.After(time.Now().Add(d+d/8)) {
		t.Fatalf("deadline %v from now, want between %v and %v", time.Until(dl), d, d+d/8)
	}
	if c1.Done() != c2.Done() {
		t.Fatal("two calls a moment apart do not share their deadline")
	}
	if got := c2.Value(key{}); got != "v" {
		t.Fatalf("Value = %v, want the parent's", got)
	}
	if c1.Value(key{}) != nil {
		t.Fatal("a value leaked from one call's parent into another's")
	}
}

func TestAtLeastTheBound(t *testing.T) {
	const d = 80 * time.Millisecond
	b := New(d)
	defer b.Stop()
	first, cancel := b.Context(context.Background())
	defer cancel()
	time.Sleep(d/8 + 5*time.Millisecond) // past the reuse window: the next call gets a new deadline
	start := time.Now()
	c, cancel := b.Context(context.Background())
	defer cancel()
	if c.Done() == first.Done() {
		t.Fatal("a call after the reuse window got the old deadline")
	}
	<-c.Done()
	if took := time.Since(start); took < d {
		t.Fatalf("ended after %v, want at least %v", took, d)
	}
	if !errors.Is(c.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(c), context.DeadlineExceeded) {
		t.Fatalf("Err %v, Cause %v: want DeadlineExceeded", c.Err(), context.Cause(c))
	}
}

func TestCancellableParentKeepsItsOwn(t *testing.T) {
	b := New(time.Hour)
	defer b.Stop()
	parent, cancelParent := context.WithCancel(context.Background())
	c, cancel := b.Context(parent)
	defer cancel()
	if dl, ok := c.Deadline(); !ok || time.Until(dl) > time.Hour {
		t.Fatalf("deadline %v %v, want within the bound", dl, ok)
	}
	cancelParent()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling the parent did not end the context")
	}
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("Err %v, want Canceled", c.Err())
	}
}

// A context derived from a bounded one follows the shared deadline through
// package context's own bookkeeping, not through a goroutine per child.
func TestChildrenFollowWithoutGoroutines(t *testing.T) {
	const d = 100 * time.Millisecond
	b := New(d)
	defer b.Stop()
	c, cancel := b.Context(context.WithoutCancel(context.Background()))
	defer cancel()
	base := runtime.NumGoroutine()
	var children []context.Context
	for range 50 {
		child, cancel := context.WithCancel(c)
		defer cancel()
		stop := context.AfterFunc(c, func() {})
		defer stop()
		children = append(children, child)
	}
	if n := runtime.NumGoroutine(); n > base {
		t.Fatalf("50 children started %d goroutines", n-base)
	}
	for _, child := range children {
		<-child.Done()
		if !errors.Is(context.Cause(child), context.DeadlineExceeded) {
			t.Fatalf("child's cause %v, want DeadlineExceeded", context.Cause(child))
		}
	}
}

func TestStopEndsTheCurrentAndStartsAfresh(t *testing.T) {
	b := New(time.Hour)
	c, cancel := b.Context(context.Background())
	defer cancel()
	b.Stop()
	select {
	case <-c.Done():
	default:
		t.Fatal("Stop left the shared context running")
	}
	c2, cancel2 := b.Context(context.Background())
	defer cancel2()
	defer b.Stop()
	if c2.Err() != nil {
		t.Fatalf("a context after Stop: %v", c2.Err())
	}
}

// TestBackgroundAllocatesNothing checks that a context over
// context.Background, the release's most common parent, is the shared
// context itself: a release pays no allocation for it.
func TestBackgroundAllocatesNothing(t *testing.T) {
	b := New(time.Hour)
	defer b.Stop()
	if n := testing.AllocsPerRun(100, func() {
		_, cancel := b.Context(context.Background())
		cancel()
	}); n != 0 {
		t.Errorf("Context(context.Background()) made %v allocations, want 0", n)
	}
}

// TestContextAtCountsFromNow checks that ContextAt bounds the call from the
// time its caller read.
func TestContextAtCountsFromNow(t *testing.T) {
	const d = 8 * time.Second
	b := New(d)
	defer b.Stop()
	now := time.Now()
	c, cancel := b.ContextAt(context.Background(), now)
	defer cancel()
	after := time.Now()
	dl, ok := c.Deadline()
	if !ok || dl.Before(now.Add(d)) || dl.After(after.Add(d+d/8)) {
		t.Fatalf("deadline now+%v (%v), want within [now+%v, now+%v]", dl.Sub(now), ok, d, after.Sub(now)+d+d/8)
	}
}
