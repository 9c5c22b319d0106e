// Package mode gives the packages of this repository the acquire modes that
// dlock's API keeps to itself: a shared acquire, for package rwlock, and a
// counted one, for package semaphore, each in the backend's own layout. An
// application reaches them through those packages. They are acquire options
// (dlock.AcquireOption): given to Open or New they do not compile.
package mode

import (
	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/mode/hook"
)

// WithShared makes an acquire take the lock in shared mode, in the backend's
// own layout (PostgreSQL's pg_advisory_lock_shared, say): any number of
// shared holders at once, none while an exclusive holder (an acquire without
// WithShared) holds the key, and none while an exclusive acquire waits for
// it, so that a stream of shared holders never starves a writer. A shared
// lease is a lease like any other — renewed, lost loudly, expired by the
// backend if its holder vanishes — and its token is above every earlier
// grant's of the key, shared or not, and below every later one's
// (dlock.Lease.Shared reports the mode).
//
// Only a Locker whose Capabilities().Shared is true can: others refuse it
// with an error matching errors.ErrUnsupported. AcquireAll with WithShared
// takes the keys one at a time, in sorted order. With dlock.WithReentrant, a
// shared acquire under a ctx that carries a hold of the same key is a nested
// hold of it; an exclusive acquire under a shared hold of the same key is
// refused with dlock.ErrUpgrade.
func WithShared() dlock.AcquireOption { return hook.Shared().(dlock.AcquireOption) }

// WithPermits makes an acquire take one of n permits of the semaphore key,
// in the backend's own semaphore layout, rather than the lock key: up to n
// holders at once, counting other clients of that layout. The lease's Key is
// the key of the slot the backend gave it, key + "/permits/" + i with
// 0 ≤ i < n, and its Token is strictly greater than every earlier holder's
// of that slot. Every holder must use the same n: an acquire that finds a
// holder using another is refused with dlock.ErrSizeMismatch where the
// layout records it.
//
// Only a Locker whose Capabilities().NativeSemaphore is true can: others
// refuse it with an error matching errors.ErrUnsupported. n must be > 0 and
// it cannot be combined with WithShared (errors matching
// dlock.ErrInvalidOption); a counted acquire is never a nested hold
// (dlock.WithReentrant).
func WithPermits(n int) dlock.AcquireOption { return hook.Permits(n).(dlock.AcquireOption) }
