package dlock

import (
	"context"
	"errors"
)

// Do acquires key as Acquire does, runs fn, and releases the lease even once
// ctx is done. fn's ctx carries the lease ([WithReentrant]) and is cancelled,
// with a cause matching [ErrLeaseLost], when the lease is lost. Do returns fn's
// error joined with the release's: ErrLeaseLost means fn ran, maybe not alone.
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
