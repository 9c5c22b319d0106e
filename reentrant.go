package dlock

import (
	"context"
	"errors"
	"fmt"
)

// WithReentrant makes an acquire under a ctx that carries a held lease of the
// same key on the same Locker (Do's ctx, [ContextWithLease]) a nested hold of
// it, with its token, at once; releasing the hold keeps the lock, and the
// lease's end ends it. Default off; DSN parameter "reentrant".
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

// ContextWithLease returns a copy of ctx that carries lease, for [WithReentrant];
// unlike Do's ctx, it is not cancelled when the lease ends.
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
