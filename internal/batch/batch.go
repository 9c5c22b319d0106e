// Package batch runs one call of a function for many callers: every caller
// that asks before a call starts shares that call, and calls start at most
// once per gap. The drivers use it to renew many leases with one request
// (a ZooKeeper sync, a PostgreSQL session's ping) however many renew.
package batch

import (
	"context"
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
