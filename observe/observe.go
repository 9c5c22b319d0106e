// Package observe is what a dlock.Locker tells an observer of its leases,
// for metrics, traces and logs: an [Observer] given to dlock.WithObserver
// receives every acquire and, through the [LeaseObserver] it returns, every
// renewal, release and end of the lease granted. Package
// github.com/dlock-go/dlock/dlockotel implements it with OpenTelemetry, and
// dlock.WithLogger with log/slog.
//
// This package imports only the standard library; its types name tokens
// and keys with plain types (uint64, string).
package observe

import (
	"context"
	"time"
)

// Observer receives the events of a Locker's leases. A Locker without one
// pays a nil check per event.
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
	Token  uint64        // the granted lease's fencing token (dlock.Token; 0 unless granted)
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
