// Package backend is the contract between dlock's portable API and its drivers.
//
// Application code does not use this package directly, except to read
// [Capabilities]. Driver authors implement [Driver] and call [Register] from an
// init function so that dlock.Open can find them by DSN scheme.
//
// A driver stays thin: it makes one attempt per call (Refresh excepted, see
// there) and maps the backend's answers onto the contract below. Everything users see — key and option
// validation, the closed state, keepalive, lease-loss signalling, error wrapping —
// lives once in package dlock.
//
// This package imports only the standard library.
package backend

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// Errors a driver returns so that package dlock can tell the cases apart. Drivers
// wrap them (fmt.Errorf("...: %w", backend.ErrHeld)) or return them as they are;
// dlock matches them with errors.Is.
var (
	// ErrHeld is returned by Driver.Acquire when req.Wait is false and another
	// owner holds the lock.
	ErrHeld = errors.New("lock held by another owner")

	// ErrNotHeld is returned by Driver.Refresh and Driver.Release when the grant's
	// owner no longer holds the lock: it expired, was deleted behind the driver's
	// back, or the session that held it ended.
	ErrNotHeld = errors.New("lock no longer held by this owner")

	// ErrInvalidOption is wrapped by every error about a DSN parameter or
	// option (Params.Done returns one). It is the same value as
	// dlock.ErrInvalidOption, so applications match either.
	ErrInvalidOption = errors.New("invalid option")

	// ErrClosed is wrapped by every error a driver returns once Close has
	// been called: a call that was waiting when Close came, and a second
	// Close. It is the same value as dlock.ErrClosed.
	ErrClosed = errors.New("locker closed")

	// ErrSizeMismatch is returned by Driver.Acquire for a counted request
	// (AcquireRequest.Permits) when a holder of the semaphore uses another
	// number of permits. It is the same value as dlock.ErrSizeMismatch.
	ErrSizeMismatch = errors.New("holders disagree on the number of permits")
)

// MaxLabelLen is the longest AcquireRequest.Label, in bytes.
const MaxLabelLen = 128

// Driver is implemented by each backend. Package dlock serialises nothing on a
// driver's behalf: every method may be called concurrently from many goroutines,
// for different grants and for the same key.
//
// Once Close has been called, dlock makes no further calls to the driver.
type Driver interface {
	// Acquire asks for the lock req.Key on behalf of req.Owner for req.TTL.
	//
	// If req.Wait is false it makes one attempt and returns an error wrapping
	// ErrHeld if another owner holds the lock. If req.Wait is true it waits,
	// push-based where the backend allows, until the lock is granted or ctx is
	// done; then it returns an error wrapping ctx.Err().
	//
	// ctx bounds the wait only. The lock, once granted, lives until it is
	// released, expires, or its session ends. If ctx is done while a grant is in
	// flight, the driver must not leave the grant or any queue entry behind: it
	// either returns the grant or removes it before returning the error.
	//
	// On success the returned Grant is non-nil and its Key, Owner, Token, Start
	// and Validity are set. For a counted request (req.Permits > 0) its Key
	// names the permit's slot (PermitKey).
	Acquire(ctx context.Context, req AcquireRequest) (*Grant, error)

	// Refresh extends g for ttl, measured from a moment no earlier than the call.
	// It returns the validity of the extension, which dlock adds to the time it
	// called Refresh to compute the lease's new deadline. It returns an error
	// wrapping ErrNotHeld if g's owner no longer holds the lock; it never extends
	// a lock held by another owner.
	//
	// Unlike the other methods, Refresh may retry transport errors (on another
	// member of a cluster, say) until ctx is done: dlock's keepalive bounds ctx by
	// the lease's deadline, so a retry can never extend belief in the lease past
	// the time the backend may have dropped it. Since dlock ends the lease on any
	// error from its keepalive's Refresh, return one only when the lock is known
	// lost or cannot be confirmed before ctx ends.
	Refresh(ctx context.Context, g *Grant, ttl time.Duration) (validity time.Duration, err error)

	// Release gives up g. It is conditional on g.Owner: it never removes a lock
	// held by another owner, and returns an error wrapping ErrNotHeld if g's owner
	// no longer held the lock.
	Release(ctx context.Context, g *Grant) error

	// Capabilities reports what the backend guarantees. It must return the same
	// value on every call.
	Capabilities() Capabilities

	// Close releases the driver's resources (connections, sessions, goroutines).
	// dlock releases every lease it knows of before calling Close, and calls
	// it once. A call waiting in the driver when Close comes returns an error
	// wrapping ErrClosed; so does a second Close, which does nothing else.
	Close() error
}

// AcquireRequest is the input of Driver.Acquire. dlock validates every field
// before the driver sees it.
type AcquireRequest struct {
	// Key names the lock: 1 to dlock.MaxKeyLen bytes of valid UTF-8 without NUL.
	// Drivers map it onto their backend's namespace injectively: two different
	// keys never name the same lock.
	Key string

	// Owner is a random id (see NewOwnerID), unique to this lease. Refresh and
	// Release are conditional on it.
	Owner string

	// TTL is how long the backend should keep the lock if the owner stops
	// refreshing it. Always > 0.
	TTL time.Duration

	// Wait selects between one attempt (false) and waiting until granted (true).
	Wait bool

	// Label names the holder for people (dlock.WithLabel; by default
	// "hostname:pid"): a driver that implements Inspector stores it with the
	// grant where its backend has room, and reports it in LockInfo.Label. It
	// is at most MaxLabelLen bytes of printable UTF-8; "" stores none.
	Label string

	// Shared asks for the lock in shared mode (package rwlock's readers): any number
	// of shared holders at once, never alongside an exclusive holder. An
	// exclusive request (Shared false) excludes every shared holder. dlock
	// sets it only for a driver whose Capabilities().Shared is true. Such a
	// driver grants a shared request neither while the lock is held
	// exclusively nor while an exclusive request waits for it (a writer is not
	// starved by a stream of readers), and gives every grant, shared or not, a
	// token above every earlier grant's, as Capabilities().Fencing says.
	Shared bool

	// Permits, if > 0, makes the request a counted one (package semaphore's permits):
	// Key names a semaphore of Permits permits, not a lock, and the request is
	// for one permit of it, in the backend's own semaphore layout, so that
	// other clients of that layout interoperate. The driver grants it while
	// fewer than Permits holders (its own and other clients') hold a permit,
	// and picks the permit's slot: an index in [0, Permits) that no other
	// holder of the driver's layout holds at the time. The grant's Key is
	// PermitKey(Key, slot), and its Token is strictly greater than every
	// earlier grant's of that slot (FencingStrict). If a holder uses another
	// number of permits it returns an error wrapping ErrSizeMismatch, where
	// the layout records the number. dlock sets Permits only for a driver
	// whose Capabilities().NativeSemaphore is true, never together with Shared.
	// 0, the default, asks for a lock.
	Permits int

	// Announce asks the driver to announce this grant, the changes of its
	// label and its release to Watch followers of Key where announcing costs
	// the backend something per grant (PostgreSQL's NOTIFY). A driver that
	// announces every change anyway, or has no Watch, ignores it.
	Announce bool

	// OnLost is set by dlock. A driver that learns the lock granted by this
	// Acquire is gone before its validity ends (a session expired, a watch saw
	// the key deleted, the connection holding it died) calls OnLost with the
	// cause, from whatever goroutine learned it: one watcher serving many
	// grants needs no goroutine per grant. OnLost never blocks; calls after the
	// first, and calls for a grant that was never returned, are ignored. It is
	// the goroutine-free alternative to Grant.Lost: a driver uses one or the
	// other.
	OnLost func(cause error)
}

// Grant is a lock a driver has granted. The driver fills it in; dlock reads it
// and passes it back to Refresh and Release unchanged.
type Grant struct {
	// Key and Owner echo the request; for a counted request Key is
	// PermitKey(req.Key, slot).
	Key, Owner string

	// Token is the fencing token of this grant: for a driver that claims
	// FencingStrict it is strictly greater than the token of every earlier grant
	// of Key, across all clients, releases, expiries and server restarts the
	// backend survives. It is never 0 when the driver fences at all.
	Token uint64

	// Start is the local time, read just before the request that won the grant
	// was sent. Validity counts from Start, so time spent in flight and in the
	// queue is never counted as held time. A zero Start makes dlock use the time
	// Acquire was called.
	Start time.Time

	// Validity is how long after Start the lock is known to be held, after any
	// allowance for clock drift (see DriftAllowance). Must be > 0.
	Validity time.Duration

	// Lost, if non-nil, is closed by the driver when the backend reports that the
	// lock is gone before its validity ends (a session-bound backend's session
	// expired or its connection died). dlock then closes the lease's Done at once.
	// dlock watches it with one goroutine per lease; a driver that holds many
	// leases calls AcquireRequest.OnLost instead.
	Lost <-chan struct{}

	// Data is driver-private state (a session, a node path, a revision).
	Data any
}

// FencingLevel says how far a backend's tokens can be trusted.
type FencingLevel int

const (
	// FencingNone means the backend gives no usable token.
	FencingNone FencingLevel = iota

	// FencingTimingDependent means tokens increase as long as the backend's timing
	// assumptions hold (bounded clock drift between servers, no restart without
	// persistence before the maximum TTL has passed). Redlock is the example: a
	// stale holder can, in those failure cases, carry a token higher than the
	// current holder's.
	FencingTimingDependent

	// FencingStrict means tokens strictly increase per key across every grant,
	// whatever the timing, for all failures the backend's own durability
	// survives.
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
	// an etcd lease, a ZooKeeper session). Clients only need their clock rate,
	// not their wall time, to agree with the server's.
	TimeServer TimeAuthority = iota

	// TimeClient means the client's clock decides validity, and correctness
	// depends on bounded drift between client and servers (Redlock's validity
	// arithmetic).
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

// Capabilities are a backend's guarantees, stated so that code and the
// conformance suite can tell a strict fencing backend from a timing-based one.
// The conformance suite proves every capability a driver claims.
type Capabilities struct {
	// Fencing is the meaning of Grant.Token.
	Fencing FencingLevel

	// FIFO is true if waiters are granted the lock in the order they started
	// waiting.
	FIFO bool

	// FaultTolerant is true if the lock survives the loss of a minority of
	// servers (consensus backends, Redlock). A single Redis or PostgreSQL server
	// is a single point of failure: false.
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

	// Shared is true if the driver honours AcquireRequest.Shared, in the
	// backend's own layout (PostgreSQL's pg_advisory_lock_shared, say), so that
	// other clients of that layout interoperate. A Locker whose driver does not
	// refuses a shared acquire with an error matching errors.ErrUnsupported.
	Shared bool

	// NativeSemaphore is true if the driver has a semaphore of its own: it
	// honours AcquireRequest.Permits in the backend's own semaphore layout
	// (ZooKeeper: Apache Curator's InterProcessSemaphoreV2; Redis: a sorted
	// set of expiring permits; etcd: a waiting room and one lock name per
	// slot), so that other clients of that layout count toward the permits. A Locker whose driver does not
	// refuses a counted acquire with an error matching errors.ErrUnsupported,
	// and package semaphore uses its portable layout of slot locks there.
	NativeSemaphore bool
}

// PermitKey is the key of slot i of the semaphore key: key + "/permits/" +
// i, the key of the same slot's lock in package semaphore's portable
// layout. A counted grant's Key (see AcquireRequest.Permits).
func PermitKey(key string, i int) string { return key + "/permits/" + strconv.Itoa(i) }

// Named is an optional interface a Driver may implement to name itself in
// error messages ("redis", "etcd"). dlock.Open uses the DSN scheme instead;
// dlock.New falls back to the driver's Go type.
type Named interface {
	Name() string
}
