package dlock

import (
	"context"
	"errors"
	"fmt"
)

// Re-entrancy. Go has no thread identity, so a nested hold is scoped by a
// context: the ctx that Do passes to its function, or one returned by
// ContextWithLease. An Acquire or TryAcquire with WithReentrant under such a
// ctx, for the same key on the same Locker, returns a nested hold of the
// enclosing lease at once instead of waiting for itself. Anywhere else — a ctx
// that does not carry the lease, another Locker, another key — it waits or is
// refused as any other client would: re-entrancy never lets two independent
// callers share a lock.

// WithReentrant makes an Acquire, TryAcquire or Do re-entrant: under a ctx
// that carries a held lease of the same key on the same Locker (the ctx Do
// passes to its function, or one from ContextWithLease), it returns a nested
// hold of that lease instead of waiting for the lock.
//
// A nested hold has the enclosing lease's key, token, deadline and grant
// time; its Done is closed when it is released or when the enclosing lease
// ends, and its Err then says which. Releasing a nested hold does not release
// the lock: only releasing the outermost lease does, and that ends every hold
// nested in it (their Err matches ErrReleased). When the lease is lost, every
// hold sees the loss (Done closed, Err matching ErrLeaseLost), and a nested
// Acquire under it returns an error matching both ErrNotAcquired and
// ErrLeaseLost. Options other than WithReentrant (a TTL, say) do not apply to
// a nested hold: it takes the enclosing lease as it is.
//
// Off by default. Given to Open or New it makes every acquire of the Locker
// re-entrant; DSN parameter "reentrant" (true or false).
func WithReentrant() LeaseOption {
	return LeaseOption{func(s *settings) { s.reentrant = true }}
}

// heldKey is the context key of the leases a ctx carries.
type heldKey struct{}

// heldList is the leases a ctx carries, innermost first.
type heldList struct {
	lease *Lease
	next  *heldList
}

// ContextWithLease returns a copy of ctx that carries lease: under it, an
// Acquire or TryAcquire with WithReentrant of the lease's key on the lease's
// Locker is a nested hold of lease (see WithReentrant). Do does this for its
// function's ctx. The returned ctx is not cancelled when the lease ends; Do's
// is.
func ContextWithLease(ctx context.Context, lease *Lease) context.Context {
	if lease == nil {
		return ctx
	}
	next, _ := ctx.Value(heldKey{}).(*heldList)
	return context.WithValue(ctx, heldKey{}, &heldList{lease: lease.outermost(), next: next})
}

// LeaseFromContext returns the innermost lease ctx carries (the one Do or
// ContextWithLease put in it last), or nil if it carries none. The lease may
// have ended: its token is still what a resource must be shown.
func LeaseFromContext(ctx context.Context) *Lease {
	if h, _ := ctx.Value(heldKey{}).(*heldList); h != nil {
		return h.lease
	}
	return nil
}

// enclosing returns the outermost lease of key on l that ctx carries, or nil.
func enclosing(ctx context.Context, l *locker, key string) *Lease {
	for h, _ := ctx.Value(heldKey{}).(*heldList); h != nil; h = h.next {
		if h.lease.locker == l && h.lease.Key() == key {
			return h.lease
		}
	}
	return nil
}

// outermost returns the lease a nested hold belongs to (l itself if it is not
// nested).
func (l *Lease) outermost() *Lease {
	if l.outer != nil {
		return l.outer
	}
	return l
}

// nest returns a nested hold of l, an outermost lease, for an acquire op.
func (l *Lease) nest(op string) (*Lease, error) {
	if err := l.heldErr(op); err != nil {
		return nil, l.locker.errorf(op, l.Key(), withKind(ErrNotAcquired,
			fmt.Errorf("the enclosing lease of the key has ended: %w", err)))
	}
	n := &Lease{locker: l.locker, grant: l.grant, set: l.set, outer: l}
	l.afterEnd(n, n.signalEnd) // the enclosing lease's end ends the nested hold's Done
	return n, nil
}

// releaseNested releases a nested hold: the lock stays held by the enclosing
// lease.
func (l *Lease) releaseNested() error {
	l.mu.Lock()
	ended := l.err
	l.mu.Unlock()
	switch {
	case ended == nil:
	case errors.Is(ended, ErrReleased):
		return l.locker.errorf("release", l.Key(), ErrReleased)
	default:
		return ended // lost
	}
	if err := l.outer.heldErr("release"); err != nil {
		l.endNested(err)
		return err
	}
	l.endNested(l.locker.errorf("release", l.Key(), ErrReleased))
	return nil
}

// endNested ends a nested hold with err, unless it ended before.
func (l *Lease) endNested(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.mu.Unlock()
	l.outer.stopAfterEnd(l)
	l.signalEnd()
}

// nestedErr is Err for a nested hold: its own end if it was released,
// else the enclosing lease's.
func (l *Lease) nestedErr() error {
	if err := l.outer.Err(); err != nil {
		l.endNested(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
