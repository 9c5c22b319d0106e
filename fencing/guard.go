// Package fencing is the resource side of fencing tokens: it rejects writes
// carrying a token older than the newest it has seen.
//
// Guard checks and writes under one mutex, for in-process state; SQLGuard in
// one conditional UPDATE, for any database/sql database. Both accept a token
// equal to or above the highest seen and reject a lower one, as a guard of
// your own must, in one atomic step. Packages redisfence, zkfence and
// github.com/dlock-go/dlock/etcd/etcdfence guard Redis, ZooKeeper and etcd
// (docs/guards.md).
package fencing

import (
	"errors"
	"fmt"
	"sync"

	"github.com/dlock-go/dlock"
)

// ErrStaleToken is matched (errors.Is) by the error of a write whose token is
// older than one the guard has already accepted for the same resource.
var ErrStaleToken = errors.New("stale fencing token")

// StaleTokenError is the error a Guard returns for a stale token.
type StaleTokenError struct {
	Resource string
	Token    dlock.Token // the rejected token
	Highest  dlock.Token // the highest token accepted so far; 0 if the resource did not say
}

// Error says which token was rejected for which resource, and why.
func (e *StaleTokenError) Error() string {
	switch {
	case e.Token == 0:
		return fmt.Sprintf("fencing: resource %q: token 0 rejected (no fencing backend issues it): %v", e.Resource, ErrStaleToken)
	case e.Highest == 0:
		return fmt.Sprintf("fencing: resource %q: token %d rejected, a higher token was already accepted: %v",
			e.Resource, e.Token, ErrStaleToken)
	}
	return fmt.Sprintf("fencing: resource %q: token %d rejected, token %d was already accepted: %v",
		e.Resource, e.Token, e.Highest, ErrStaleToken)
}

// Is reports whether target is ErrStaleToken.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// Guard remembers the highest token accepted per resource, in memory. The zero
// value is ready to use, and it is safe for concurrent use.
type Guard struct {
	// OnReject, if set, is called with every rejection, after the guard's
	// lock is released: count it (package dlockotel's RejectionCounter) or
	// log it. It must not block.
	OnReject func(*StaleTokenError)

	mu      sync.Mutex
	highest map[string]dlock.Token
}

// Do runs write, under the guard's lock, if token is at least the highest
// accepted for resource, and records token as the highest even if write
// fails. A lower token, and token 0, are rejected with a *StaleTokenError.
func (g *Guard) Do(resource string, token dlock.Token, write func() error) error {
	return g.do(resource, token, false, write)
}

// Advance is like Do but also rejects a token equal to the highest accepted: each
// token may be used once per resource. Use it where every grant makes one
// write, to detect two holders that were given the same token.
func (g *Guard) Advance(resource string, token dlock.Token, write func() error) error {
	return g.do(resource, token, true, write)
}

// Highest returns the highest token accepted for resource (0 if none).
func (g *Guard) Highest(resource string) dlock.Token {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.highest[resource]
}

func (g *Guard) do(resource string, token dlock.Token, strict bool, write func() error) error {
	g.mu.Lock()
	hi := g.highest[resource]
	if token == 0 || token < hi || (strict && token == hi) {
		g.mu.Unlock()
		e := &StaleTokenError{Resource: resource, Token: token, Highest: hi}
		if g.OnReject != nil {
			g.OnReject(e)
		}
		return e
	}
	defer g.mu.Unlock()
	if g.highest == nil {
		g.highest = map[string]dlock.Token{}
	}
	g.highest[resource] = token
	if write == nil {
		return nil
	}
	return write()
}
