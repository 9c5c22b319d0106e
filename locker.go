package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/clock"
	"github.com/dlock-go/dlock/internal/sharedctx"

	"github.com/dlock-go/dlock/observe"
)

// Token is a fencing token: it increases strictly per key across grants where
// Capabilities().Fencing is [FencingStrict], and is never 0 where tokens fence.
type Token uint64

// Locker grants locks; it is safe for concurrent use. Any two acquires of one
// key on one backend exclude each other, even on one Locker, unless re-entrant.
type Locker interface {
	// Acquire waits until the lock key is granted or ctx is done; ctx bounds the
	// wait only, not the lease. If ctx ends first, the error matches both
	// ErrNotAcquired and ctx.Err(), and nothing is left on the backend.
	Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error)

	// TryAcquire makes one attempt: if another owner holds the lock, it returns
	// an error matching ErrNotAcquired at once.
	TryAcquire(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error)

	// Capabilities says what this backend guarantees.
	Capabilities() Capabilities

	// Close releases every lease the Locker holds, stops its keepalive and
	// closes the driver. Acquire calls in flight, and every call after Close,
	// return ErrClosed.
	Close() error
}

// Open opens a Locker for a DSN such as "etcd://h1:2379/locks?ttl=10s"; the
// scheme's driver must be registered by importing its package. dlock reads ttl,
// autorenew, label and reentrant; the driver rejects other unknown parameters.
// opts override the DSN; ctx bounds opening only; errors never show a password.
func Open(ctx context.Context, dsn string, opts ...Option) (Locker, error) {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return nil, &Error{Op: "open", Err: fmt.Errorf("%w: %w", ErrInvalidOption, err)}
	}
	open, ok := backend.Lookup(u.Scheme)
	if !ok {
		return nil, &Error{Op: "open", Backend: u.Scheme, Err: fmt.Errorf("%w %q (forgotten import?); registered: %v",
			ErrUnknownScheme, u.Scheme, backend.Schemes())}
	}
	dsnOpts, err := takePortableParams(u)
	if err != nil {
		return nil, &Error{Op: "open", Backend: u.Scheme, Err: err}
	}
	s, err := defaultSettings().withLocker(append(dsnOpts, opts...))
	if err != nil {
		return nil, &Error{Op: "open", Backend: u.Scheme, Err: err}
	}
	d, err := open(ctx, u)
	if err != nil {
		return nil, &Error{Op: "open", Backend: u.Scheme, Err: err}
	}
	return newLocker(d, u.Scheme, s), nil
}

// New returns a Locker over d, a driver built in code, and owns d: the
// Locker's Close closes it, as does New when it fails.
func New(d backend.Driver, opts ...Option) (Locker, error) {
	if d == nil {
		return nil, &Error{Op: "open", Err: fmt.Errorf("%w: nil driver", ErrInvalidOption)}
	}
	name := driverName(d)
	s, err := defaultSettings().withLocker(opts)
	if err != nil {
		_ = d.Close()
		return nil, &Error{Op: "open", Backend: name, Err: err}
	}
	return newLocker(d, name, s), nil
}

// driverName is the name used in errors for a driver built in code: its Name
// method if it has one (see backend.Named), else its Go type.
func driverName(d backend.Driver) string {
	if n, ok := d.(backend.Named); ok {
		return n.Name()
	}
	return fmt.Sprintf("%T", d)
}

// locker is the one implementation of Locker: every rule users see lives here,
// once, over a thin driver.
type locker struct {
	drv     backend.Driver
	clk     clock.Clock // counts a host suspend; every lease deadline is on it
	name    string
	caps    backend.Capabilities
	base    settings
	obs     observe.Observer // nil: none (WithObserver, WithLogger)
	sched   *scheduler
	closing context.Context // cancelled (cause ErrClosed) when Close starts
	close   context.CancelCauseFunc
	release *sharedctx.Bound // bounds releases by base.releaseTimeout without a timer each

	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup // callers' Acquire, Refresh and Release calls inside the driver
	leases   map[*Lease]struct{}
}

func newLocker(d backend.Driver, name string, s settings) *locker {
	return newLockerClock(d, name, s, clock.System)
}

// newLockerClock is newLocker with the clock leases count on (tests simulate a
// host suspend with one that jumps).
func newLockerClock(d backend.Driver, name string, s settings, clk clock.Clock) *locker {
	ctx, cancel := context.WithCancelCause(context.Background())
	l := &locker{
		drv:     d,
		clk:     clk,
		name:    name,
		caps:    d.Capabilities(),
		base:    s,
		obs:     s.observers(),
		sched:   newScheduler(clk),
		closing: ctx,
		close:   cancel,
		release: sharedctx.New(s.releaseTimeout),
		leases:  map[*Lease]struct{}{},
	}
	return l
}

func (l *locker) Capabilities() Capabilities { return l.caps }

func (l *locker) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	return l.acquire(ctx, "acquire", key, true, opts)
}

func (l *locker) TryAcquire(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	return l.acquire(ctx, "try-acquire", key, false, opts)
}

func (l *locker) errorf(op, key string, err error) error {
	return &Error{Op: op, Key: key, Backend: l.name, Err: err}
}

// settingsFor returns the settings of a call with opts: the Locker's own,
// shared by every lease taken without options (a lease keeps a pointer, not a
// copy), or a copy with opts applied.
func (l *locker) settingsFor(opts []AcquireOption) (*settings, error) {
	if len(opts) == 0 {
		return &l.base, nil
	}
	s, err := l.base.withAcquire(opts)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

func (l *locker) acquire(ctx context.Context, op, key string, wait bool, opts []AcquireOption) (*Lease, error) {
	if err := validateKey(key); err != nil {
		return nil, l.errorf(op, key, err)
	}
	s, err := l.settingsFor(opts)
	if err != nil {
		return nil, l.errorf(op, key, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, l.errorf(op, key, withKind(ErrNotAcquired, err))
	}
	if s.shared && !l.caps.Shared {
		return nil, l.errorf(op, key, fmt.Errorf("the backend cannot hold a lock shared: %w", errors.ErrUnsupported))
	}
	if s.permits > 0 {
		if !l.caps.NativeSemaphore {
			return nil, l.errorf(op, key, fmt.Errorf("the backend has no semaphore layout of its own: %w", errors.ErrUnsupported))
		}
		if err := validateKey(backend.PermitKey(key, s.permits-1)); err != nil {
			return nil, l.errorf(op, key, fmt.Errorf("%w (the key of the permits' slots)", err))
		}
	}
	if s.reentrant && s.permits == 0 {
		if outer := enclosing(ctx, l, key); outer != nil {
			if outer.set.shared && !s.shared {
				return nil, l.errorf(op, key, withKind(ErrNotAcquired, ErrUpgrade))
			}
			return outer.nest(op)
		}
	}
	if l.obs == nil {
		return l.grantLease(ctx, op, key, wait, s, nil)
	}
	began := time.Now()
	octx, done := l.obs.StartAcquire(ctx, observe.AcquireInfo{Backend: l.name, Key: key, Wait: wait})
	observed := false
	lease, err := l.grantLease(octx, op, key, wait, s, func(lease *Lease) {
		observed = true
		lease.obs = done(observe.AcquireOutcome{Result: observe.ResultGranted, Token: uint64(lease.Token()), Took: time.Since(began)})
	})
	if !observed {
		done(observe.AcquireOutcome{Result: resultOf(octx, err), Took: time.Since(began), Err: err})
	}
	return lease, err
}

// grantLease is acquire's request to the driver, once the arguments are
// checked; onGrant, if not nil, is called with the lease before it starts.
func (l *locker) grantLease(ctx context.Context, op, key string, wait bool, s *settings, onGrant func(*Lease)) (*Lease, error) {
	if !l.enter() {
		return nil, l.errorf(op, key, ErrClosed)
	}
	defer l.inflight.Done()

	// A wait ends when the caller's ctx ends or Close starts. (One attempt needs
	// no such link: Close waits for it.)
	actx := ctx
	if wait {
		var cancel context.CancelCauseFunc
		actx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		stop := context.AfterFunc(l.closing, func() { cancel(ErrClosed) })
		defer stop()
	}

	var bo backend.Backoff
	for {
		// Grant.Start is a time.Time; the lease counts on clk, read at the same moment.
		called, at := clock.Read(l.clk)
		lost := new(lossLatch)
		g, err := l.drv.Acquire(actx, backend.AcquireRequest{
			Key:      key,
			Owner:    backend.NewOwnerID(),
			TTL:      s.ttl,
			Wait:     wait,
			Shared:   s.shared,
			Permits:  s.permits,
			Label:    s.label,
			Announce: s.announce,
			OnLost:   lost.fire,
		})
		if err != nil {
			return nil, l.errorf(op, key, l.acquireErr(ctx, err))
		}
		lease, err := l.hold(op, g, s, lost, called, at, onGrant)
		if !errors.Is(err, errGrantedLate) || !wait {
			return lease, err
		}
		// The grant reached us after its deadline (a slow reply, a loaded
		// host): it was given back; a waiting Acquire asks again.
		if err := backend.Sleep(actx, bo.Next()); err != nil {
			return nil, l.errorf(op, key, l.acquireErr(ctx, err))
		}
	}
}

// errGrantedLate means the driver's grant reached the Locker after its
// deadline: nobody could vouch for it any more, so it was given back.
var errGrantedLate = errors.New("the grant arrived after its deadline")

// acquireErr maps a driver's acquire error onto the contract: ErrClosed once
// Close has begun, ErrNotAcquired with ctx's error when ctx ended, and
// ErrNotAcquired for a held lock.
func (l *locker) acquireErr(ctx context.Context, err error) error {
	switch {
	case l.closing.Err() != nil:
		return ErrClosed
	case ctx.Err() != nil:
		if !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return withKind(ErrNotAcquired, err)
	case errors.Is(err, backend.ErrHeld):
		return withKind(ErrNotAcquired, err)
	}
	return err
}

// hold makes the lease of a grant the driver returned for an acquire that
// began at called (at on the locker's clock, read at the same moment), and
// starts it; onGrant, if not nil, is called with the lease before it starts.
func (l *locker) hold(op string, g *backend.Grant, s *settings, lost *lossLatch, called time.Time, at time.Duration, onGrant func(*Lease)) (*Lease, error) {
	if g == nil || g.Validity <= 0 {
		// A driver bug; never hand out a lease nobody can vouch for.
		if g != nil {
			l.releaseDetached(g, s.releaseTimeout)
		}
		key := ""
		if g != nil {
			key = g.Key
		}
		return nil, l.errorf(op, key, fmt.Errorf("driver returned an invalid grant (nil or validity ≤ 0)"))
	}
	if g.Start.IsZero() {
		g.Start = called
	}
	// Mapped as clock.Offset maps it: a suspend after called makes start
	// earlier than it was, the safe side.
	start := at + g.Start.Sub(called)
	wall, now := clock.Read(l.clk)
	if late := now - (start + g.Validity); late >= 0 {
		// The validity ran out on the way here (a slow node's reply, a
		// paused or loaded host): a lease handed out now would be one its
		// holder cannot count on for a moment, and another may already hold
		// the lock.
		l.releaseDetached(g, s.releaseTimeout)
		return nil, l.errorf(op, g.Key, fmt.Errorf("%w (validity %v, %v before it reached the caller); released it",
			errGrantedLate, g.Validity, late.Round(time.Millisecond)))
	}
	lease := newLease(l, g, s, start, wall, now)

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.releaseDetached(g, s.releaseTimeout)
		return nil, l.errorf(op, g.Key, ErrClosed)
	}
	l.leases[lease] = struct{}{}
	l.mu.Unlock()
	if onGrant != nil {
		onGrant(lease)
	}
	lease.start()
	lost.attach(lease)
	return lease, nil
}

// enter registers a caller's call into the driver; it reports false once
// Close has begun. Each true must be matched by l.inflight.Done(). Close waits
// for all of them before it closes the driver.
func (l *locker) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.inflight.Add(1)
	return true
}

// releaseDetached releases g on a context detached from any caller, bounded by
// timeout. Used where no caller is waiting for the answer.
func (l *locker) releaseDetached(g *backend.Grant, timeout time.Duration) error {
	ctx, cancel := l.releaseCtx(context.Background(), timeout)
	defer cancel()
	return l.drv.Release(ctx, g)
}

// releaseCtx is parent bounded by timeout, for a release. At the Locker's
// release timeout, calls whose parent cannot be cancelled share one deadline
// (between timeout and timeout·9/8 away) instead of each arming a timer.
func (l *locker) releaseCtx(parent context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return l.releaseCtxAt(parent, timeout, time.Now())
}

// releaseCtxAt is releaseCtx for a release made at now (a time.Now() the
// caller read): the timeout counts from now.
func (l *locker) releaseCtxAt(parent context.Context, timeout time.Duration, now time.Time) (context.Context, context.CancelFunc) {
	if timeout == l.release.Timeout() {
		return l.release.ContextAt(parent, now)
	}
	return context.WithTimeout(parent, timeout)
}

func (l *locker) forget(lease *Lease) {
	l.mu.Lock()
	delete(l.leases, lease)
	l.mu.Unlock()
}

func (l *locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return l.errorf("close", "", ErrClosed)
	}
	l.closed = true
	l.mu.Unlock()

	l.close(ErrClosed)
	l.inflight.Wait() // no caller is inside the driver any more

	l.mu.Lock()
	held := make([]*Lease, 0, len(l.leases))
	for lease := range l.leases {
		held = append(held, lease)
	}
	l.mu.Unlock()

	errs := make([]error, len(held))
	var wg sync.WaitGroup
	for i, lease := range held {
		wg.Go(func() { errs[i] = lease.releaseOnClose() })
	}
	wg.Wait()
	l.sched.stop() // waits for in-flight renewals and watchers
	if err := l.drv.Close(); err != nil {
		errs = append(errs, err)
	}
	l.release.Stop()
	if err := errors.Join(errs...); err != nil {
		return l.errorf("close", "", err)
	}
	return nil
}
