package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
)

// OnceOption configures a call to Once.
type OnceOption func(*onceSettings)

type onceSettings struct {
	retention time.Duration
	ttl       time.Duration
}

// WithRetention sets how long Once keeps the record of a key's completion:
// within it, a call for the key returns Done; after it, the record expires
// on the backend by itself and a call runs the work again. Default
// DefaultRetention (24h).
func WithRetention(d time.Duration) OnceOption {
	return func(s *onceSettings) { s.retention = d }
}

// WithLeaseTTL sets the TTL of the lease Once runs the work under (renewed
// while the work runs): how long others see a crashed holder's work as in
// progress. Default dlock.DefaultTTL (15s).
func WithLeaseTTL(d time.Duration) OnceOption {
	return func(s *onceSettings) { s.ttl = d }
}

func onceKey(key string) string { return "once/work/" + key }
func doneKey(key string) string { return "once/done/" + key }

// Once runs fn at most once per key across every node that calls it, for an
// idempotency key, and records its completion on the backend with the
// lease's token for the retention (WithRetention). A call that finds the
// record returns Done (with the completing run's token) without running fn;
// one that finds another holder running it returns InProgress; one whose fn
// fails, or whose lease is lost before the completion is recorded, returns
// Redo with the error: nothing is recorded and the next call runs fn again.
// Ran with a nil error means fn completed and the completion is recorded.
// Done is never returned for work that did not complete.
func Once(ctx context.Context, l dlock.Locker, key string, fn Func, opts ...OnceOption) (Result, error) {
	s := onceSettings{retention: DefaultRetention, ttl: dlock.DefaultTTL}
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	if s.retention <= 0 || s.ttl <= 0 {
		return Result{}, errorf("once", key, fmt.Errorf("%w: retention and lease TTL must be > 0", ErrInvalidJob))
	}
	if done, tok, err := recorded(ctx, l, doneKey(key)); err != nil {
		return Result{}, errorf("once", key, err)
	} else if done {
		return Result{Status: Done, Token: tok}, nil
	}
	lease, err := l.TryAcquire(ctx, onceKey(key), dlock.WithTTL(s.ttl), dlock.WithAutoRenew(true))
	if errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil {
		return Result{Status: InProgress, Holder: holderOf(ctx, l, onceKey(key))}, nil
	}
	if err != nil {
		return Result{}, errorf("once", key, err)
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
	// Under the lease: a record written by an earlier holder was written
	// while its lease was held, so before this one was granted.
	if done, tok, err := recorded(ctx, l, doneKey(key)); err != nil {
		return Result{}, errorf("once", key, err)
	} else if done {
		return Result{Status: Done, Token: tok}, nil
	}
	tok := lease.Token()
	if err := runUnder(ctx, lease, fn); err != nil {
		return Result{Status: Redo, Token: tok}, err
	}
	err = writeRecord(ctx, l, doneKey(key), recordLabel("done", tok), s.retention, lease)
	switch {
	case errors.Is(err, errRecorded):
		return Result{Status: Ran, Token: tok}, errorf("once", key, fmt.Errorf("completed, but another holder recorded it meanwhile: %w", err))
	case err != nil:
		return Result{Status: Redo, Token: tok}, errorf("once", key, fmt.Errorf("completed, but the completion could not be recorded: %w", err))
	}
	return Result{Status: Ran, Token: tok}, nil
}

// Forget deletes key's completion record before its retention ends, so that
// the next Once for key runs the work again. Records expire on the backend
// by themselves; Forget is for the rare early removal. A key with no record
// is not an error.
func Forget(ctx context.Context, l dlock.Locker, key string) error {
	if _, err := dlock.Break(ctx, l, doneKey(key)); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		return errorf("forget", key, err)
	}
	return nil
}
