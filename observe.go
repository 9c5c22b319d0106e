package dlock

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-go/dlock/observe"
)

// WithObserver sets the Locker's [observe.Observer], which sees every acquire,
// renewal, release and end of its leases. Default none.
func WithObserver(o observe.Observer) Option {
	return lockerOption(func(s *settings) { s.observer = o })
}

// resultOf classifies an acquire's error.
func resultOf(ctx context.Context, err error) observe.Result {
	switch {
	case err == nil:
		return observe.ResultGranted
	case errors.Is(err, ErrClosed), errors.Is(err, context.Canceled):
		return observe.ResultCancelled
	case errors.Is(err, ErrNotAcquired), ctx.Err() != nil:
		return observe.ResultNotAcquired
	}
	return observe.ResultError
}

// observers returns the observe.Observer of settings s: WithObserver's, WithLogger's,
// both, or nil.
func (s settings) observers() observe.Observer {
	var log observe.Observer
	if s.logger != nil {
		log = &slogObserver{log: s.logger, keys: s.logKeys}
	}
	switch {
	case s.observer == nil:
		return log
	case log == nil:
		return s.observer
	}
	return &twoObservers{s.observer, log}
}

// twoObservers tells two Observers every event.
type twoObservers struct{ a, b observe.Observer }

func (o *twoObservers) StartAcquire(ctx context.Context, a observe.AcquireInfo) (context.Context, func(observe.AcquireOutcome) observe.LeaseObserver) {
	ctx, da := o.a.StartAcquire(ctx, a)
	ctx, db := o.b.StartAcquire(ctx, a)
	return ctx, func(out observe.AcquireOutcome) observe.LeaseObserver {
		la, lb := da(out), db(out)
		switch {
		case la == nil:
			return lb
		case lb == nil:
			return la
		}
		return &twoLeaseObservers{la, lb}
	}
}

type twoLeaseObservers struct{ a, b observe.LeaseObserver }

func (o *twoLeaseObservers) Renewed(took time.Duration, err error) {
	o.a.Renewed(took, err)
	o.b.Renewed(took, err)
}

func (o *twoLeaseObservers) StartRelease(ctx context.Context) (context.Context, func(error)) {
	ctx, fa := o.a.StartRelease(ctx)
	ctx, fb := o.b.StartRelease(ctx)
	return ctx, func(err error) { fa(err); fb(err) }
}

func (o *twoLeaseObservers) Ended(e observe.LeaseEnd) {
	o.a.Ended(e)
	o.b.Ended(e)
}
