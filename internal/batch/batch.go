// Package batch runs one call of a function for many callers: every caller
// that asks before a call starts shares that call, and calls start at most
// once per gap. The drivers use it to renew many leases with one request
// (a ZooKeeper sync, a PostgreSQL session's ping, etcd's check that the
// holders' keys still exist) however many renew.
package batch

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Group runs f for its callers; its zero value is not usable (use New).
type Group struct {
	gap time.Duration
	f   func() error
	wg  *sync.WaitGroup

	mu   sync.Mutex
	next *call     // collecting callers; nil when none waits
	last time.Time // when the previous call started
}

type call struct {
	done    chan struct{} // closed once f returned
	started time.Time
	err     error
}

// New returns a Group that calls f, starting calls at least gap apart. Each
// call runs in a goroutine counted in wg, so that its owner can wait for it.
func New(gap time.Duration, wg *sync.WaitGroup, f func() error) *Group {
	return &Group{gap: gap, f: f, wg: wg}
}

// Do returns the error of a call of f that started after Do was called, and
// when it started; or ctx's error if ctx ends first (the call goes on for the
// others). A caller waits at most gap plus the call for its turn.
func (g *Group) Do(ctx context.Context) (time.Time, error) {
	g.mu.Lock()
	c := g.next
	if c == nil {
		c = &call{done: make(chan struct{})}
		g.next = c
		wait := time.Until(g.last.Add(g.gap))
		g.wg.Add(1)
		go g.run(c, wait) // owned by wg's owner
	}
	g.mu.Unlock()
	select {
	case <-c.done:
		return c.started, c.err
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

func (g *Group) run(c *call, wait time.Duration) {
	defer g.wg.Done()
	defer close(c.done)
	if wait > 0 {
		time.Sleep(wait)
	}
	g.mu.Lock()
	g.next = nil // callers from now on wait for the next call
	c.started = time.Now()
	g.last = c.started
	g.mu.Unlock()
	c.err = g.f()
}

// Batcher is Group with an item from each caller: one call of f gets the
// items of every caller that asked before it started, and returns a result
// for each, in order.
type Batcher[T, R any] struct {
	gap time.Duration
	f   func([]T) ([]R, error)
	wg  *sync.WaitGroup

	mu   sync.Mutex
	next *batchCall[T, R]
	last time.Time
}

type batchCall[T, R any] struct {
	done    chan struct{}
	items   []T
	results []R
	err     error
}

// NewBatcher returns a Batcher that calls f, starting calls at least gap
// apart, each in a goroutine counted in wg. f must return one result per
// item, or an error.
func NewBatcher[T, R any](gap time.Duration, wg *sync.WaitGroup, f func([]T) ([]R, error)) *Batcher[T, R] {
	return &Batcher[T, R]{gap: gap, f: f, wg: wg}
}

// Do adds item to a call of f that has not started yet and returns its
// result, or ctx's error if ctx ends first.
func (b *Batcher[T, R]) Do(ctx context.Context, item T) (R, error) {
	b.mu.Lock()
	c := b.next
	if c == nil {
		c = &batchCall[T, R]{done: make(chan struct{})}
		b.next = c
		wait := time.Until(b.last.Add(b.gap))
		b.wg.Add(1)
		go b.run(c, wait) // owned by wg's owner
	}
	i := len(c.items)
	c.items = append(c.items, item)
	b.mu.Unlock()
	var zero R
	select {
	case <-c.done:
		if c.err != nil {
			return zero, c.err
		}
		return c.results[i], nil
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

func (b *Batcher[T, R]) run(c *batchCall[T, R], wait time.Duration) {
	defer b.wg.Done()
	defer close(c.done)
	if wait > 0 {
		time.Sleep(wait)
	}
	b.mu.Lock()
	b.next = nil
	b.last = time.Now()
	items := c.items
	b.mu.Unlock()
	c.results, c.err = b.f(items)
	if c.err == nil && len(c.results) != len(items) {
		c.err = fmt.Errorf("batch: %d results for %d items", len(c.results), len(items))
	}
}
