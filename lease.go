package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/clock"
	"github.com/dlock-go/dlock/observe"
)

// String returns the token in decimal.
func (t Token) String() string { return strconv.FormatUint(uint64(t), 10) }

type leaseState uint8

const (
	held      leaseState = iota
	releasing            // Release is talking to the backend
	ended                // Done is closed; err says why
)

// Lease is a granted lock; its methods are safe for concurrent use. It ends
// once, released or lost, and Done is closed then.
type Lease struct {
	locker *locker
	grant  *backend.Grant
	set    *settings             // the Locker's own when the lease was taken without options; never changed
	outer  *Lease                // the enclosing lease of a nested hold (see WithReentrant); nil for a lease
	obs    observe.LeaseObserver // nil: none; set before the lease starts, never after

	// calls orders SetLabel's driver call (which may update grant) after and
	// before the others that pass grant (read-locked).
	calls sync.RWMutex

	// done holds Done's channel (a chan struct{}), made by the first call to
	// Done: most held leases are never asked for one.
	done atomic.Value

	mu         sync.Mutex
	state      leaseState
	renewing   bool
	signalled  bool     // the end was signalled: Done closed, onEnd run
	lossCause  lossKind // why it was lost, set by lose before it ends the lease
	err        error
	deadline   time.Duration // on locker.clk, which counts a host suspend; the lease is known held before it
	deadlineAt time.Time     // deadline as a time.Time, as of the last grant or renewal
	nextRenew  time.Duration // on locker.clk
	// stopRenewal cancels the auto-renewal in flight, if any (end calls it).
	stopRenewal context.CancelFunc
	// onEnd holds the functions to run once the end is signalled (Do's, a
	// nested hold's), by a key that takes one back; nil until the first.
	onEnd map[any]func()

	sched schedItem // its place in the Locker's keepalive queue, guarded by the scheduler's mu
}

// newLease makes the lease for g, whose Start is start on the locker's clock;
// wall and now are time.Now() and the locker's clock read at one moment since.
func newLease(l *locker, g *backend.Grant, s *settings, start time.Duration, wall time.Time, now time.Duration) *Lease {
	lease := &Lease{locker: l, grant: g, set: s}
	lease.setDeadlineLocked(start, g.Validity, wall, now)
	return lease
}

// Key returns the lock's key.
func (l *Lease) Key() string { return l.grant.Key }

// Token returns the lease's fencing token.
func (l *Lease) Token() Token { return Token(l.grant.Token) }

// GrantedAt returns about when the lock became this lease's: the local time
// just before the winning request was sent.
func (l *Lease) GrantedAt() time.Time { return l.grant.Start }

// Deadline returns the local time at which the lease ends unless renewed: when
// the latest grant or renewal was sent, plus its validity, less a drift
// allowance. It counts host suspends (docs/guide.md).
func (l *Lease) Deadline() time.Time {
	if l.outer != nil {
		return l.outer.Deadline()
	}
	l.mu.Lock()
	d, at := l.deadline, l.deadlineAt
	l.mu.Unlock()
	// Without a suspend since the last renewal, now+left equals at to within
	// the time between the two readings; keep at, so that repeated calls agree.
	if now := time.Now().Add(d - l.locker.clk.Now()); now.Before(at.Add(-time.Millisecond)) {
		return now
	}
	return at
}

// Done returns a channel that is closed when the lease ends.
func (l *Lease) Done() <-chan struct{} {
	if ch, ok := l.done.Load().(chan struct{}); ok {
		return ch
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ch, ok := l.done.Load().(chan struct{}); ok {
		return ch
	}
	ch := closedChan
	if !l.signalled {
		ch = make(chan struct{})
	}
	l.done.Store(ch)
	return ch
}

// closedChan is Done's channel for a lease whose end was signalled before
// Done was first called.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// signalEnd closes Done and runs the onEnd functions, once; the lease's err
// is set by then.
func (l *Lease) signalEnd() {
	l.mu.Lock()
	if l.signalled {
		l.mu.Unlock()
		return
	}
	l.signalled = true
	ch, _ := l.done.Load().(chan struct{})
	funcs := l.onEnd
	l.onEnd = nil
	l.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	for _, f := range funcs {
		f()
	}
}

// afterEnd arranges for f to run once the lease's end is signalled (at once,
// in this goroutine, if it was), unless stopAfterEnd(key) comes first.
func (l *Lease) afterEnd(key any, f func()) {
	l.mu.Lock()
	if l.signalled {
		l.mu.Unlock()
		f()
		return
	}
	if l.onEnd == nil {
		l.onEnd = make(map[any]func(), 1)
	}
	l.onEnd[key] = f
	l.mu.Unlock()
}

// stopAfterEnd takes back the function afterEnd registered under key, if it
// has not run.
func (l *Lease) stopAfterEnd(key any) {
	l.mu.Lock()
	delete(l.onEnd, key)
	l.mu.Unlock()
}

// hasEnded reports whether the lease has ended (its err is set).
func (l *Lease) hasEnded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == ended
}

// Err returns nil while the lease is held, then an error matching
// [ErrReleased] or [ErrLeaseLost]; past its Deadline a lease is lost at once.
func (l *Lease) Err() error {
	if l.outer != nil {
		return l.nestedErr()
	}
	l.expireIfPast()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Refresh extends the lease by its TTL now. If the lock is no longer this
// lease's, the lease ends with [ErrLeaseLost]; other errors leave it as it was.
func (l *Lease) Refresh(ctx context.Context) error {
	if l.outer != nil {
		if err := l.nestedErr(); err != nil {
			return err
		}
		return l.outer.Refresh(ctx)
	}
	if err := l.heldErr("refresh"); err != nil {
		return err
	}
	if !l.locker.enter() {
		return l.heldErrOr("refresh", ErrClosed)
	}
	defer l.locker.inflight.Done()
	start := l.locker.clk.Now()
	l.calls.RLock()
	v, err := l.locker.drv.Refresh(ctx, l.grant, l.set.ttl)
	l.calls.RUnlock()
	if l.obs != nil {
		l.obs.Renewed(l.locker.clk.Now()-start, err)
	}
	if err != nil {
		if errors.Is(err, backend.ErrNotHeld) {
			l.loseBy(observe.LossBackendReported, err)
			return l.Err()
		}
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return l.locker.errorf("refresh", l.Key(), err)
	}
	l.renewed(start, v)
	return l.heldErr("refresh")
}

// heldErr returns nil if the lease is held, else the error for op.
func (l *Lease) heldErr(op string) error {
	l.expireIfPast()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.state {
	case held:
		return nil
	case releasing:
		return l.locker.errorf(op, l.Key(), ErrReleased)
	}
	if errors.Is(l.err, ErrReleased) {
		return l.locker.errorf(op, l.Key(), ErrReleased)
	}
	return l.err
}

// heldErrOr is heldErr, or the error for op with err if the lease is still
// held.
func (l *Lease) heldErrOr(op string, err error) error {
	if e := l.heldErr(op); e != nil {
		return e
	}
	return l.locker.errorf(op, l.Key(), err)
}

// Release gives up the lock and ends the lease, even once ctx is done. Its
// error matches [ErrLeaseLost] if the lease had been lost, [ErrReleased] if
// released before; after a backend error the lock expires after its TTL.
func (l *Lease) Release(ctx context.Context) error {
	if l.outer != nil {
		return l.releaseNested()
	}
	if !l.locker.enter() {
		// Close has begun; it releases every lease still held.
		return l.heldErrOr("release", ErrClosed)
	}
	defer l.locker.inflight.Done()
	// A lease whose deadline has passed is lost, whether or not the keepalive
	// has noticed yet (a process resumed after a pause releases at once): the
	// caller must learn that exclusivity may have broken.
	wall, now := clock.Read(l.locker.clk)
	l.expireIfPastAt(now)
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return l.heldErr("release")
	}
	l.state = releasing
	l.mu.Unlock()
	l.locker.sched.unschedule(l)

	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = l.locker.releaseCtxAt(context.WithoutCancel(ctx), l.set.releaseTimeout, wall)
		defer cancel()
	} else if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = l.locker.releaseCtxAt(ctx, l.set.releaseTimeout, wall)
		defer cancel()
	}
	var released func(error)
	if l.obs != nil {
		ctx, released = l.obs.StartRelease(ctx)
	}
	l.calls.RLock()
	err := l.locker.drv.Release(ctx, l.grant)
	l.calls.RUnlock()
	if released != nil {
		released(err)
	}
	switch {
	case err == nil:
		l.end(releasing, ErrReleased)
		return nil
	case errors.Is(err, backend.ErrNotHeld):
		l.end(releasing, withKind(ErrLeaseLost, err))
		return l.Err()
	default:
		l.end(releasing, withKind(ErrReleased, fmt.Errorf("release not confirmed, the lock expires after its TTL: %w", err)))
		return l.locker.errorf("release", l.Key(), err)
	}
}

// releaseOnClose releases a lease on behalf of Locker.Close.
func (l *Lease) releaseOnClose() error {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return nil
	}
	l.state = releasing
	l.mu.Unlock()
	l.locker.sched.unschedule(l)
	l.calls.RLock()
	err := l.locker.releaseDetached(l.grant, l.set.releaseTimeout)
	l.calls.RUnlock()
	l.end(releasing, withKind(ErrReleased, ErrClosed))
	if err != nil && !errors.Is(err, backend.ErrNotHeld) {
		return l.locker.errorf("release", l.Key(), err)
	}
	return nil
}

// SetLabel changes the label stored with the lease's lock, under [WithLabel]'s
// rules. Its error matches [ErrLeaseLost], [ErrReleased], [ErrInvalidOption],
// or errors.ErrUnsupported (the driver is no [backend.Relabeler]); after
// another error the label may or may not have changed.
func (l *Lease) SetLabel(ctx context.Context, label string) error {
	if l.outer != nil {
		if err := l.nestedErr(); err != nil {
			return err
		}
		return l.outer.SetLabel(ctx, label)
	}
	rl, ok := l.locker.drv.(backend.Relabeler)
	if !ok {
		return errUnsupported(l.locker.name, "set label", "change a held lock's label")
	}
	if err := checkLabel(label); err != nil {
		return l.locker.errorf("set label", l.Key(), err)
	}
	if err := l.heldErr("set label"); err != nil {
		return err
	}
	if !l.locker.enter() {
		return l.heldErrOr("set label", ErrClosed)
	}
	defer l.locker.inflight.Done()
	l.calls.Lock()
	err := rl.Relabel(ctx, l.grant, label)
	l.calls.Unlock()
	if err != nil {
		if errors.Is(err, backend.ErrNotHeld) {
			l.loseBy(observe.LossBackendReported, err)
			return l.Err()
		}
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return l.locker.errorf("set label", l.Key(), err)
	}
	return l.heldErr("set label")
}

// end moves the lease from state from to its final state, and reports whether
// it did; err must match ErrReleased or ErrLeaseLost.
func (l *Lease) end(from leaseState, err error) bool {
	l.mu.Lock()
	if l.state != from {
		l.mu.Unlock()
		return false
	}
	l.state = ended
	stopRenewal := l.stopRenewal
	l.stopRenewal = nil
	op := "lease"
	if errors.Is(err, ErrReleased) {
		op = "release"
	}
	l.err = l.locker.errorf(op, l.Key(), err)
	lerr, cause := l.err, lossCauses[l.lossCause]
	l.mu.Unlock()
	if l.obs != nil { // before Done closes, so that an observer has seen the end by then
		lost := errors.Is(err, ErrLeaseLost)
		switch {
		case !lost:
			cause = ""
		case cause == "" && errors.Is(err, errDeadlinePassed):
			cause = observe.LossDeadlinePassed
		case cause == "":
			cause = observe.LossBackendReported
		}
		l.obs.Ended(observe.LeaseEnd{Lost: lost, Cause: cause, Held: time.Since(l.grant.Start), Err: lerr})
	}
	l.signalEnd()
	if stopRenewal != nil {
		stopRenewal()
	}
	l.locker.forget(l)
	return true
}
