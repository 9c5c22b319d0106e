package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule/internal/hook"
)

// recorded reports whether key's record exists on l's backend, and the
// token it names.
func recorded(ctx context.Context, l dlock.Locker, key string) (bool, dlock.Token, error) {
	if hook.BreakRecordCheck {
		return false, 0, nil
	}
	info, err := dlock.Inspect(ctx, l, key)
	if err != nil {
		return false, 0, err
	}
	return info.Held, parseRecord(info.Label), nil
}

// errRecorded means a record exists where writeRecord was to write one.
var errRecorded = errors.New("a record exists")

// writeRecord stores key's record, labelled label, for retention: a lock
// taken with that TTL and orphaned, so that it outlives this process and
// nobody renews it. If holder is not nil, the record stays only if the
// backend confirms (holder.Refresh) that holder's lease was still held once
// the record was granted: then a node that takes holder's key after it
// finds the record. It returns errRecorded if a
// record exists.
func writeRecord(ctx context.Context, l dlock.Locker, key, label string, retention time.Duration, holder *dlock.Lease) error {
	rec, err := l.TryAcquire(ctx, key, dlock.WithTTL(retention), dlock.WithAutoRenew(false), dlock.WithLabel(label))
	if errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil {
		if hook.BreakRecordCheck {
			return nil
		}
		return fmt.Errorf("%w: %w", errRecorded, err)
	}
	if err != nil {
		return err
	}
	if holder != nil {
		// The backend confirms that holder still held its key after the
		// record was granted: a node granted the key later finds the
		// record. If not (the lease expired, or was broken, before),
		// another node may hold the key and be doing the work.
		if err := holder.Refresh(ctx); err != nil {
			_ = rec.Release(context.WithoutCancel(ctx))
			return err
		}
	}
	if err := rec.Orphan(ctx); err != nil {
		_ = rec.Release(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

// runUnder runs fn under lease, with a ctx that carries the lease and is
// cancelled, with the lease's error as its cause, when the lease ends.
func runUnder(ctx context.Context, lease *dlock.Lease, fn Func) error {
	fctx, cancel := context.WithCancelCause(dlock.ContextWithLease(ctx, lease))
	defer cancel(nil)
	go func() {
		select {
		case <-lease.Done():
			cancel(lease.Err())
		case <-fctx.Done():
		}
	}()
	return fn(fctx, lease)
}

// holderOf reports the label of key's holder, "" if unknown.
func holderOf(ctx context.Context, l dlock.Locker, key string) string {
	info, err := dlock.Inspect(ctx, l, key)
	if err != nil {
		return ""
	}
	return info.Label
}
