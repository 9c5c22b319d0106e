// Package backend is the contract between dlock's portable API and its drivers.
//
// Application code does not use this package directly, except to read
// [Capabilities]. Driver authors implement [Driver] and call [Register] from an
// init function so that dlock.Open can find them by DSN scheme.
//
// A driver stays thin: it makes one attempt per call (Refresh excepted) and
// maps the backend's answers onto the contract below; validation, the closed
// state, keepalive, loss signalling and error wrapping live once in package
// dlock. docs/DESIGN.md has the contract in a page. This package imports only
// the standard library.
package backend

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// Errors a driver returns, wrapped or as they are, so that package dlock can
// tell the cases apart with errors.Is.
var (
	// ErrHeld is returned by Driver.Acquire when req.Wait is false and another
	// owner holds the lock.
	ErrHeld = errors.New("lock held by another owner")

	// ErrNotHeld is returned by Driver.Refresh and Driver.Release when the
	// grant's owner no longer holds the lock (expired, deleted, session ended).
	ErrNotHeld = errors.New("lock no longer held by this owner")

	// ErrInvalidOption is wrapped by every error about a DSN parameter or
	// option; it is the same value as dlock.ErrInvalidOption.
	ErrInvalidOption = errors.New("invalid option")

	// ErrClosed is wrapped by every error a driver returns once Close has
	// been called (a waiting call, a second Close); it is the same value as
	// dlock.ErrClosed.
	ErrClosed = errors.New("locker closed")

	// ErrSizeMismatch is returned by Driver.Acquire for a counted request
	// when a holder of the semaphore uses another number of permits; it is
	// the same value as dlock.ErrSizeMismatch.
	ErrSizeMismatch = errors.New("holders disagree on the number of permits")
)

// MaxLabelLen is the longest AcquireRequest.Label, in bytes.
const MaxLabelLen = 128

// Driver is implemented by each backend. Every method may be called
// concurrently, for different grants and for the same key; once Close has
// been called, dlock makes no further calls.
type Driver interface {
	// Acquire asks for the lock req.Key for req.Owner and req.TTL: one attempt
	// failing with ErrHeld if req.Wait is false, else a wait (pushed where the
	// backend can) until granted or ctx is done, failing with ctx.Err(). ctx
	// bounds the wait only, and a grant racing its end must be returned or
	// removed, leaving no queue entry behind. The Grant has Key (PermitKey's
	// for a counted request), Owner, Token, Start and Validity set.
	Acquire(ctx context.Context, req AcquireRequest) (*Grant, error)

	// Refresh extends g for ttl, counted from no earlier than the call, and
	// returns the validity of the extension; it fails with ErrNotHeld if g's
	// owner no longer holds the lock, and never extends another owner's. It
	// may retry transport errors until ctx (bounded by the lease's deadline)
	// ends, and returns an error only when the lock is lost or cannot be
	// confirmed in time: any error ends the lease.
	Refresh(ctx context.Context, g *Grant, ttl time.Duration) (validity time.Duration, err error)

	// Release gives up g, conditional on g.Owner: it never removes another
	// owner's lock, and fails with ErrNotHeld if g's owner no longer held it.
	Release(ctx context.Context, g *Grant) error

	// Capabilities reports what the backend guarantees. It must return the same
	// value on every call.
	Capabilities() Capabilities

	// Close releases the driver's resources (connections, sessions,
	// goroutines); dlock releases its leases first. A call waiting in the
	// driver and a second Close fail with ErrClosed.
	Close() error
}

// AcquireRequest is the input of Driver.Acquire. dlock validates every field
// before the driver sees it.
type AcquireRequest struct {
	// Key names the lock: 1 to dlock.MaxKeyLen bytes of valid UTF-8 without
	// NUL. Drivers map it injectively: two keys never name the same lock.
	Key string

	// Owner is a random id (see NewOwnerID), unique to this lease. Refresh and
	// Release are conditional on it.
	Owner string

	// TTL is how long the backend should keep the lock if the owner stops
	// refreshing it. Always > 0.
	TTL time.Duration

	// Wait selects between one attempt (false) and waiting until granted (true).
	Wait bool

	// Label names the holder for people (dlock.WithLabel; default
	// "hostname:pid"), at most MaxLabelLen bytes of printable UTF-8; an
	// Inspector stores it where its backend has room. "" stores none.
	Label string

	// Shared asks for the lock in shared mode (package rwlock's readers; only where
	// Capabilities().Shared): granted while no one holds it exclusively and
	// no exclusive request waits. Every grant, shared or not, gets a token
	// above every earlier grant's.
	Shared bool

	// Permits, if > 0, asks for one of Permits permits of the semaphore Key,
	// in the backend's own layout (package semaphore's permits; only where
	// Capabilities().NativeSemaphore, never with Shared); 0, the default, asks for a
	// lock. The grant's Key is PermitKey(Key, slot) for a slot no other holder
	// has, its Token above every earlier grant's of that slot; a holder using
	// another number of permits fails it with ErrSizeMismatch.
	Permits int

	// Announce asks a driver whose announcements cost something per grant
	// (PostgreSQL's NOTIFY) to announce this grant, its label changes and its
	// release to Watch followers; other drivers ignore it.
	Announce bool

	// OnLost is set by dlock: a driver that learns the grant is gone before
	// its validity ends calls it with the cause, from any goroutine (the
	// alternative to Grant.Lost). It never blocks; calls after the first are
	// ignored.
	OnLost func(cause error)
}

// Grant is a lock a driver has granted. The driver fills it in; dlock reads it
// and passes it back to Refresh and Release unchanged.
type Grant struct {
	// Key and Owner echo the request; for a counted request Key is
	// PermitKey(req.Key, slot).
	Key, Owner string

	// Token is the grant's fencing token, never 0 where the driver fences;
	// under FencingStrict it is above every earlier grant's of Key, across
	// clients, releases, expiries and the restarts the backend survives.
	Token uint64

	// Start is the local time read just before the winning request was sent
	// (zero: when Acquire was called); Validity counts from it.
	Start time.Time

	// Validity is how long after Start the lock is known to be held, after any
	// allowance for clock drift (see DriftAllowance). Must be > 0.
	Validity time.Duration

	// Lost, if non-nil, is closed by the driver when the backend reports the
	// lock gone before its validity ends; dlock then ends the lease at once.
	// A driver holding many leases calls AcquireRequest.OnLost instead.
	Lost <-chan struct{}

	// Data is driver-private state (a session, a node path, a revision).
	Data any
}

// FencingLevel says how far a backend's tokens can be trusted.
type FencingLevel int

const (
	// FencingNone means the backend gives no usable token.
	FencingNone FencingLevel = iota

	// FencingTimingDependent means tokens increase as long as the backend's
	// timing assumptions hold (bounded clock drift, no restart without
	// persistence within a TTL), as with Redlock.
	FencingTimingDependent

	// FencingStrict means tokens strictly increase per key, whatever the
	// timing, through every failure the backend's durability survives.
	FencingStrict
)

// String returns "none", "timing-dependent" or "strict".
func (f FencingLevel) String() string {
	switch f {
	case FencingNone:
		return "none"
	case FencingTimingDependent:
		return "timing-dependent"
	case FencingStrict:
		return "strict"
	}
	return "FencingLevel(" + strconv.Itoa(int(f)) + ")"
}

// TimeAuthority says whose clock decides that a lease has expired.
type TimeAuthority int

const (
	// TimeServer means the server expires the lock on its own clock (Redis PX,
	// an etcd lease, a ZooKeeper session); only clock rates must agree.
	TimeServer TimeAuthority = iota

	// TimeClient means the client's clock decides validity, with bounded
	// drift between client and servers assumed (Redlock).
	TimeClient
)

// String returns "server" or "client".
func (a TimeAuthority) String() string {
	switch a {
	case TimeServer:
		return "server"
	case TimeClient:
		return "client"
	}
	return "TimeAuthority(" + strconv.Itoa(int(a)) + ")"
}

// Capabilities are a backend's guarantees; the conformance suite proves every
// one a driver claims.
type Capabilities struct {
	// Fencing is the meaning of Grant.Token.
	Fencing FencingLevel

	// FIFO is true if waiters are granted the lock in the order they started
	// waiting.
	FIFO bool

	// FaultTolerant is true if the lock survives the loss of a minority of
	// servers (consensus backends, Redlock).
	FaultTolerant bool

	// TimeAuthority says whose clock expires a lease.
	TimeAuthority TimeAuthority

	// PushWait is true if waiters are woken by the backend when the lock is
	// released (watch, pub/sub, server-side blocking) rather than by polling.
	PushWait bool

	// LossNotify is true if the backend reports a lost lock as it happens
	// (AcquireRequest.OnLost or Grant.Lost), rather than only at the next
	// refresh or at the deadline.
	LossNotify bool

	// Shared is true if the driver honours AcquireRequest.Shared in the
	// backend's own layout; elsewhere a shared acquire fails with
	// errors.ErrUnsupported.
	Shared bool

	// NativeSemaphore is true if the driver honours AcquireRequest.Permits in the
	// backend's own semaphore layout; elsewhere a counted acquire fails with
	// errors.ErrUnsupported and package semaphore uses slot locks.
	NativeSemaphore bool
}

// PermitKey returns the key of slot i of the semaphore key, key+"/permits/"+i:
// a counted grant's Key, and the slot's lock in package semaphore's layout.
func PermitKey(key string, i int) string { return key + "/permits/" + strconv.Itoa(i) }

// Named is an optional interface a Driver implements to name itself in
// dlock.New's error messages ("redis"); otherwise they name its Go type.
type Named interface {
	Name() string
}
