package dlock

import (
	"context"
	"errors"
	"time"
)

// Observer receives the events of a Locker's leases, for metrics, traces and
// logs: package github.com/dlock-go/dlock/dlockotel implements it with
// OpenTelemetry, and WithLogger with log/slog. Set it with WithObserver. A
// Locker without one pays a nil check per event.
//
// Its methods, and those of the values it returns, are called from the
// Locker's goroutines and the callers' (concurrently for different leases)
// and must not block.
type Observer interface {
	// StartAcquire is called when an Acquire or TryAcquire begins (after its
	// arguments were checked). It returns the ctx the acquire goes on with
	// (one carrying a span, say) and a function that is called once with the
	// outcome; for a granted lease that function returns the lease's
	// observer, or nil.
	StartAcquire(ctx context.Context, a AcquireInfo) (context.Context, func(AcquireOutcome) LeaseObserver)
}

// LeaseObserver receives the events of one lease.
type LeaseObserver interface {
	// Renewed is called after each renewal (auto-renew or Refresh), with how
	// long it took and its error (nil if it succeeded).
	Renewed(took time.Duration, err error)

	// StartRelease is called when Release begins talking to the backend; the
	// function it returns is called with Release's error.
	StartRelease(ctx context.Context) (context.Context, func(err error))

	// Ended is called once, when the lease ends, before its Done channel
	// is closed.
	Ended(e LeaseEnd)
}

// AcquireInfo describes an acquire as it begins.
type AcquireInfo struct {
	Backend string // the DSN scheme or driver name
	Key     string
	Wait    bool // Acquire (true) or TryAcquire (false)
}

// AcquireOutcome is how an acquire ended.
type AcquireOutcome struct {
	Result Result        // granted, not-acquired, cancelled or error
	Token  Token         // the granted lease's token (0 unless granted)
	Took   time.Duration // from the start of the acquire, wait included
	Err    error         // nil if granted
}

// Result classifies the outcome of an acquire.
type Result string

// The results of an acquire.
const (
	ResultGranted     Result = "granted"      // a lease was granted
	ResultNotAcquired Result = "not-acquired" // held by another owner (TryAcquire), or the wait's ctx deadline passed
	ResultCancelled   Result = "cancelled"    // the wait's ctx was cancelled, or the Locker closed
	ResultError       Result = "error"        // the backend failed
)

// LeaseEnd says how a lease ended.
type LeaseEnd struct {
	Lost  bool          // lost (true) or released
	Cause LossCause     // why it was lost ("" if released)
	Held  time.Duration // from the grant to the end
	Err   error         // the lease's Err
}

// LossCause classifies why a lease was lost.
type LossCause string

// The causes of a lost lease.
const (
	LossRenewalFailed   LossCause = "renewal-failed"   // a renewal failed, or could not finish before the deadline
	LossDeadlinePassed  LossCause = "deadline-passed"  // the deadline passed without a renewal (auto-renew off, a pause)
	LossBackendReported LossCause = "backend-reported" // the backend said the lock is gone (expired, broken, session ended)
)

// WithObserver sets the Locker's Observer (see Observer); it is a Locker
// option only. Default none.
func WithObserver(o Observer) Option {
	return lockerOption(func(s *settings) { s.observer = o })
}

// resultOf classifies an acquire's error.
func resultOf(ctx context.Context, err error) Result {
	switch {
	case err == nil:
		return ResultGranted
	case errors.Is(err, ErrClosed), errors.Is(err, context.Canceled):
		return ResultCancelled
	case errors.Is(err, ErrNotAcquired), ctx.Err() != nil:
		return ResultNotAcquired
	}
	return ResultError
}

// observers returns the Observer of settings s: WithObserver's, WithLogger's,
// both, or nil.
func (s settings) observers() Observer {
	var log Observer
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
type twoObservers struct{ a, b Observer }

func (o *twoObservers) StartAcquire(ctx context.Context, a AcquireInfo) (context.Context, func(AcquireOutcome) LeaseObserver) {
	ctx, da := o.a.StartAcquire(ctx, a)
	ctx, db := o.b.StartAcquire(ctx, a)
	return ctx, func(out AcquireOutcome) LeaseObserver {
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

type twoLeaseObservers struct{ a, b LeaseObserver }

func (o *twoLeaseObservers) Renewed(took time.Duration, err error) {
	o.a.Renewed(took, err)
	o.b.Renewed(took, err)
}

func (o *twoLeaseObservers) StartRelease(ctx context.Context) (context.Context, func(error)) {
	ctx, fa := o.a.StartRelease(ctx)
	ctx, fb := o.b.StartRelease(ctx)
	return ctx, func(err error) { fa(err); fb(err) }
}

func (o *twoLeaseObservers) Ended(e LeaseEnd) {
	o.a.Ended(e)
	o.b.Ended(e)
}
