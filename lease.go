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

// lossKind is an observe.LossCause in a byte (a Lease's field: a lease's size is
// scale, see docs/BENCHMARKS.md).
type lossKind uint8

// lossCauses are the observe.LossCause of each lossKind; 0 is none.
var lossCauses = [...]observe.LossCause{"", observe.LossRenewalFailed, observe.LossDeadlinePassed, observe.LossBackendReported}

func kindOf(c observe.LossCause) lossKind {
	for i, x := range lossCauses {
		if x == c {
			return lossKind(i)
		}
	}
	return 0
}

// Lease is a granted lock. Its methods are safe for concurrent use.
//
// A lease ends exactly once: released by its holder (Release, Locker.Close, the
// end of Do), or lost (its deadline passed without a successful renewal, a
// renewal failed, or the backend reported it gone). Done is closed at that
// moment and Err says which.
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
	// Done: most held leases are never asked for one, and a context per lease
	// cost ~100 B of heap each (docs/BENCHMARKS.md, Scale).
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

// newLease makes the lease for g, whose Start is start on the locker's clock.
func newLease(l *locker, g *backend.Grant, s *settings, start time.Duration) *Lease {
	lease := &Lease{locker: l, grant: g, set: s}
	lease.setDeadlineLocked(start, g.Validity)
	return lease
}

// setDeadlineLocked records a grant or renewal sent at start (on the locker's
// clock) with validity v.
func (l *Lease) setDeadlineLocked(start, v time.Duration) {
	l.deadline = start + v
	l.deadlineAt = time.Now().Add(l.deadline - l.locker.clk.Now())
	l.nextRenew = start + renewInterval(l.set.ttl, v)
}

// errDeadlinePassed is the cause of a lease that ran out of time.
var errDeadlinePassed = errors.New("deadline passed without a successful renewal")

// renewInterval is the time from a grant or renewal's start to the next
// renewal: a third of the TTL, or of the validity if that is shorter, so two
// more attempts fit before the deadline.
func renewInterval(ttl, validity time.Duration) time.Duration {
	return min(ttl, validity) / 3
}

// start hands the lease to the scheduler and, for session-bound backends,
// watches the grant's Lost channel.
func (l *Lease) start() {
	l.locker.sched.schedule(l, l.nextEvent())
	if lost := l.grant.Lost; lost != nil {
		l.locker.sched.spawn(func() {
			select {
			case <-lost:
				l.lose(errors.New("backend reported the lock gone (session ended)"))
			case <-l.Done():
			}
		})
	}
}

// lossLatch carries a driver's AcquireRequest.OnLost call to the lease, which
// does not exist yet while the driver is granting: a loss reported before the
// lease is attached ends it the moment it is.
type lossLatch struct {
	mu    sync.Mutex
	lease *Lease
	cause error // non-nil once fired
}

func (x *lossLatch) fire(cause error) {
	if cause == nil {
		cause = errBackendLost
	}
	x.mu.Lock()
	if x.cause != nil {
		x.mu.Unlock()
		return
	}
	x.cause = cause
	lease := x.lease
	x.mu.Unlock()
	if lease != nil {
		lease.lose(fmt.Errorf("backend reported the lock gone: %w", cause))
	}
}

func (x *lossLatch) attach(l *Lease) {
	x.mu.Lock()
	x.lease = l
	cause := x.cause
	x.mu.Unlock()
	if cause != nil {
		l.lose(fmt.Errorf("backend reported the lock gone: %w", cause))
	}
}

// errBackendLost is the cause of a loss a driver reported without one.
var errBackendLost = errors.New("session ended")

// Key returns the lock's key.
func (l *Lease) Key() string { return l.grant.Key }

// Token returns the lease's fencing token. See Token and Locker.Capabilities
// for what it guarantees on this backend.
func (l *Lease) Token() Token { return Token(l.grant.Token) }

// GrantedAt returns the local time read just before the request that won the
// grant was sent (backend.Grant.Start), or, for a waiter woken by a watch,
// the moment its driver learned it holds the lock: about when the lock became
// this lease's, and earlier than Acquire returned by up to a round trip. A
// checker that orders two holders uses it as the later holder's start, so a
// deadline overstated by less than a round trip is still caught.
func (l *Lease) GrantedAt() time.Time { return l.grant.Start }

// Deadline returns the local time before which the lease is known to be held:
// the start of the latest successful grant or renewal request (the moment it was
// sent, not answered) plus the validity the backend granted, less an allowance
// for clock drift. The lease ends no later than this, unless renewed.
//
// It is measured on a clock that counts time the host spends suspended
// (CLOCK_BOOTTIME on Linux), as the lock server's own clock does, and is
// immune to wall-clock jumps: after a VM pause or a sleep, Deadline moves
// earlier by the suspend, and a lease whose deadline passed meanwhile reports
// it at once through Err, and through Done at the Locker's next wake-up
// (within a second).
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

// Done returns a channel that is closed when the lease ends: released, expired
// or lost. Select on it in long-running work, or use Do.
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

// Err returns nil while the lease is held. After Done is closed it returns an
// error matching ErrReleased if the holder released it, or ErrLeaseLost
// (wrapping the cause) if it was lost. A lease whose Deadline has passed is
// lost: Err ends it then and there, without waiting for the Locker's
// keepalive to notice.
func (l *Lease) Err() error {
	if l.outer != nil {
		return l.nestedErr()
	}
	l.expireIfPast()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// expireIfPast ends a held lease whose deadline has passed. Once Close has
// begun it only ends the lease: Close waits for its scheduler's goroutines,
// and no clean-up release may be started under it.
func (l *Lease) expireIfPast() {
	l.mu.Lock()
	past := l.state == held && l.locker.clk.Now() >= l.deadline
	l.mu.Unlock()
	if !past {
		return
	}
	if l.locker.enter() {
		defer l.locker.inflight.Done()
		l.loseBy(observe.LossDeadlinePassed, errDeadlinePassed)
	} else if l.end(held, withKind(ErrLeaseLost, errDeadlinePassed)) {
		l.locker.sched.unschedule(l)
	}
}

// Refresh extends the lease by its TTL now, for use when auto-renew is off (it
// works when it is on, too). If the backend says the lock is no longer this
// lease's, the lease ends and the error matches ErrLeaseLost. Any other failure
// (ctx done, backend unreachable) is returned and leaves the lease as it was:
// it still ends at its Deadline unless a later refresh succeeds.
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

// renewed records a successful renewal sent at start (on the locker's clock)
// with validity v.
func (l *Lease) renewed(start, v time.Duration) {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return
	}
	if start+v > l.deadline {
		l.setDeadlineLocked(start, v)
	} else {
		l.nextRenew = start + renewInterval(l.set.ttl, v)
	}
	next := l.nextEventLocked()
	l.mu.Unlock()
	l.locker.sched.schedule(l, next)
}

// Release gives up the lock. It returns nil if the lock was this lease's until
// the backend removed it. It returns an error matching ErrLeaseLost if the lease
// had been lost before (the caller learns that exclusivity may have broken), and
// one matching ErrReleased if it was already released.
//
// If ctx is already done, Release runs on a detached context bounded by the
// release timeout (see WithReleaseTimeout), so a deferred Release after a
// cancelled request still frees the lock. If the backend cannot be reached the
// lease ends anyway (Done is closed), the error is returned, and the lock frees
// itself when its TTL runs out.
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
	l.expireIfPast()
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
		ctx, cancel = l.locker.releaseCtx(context.WithoutCancel(ctx), l.set.releaseTimeout)
		defer cancel()
	} else if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = l.locker.releaseCtx(ctx, l.set.releaseTimeout)
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

// lose ends a held lease as lost, then frees the lock on the backend in case the
// holder is still recorded there (a conditional release, so it can never touch
// another owner's lock).
func (l *Lease) lose(cause error) { l.loseBy(observe.LossBackendReported, cause) }

// loseBy is lose with the kind of cause, for observers.
func (l *Lease) loseBy(kind observe.LossCause, cause error) {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return
	}
	if l.lossCause == 0 {
		l.lossCause = kindOf(kind)
	}
	l.mu.Unlock()
	// The clean-up release is handed to the scheduler before Done closes, and
	// starts once the lease has ended, if this call ended it. A holder may
	// close the Locker the moment it sees Done; Close stops the scheduler,
	// which starts nothing after that, and then the driver, and a lease
	// already lost is not among those Close releases. Spawned after Done, the
	// release could be refused, and the lock stayed on the nodes that still
	// had it until its TTL ran out (CI: a Redlock holder lost its lease in the
	// restart-empty fault, closed its Locker 0.1ms later, and its keys stayed
	// on the two nodes that had not restarted).
	ended := make(chan bool, 1)
	l.locker.sched.spawn(func() {
		if !<-ended {
			return
		}
		l.calls.RLock()
		defer l.calls.RUnlock()
		_ = l.locker.releaseDetached(l.grant, l.set.releaseTimeout)
	})
	ok := l.end(held, withKind(ErrLeaseLost, cause))
	ended <- ok
	if ok {
		l.locker.sched.unschedule(l)
	}
}

// SetLabel changes the label stored with the lease's lock (see WithLabel),
// where Inspect and List report it and where followers of the key
// (dlock.Watch, package election's Observe) see it change; package election's
// Proclaim uses it. label follows WithLabel's rules. A nested hold (see
// WithReentrant) changes its lock's label.
//
// It returns an error matching ErrLeaseLost if the lease was lost (and ends
// it, if the backend reports the lock gone), ErrReleased if it was released,
// ErrInvalidOption for a label that cannot be stored, and errors.ErrUnsupported
// where the backend cannot change a held lock's label (a Locker whose driver
// does not implement backend.Relabeler). If it fails otherwise (the backend
// unreachable), the label may or may not have changed.
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

// nextEvent is when (on the locker's clock) the scheduler must next look at
// the lease.
func (l *Lease) nextEvent() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nextEventLocked()
}

func (l *Lease) nextEventLocked() time.Duration {
	if l.set.autoRenew && !l.renewing && l.nextRenew < l.deadline {
		return l.nextRenew
	}
	return l.deadline
}

// tick is called by the scheduler at or after the lease's next event; now is
// on the locker's clock.
func (l *Lease) tick(now time.Duration) {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return
	}
	if now >= l.deadline {
		// A renewal still on its way did not finish in time: that is why.
		kind := observe.LossDeadlinePassed
		if l.renewing {
			kind = observe.LossRenewalFailed
		}
		l.mu.Unlock()
		l.loseBy(kind, errDeadlinePassed)
		return
	}
	renew := l.set.autoRenew && !l.renewing && now >= l.nextRenew
	if renew {
		l.renewing = true
	}
	deadline := l.deadline
	next := l.nextEventLocked()
	l.mu.Unlock()

	l.locker.sched.schedule(l, next)
	if renew {
		l.locker.sched.spawn(func() { l.autoRenew(deadline) })
	}
}

// autoRenew runs one keepalive renewal, which must finish before deadline (on
// the locker's clock). The scheduler ends the lease at the deadline whatever
// the renewal's ctx says; the ctx's deadline, on Go's timers, only stops a
// renewal that could no longer help.
func (l *Lease) autoRenew(deadline time.Duration) {
	start := l.locker.clk.Now()
	// Its own context, not one tied to the lease (which would keep a record
	// of it for the rest of the lease, about 300 B per held lease once it
	// has been renewed): end cancels it.
	ctx, cancel := context.WithTimeout(context.Background(), deadline-start)
	defer cancel()
	l.mu.Lock()
	if l.state != held {
		l.renewing = false
		l.mu.Unlock()
		return
	}
	l.stopRenewal = cancel
	l.mu.Unlock()
	l.calls.RLock()
	v, err := l.locker.drv.Refresh(ctx, l.grant, l.set.ttl)
	l.calls.RUnlock()
	l.mu.Lock()
	l.renewing = false
	l.stopRenewal = nil
	l.mu.Unlock()
	if l.obs != nil && !l.hasEnded() {
		l.obs.Renewed(l.locker.clk.Now()-start, err)
	}
	if err != nil {
		if l.hasEnded() {
			return // the lease ended meanwhile; its error is already set
		}
		kind := observe.LossRenewalFailed
		switch {
		case ctx.Err() != nil:
			err = fmt.Errorf("renewal did not finish before the deadline: %w", err)
		case errors.Is(err, backend.ErrNotHeld):
			kind = observe.LossBackendReported
			err = fmt.Errorf("renewal failed: %w", err)
		default:
			err = fmt.Errorf("renewal failed: %w", err)
		}
		l.loseBy(kind, err)
		return
	}
	l.renewed(start, v)
}
