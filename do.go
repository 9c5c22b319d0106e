package dlock

import (
	"context"
	"errors"
)

// Do acquires key (waiting as Acquire does, bounded by ctx), runs fn while
// holding the lease, and releases it.
//
// fn's ctx is a child of ctx that is also cancelled, with the lease's error as
// its cause (context.Cause matches ErrLeaseLost), the moment the lease is lost:
// stop writing when it is done. Pass lease.Token() to the resource with every
// write.
//
// Do returns fn's error if fn fails. If fn succeeds but the lease was lost
// meanwhile, Do returns an error matching ErrLeaseLost: the work ran, but not
// necessarily exclusively. Release runs even if ctx is done, on a detached,
// bounded context (see WithReleaseTimeout).
//
// fn's ctx carries the lease: under it, an Acquire, TryAcquire or Do with
// WithReentrant of the same key on the same Locker is a nested hold of the
// lease instead of a wait for itself (see WithReentrant).
func Do(ctx context.Context, l Locker, key string, fn func(ctx context.Context, lease *Lease) error, opts ...AcquireOption) error {
	lease, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ContextWithLease(ctx, lease))
	var mine byte // Do's own key for afterEnd
	lease.afterEnd(&mine, func() { cancel(lease.Err()) })
	fnErr := fn(fctx, lease)
	lease.stopAfterEnd(&mine)
	cancel(nil)

	relErr := lease.Release(ctx)
	if errors.Is(relErr, ErrReleased) {
		relErr = nil // fn released it itself
	}
	switch {
	case fnErr == nil:
		return relErr
	case relErr == nil:
		return fnErr
	default:
		return errors.Join(fnErr, relErr)
	}
}
