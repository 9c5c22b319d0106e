package k8s

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dlock-go/dlock/backend"
)

// settleDelay is how long after a grant written in its Lease's creation
// second the driver waits, by its own clock, before the write that makes the
// token safe (see settle).
const settleDelay = 1100 * time.Millisecond

// settleHook, when set by a test, is called before a grant is settled.
var settleHook func()

// Acquire implements backend.Driver. A waiting Acquire follows the driver's
// shared watch of the Lease and tries again at each change, when the
// holder's duration has passed since it was first seen unchanged, and at
// least every poll interval, riding out transient errors until ctx is done.
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	if req.Shared || req.Permits > 0 {
		return nil, errors.ErrUnsupported
	}
	valid, err := validity(req.TTL)
	if err != nil {
		return nil, err
	}
	name := d.LeaseName(req.Key)
	if err := checkName(name); err != nil {
		return nil, err
	}
	h := &hold{name: name, key: req.Key, owner: req.Owner, onLost: req.OnLost}
	if !req.Wait {
		g, _, err := d.attempt(ctx, req, h, valid)
		switch {
		case g != nil:
			return g, nil
		case err == nil:
			return nil, backend.ErrHeld
		}
		return nil, waitEnded(ctx, err)
	}
	return d.wait(ctx, req, h, valid)
}

// attempt reads the Lease and makes an attempt on what it read (attemptOn).
func (d *Driver) attempt(ctx context.Context, req backend.AcquireRequest, h *hold, valid time.Duration) (*backend.Grant, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return nil, time.Time{}, err
	}
	rctx, cancel := d.reqCtx(ctx)
	cur, err := d.leases.Get(rctx, h.name, metav1.GetOptions{})
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		cur = nil
	case err != nil:
		return nil, time.Time{}, err
	}
	return d.attemptOn(ctx, req, h, valid, cur, nil)
}

// attemptOn makes an attempt on cur, the Lease as read or watched (nil if
// absent; not modified): if nobody holds it (no holder, or the holder's
// duration has passed since this driver first saw its version), and claim
// (if not nil) allows, it writes h's grant conditional on cur's version (or
// creates the Lease). It returns the grant; or nil, nil and when the
// holder's time ends (zero if unknown) if the Lease is held, claim refused,
// or another write came first; or an error. A grant racing ctx's end is
// given back, and ctx's error returned.
func (d *Driver) attemptOn(ctx context.Context, req backend.AcquireRequest, h *hold, valid time.Duration, cur *coordinationv1.Lease, claim func() bool) (*backend.Grant, time.Time, error) {
	var none time.Time
	if err := ctx.Err(); err != nil {
		return nil, none, err
	}
	switch {
	case cur == nil:
	case mine(cur, h):
		// An earlier attempt's write was applied with its answer lost; its
		// renewTime is when it was sent, by this clock.
		start := time.Now()
		if t := cur.Spec.RenewTime; t != nil && t.Time.Before(start) {
			start = t.Time
		}
		return d.granted(ctx, req, h, valid, cur, start)
	default:
		if until, held := d.heldUntil(cur, time.Now()); held {
			return nil, until, nil
		}
	}
	if claim != nil && !claim() {
		return nil, none, nil
	}
	want, err := grantLease(cur.DeepCopy(), h.name, h, req.Label, req.TTL)
	if err != nil {
		return nil, none, err
	}
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	var got *coordinationv1.Lease
	if cur == nil {
		got, err = d.leases.Create(rctx, want, metav1.CreateOptions{FieldManager: FieldManager})
	} else {
		got, err = d.leases.Update(rctx, want, updateOpts)
	}
	switch {
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return nil, none, nil // another write came first
	case err != nil && !definite(err):
		// The write may have been applied with its answer lost: if the
		// Lease is h's grant, it is one.
		l, gerr := d.leases.Get(rctx, h.name, metav1.GetOptions{})
		if gerr != nil || !mine(l, h) {
			return nil, none, err
		}
		got = l
	case err != nil:
		return nil, none, err
	}
	return d.granted(ctx, req, h, valid, got, start)
}

// granted completes the grant whose write returned got, sent at start:
// settles its token if need be, gives it back if ctx has ended, and starts
// its loss watch.
func (d *Driver) granted(ctx context.Context, req backend.AcquireRequest, h *hold, valid time.Duration, got *coordinationv1.Lease, start time.Time) (*backend.Grant, time.Time, error) {
	var none time.Time
	h.last = got
	h.token = token(got)
	if serverSecond(got) <= got.CreationTimestamp.Unix() {
		var err error
		if start, err = d.settle(ctx, h, req.TTL); errors.Is(err, backend.ErrNotHeld) {
			return nil, none, nil // taken meanwhile: held
		} else if err != nil {
			return nil, none, err
		}
	}
	if ctx.Err() != nil {
		d.giveBack(h)
		return nil, none, ctx.Err()
	}
	d.obs.forget(h.name)
	d.watchLoss(h)
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    h.token,
		Start:    start,
		Validity: valid,
		Data:     h,
	}, none, nil
}

// settle makes the token of a grant written in its Lease's creation second
// safe to hand out: it renews the grant until a renewal is sent settleDelay
// after the grant's answer came, a write that lands in a later second of the
// API server's clock (renewing at least every third of ttl meanwhile).
// Every grant the driver hands out has then been followed by a write after
// the Lease's creation second, so a Lease deleted and created again gets a
// later creation second than every token of the deleted one (docs/k8s.md).
// It returns the time just before the last renewal was sent; if the grant is
// lost meanwhile (ErrNotHeld), or ctx ends (the grant is given back), an
// error.
func (d *Driver) settle(ctx context.Context, h *hold, ttl time.Duration) (time.Time, error) {
	if settleHook != nil {
		settleHook()
	}
	var start time.Time
	step := min(settleDelay, max(ttl/3, 100*time.Millisecond))
	for waited := time.Duration(0); waited < settleDelay; waited += step {
		if err := backend.Sleep(ctx, step); err != nil {
			d.giveBack(h)
			return time.Time{}, err
		}
		start = time.Now()
		rctx, cancel := d.reqCtx(ctx)
		l := h.current()
		now := metav1.NewMicroTime(start)
		l.Spec.RenewTime = &now
		got, err := d.leases.Update(rctx, l, updateOpts)
		cancel()
		if err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return time.Time{}, fmt.Errorf("lease %s changed while its grant settled: %w", h.name, backend.ErrNotHeld)
			}
			d.giveBack(h)
			return time.Time{}, err
		}
		h.setLast(got)
	}
	return start, nil
}

// wait is Acquire's waiting loop. Its first attempt reads the Lease (or
// uses the driver's watch of it, if one runs); then it follows the watch the
// driver's waiters for the Lease share, and attempts on the state each
// change shows, when the holder's time ends, and reads the Lease again at
// least every poll interval (and after errors, while the watch is down).
// Of the driver's waiters, only one writes a grant from a given state.
func (d *Driver) wait(ctx context.Context, req backend.AcquireRequest, h *hold, valid time.Duration) (*backend.Grant, error) {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(d.bg, stop)() // Close ends the wait
	kw := d.runningWatch(h.name)
	defer func() {
		if kw != nil {
			d.leaveWatch(kw)
		}
	}()
	var bo backend.Backoff
	var lastErr error
	read := kw == nil || !kw.state().live // attempt on a read of the Lease, not the watched state
	for {
		if d.closed.Load() {
			return nil, errClosed
		}
		var st watchState
		if kw != nil {
			st = kw.state()
		}
		var (
			g     *backend.Grant
			until time.Time
			err   error
		)
		switch {
		case read:
			g, until, err = d.attempt(ctx, req, h, valid)
		case st.gen > 0:
			g, until, err = d.attemptOn(ctx, req, h, valid, st.lease, func() bool { return kw.claim(st.gen) })
		}
		switch {
		case g != nil:
			return g, nil
		case err != nil && (!transient(err) || ctx.Err() != nil):
			if d.closed.Load() {
				return nil, errClosed
			}
			return nil, waitEnded(ctx, err)
		case err != nil:
			lastErr = err
		case read || st.gen > 0:
			lastErr = nil
			bo.Reset()
		}
		if kw == nil {
			if kw, err = d.joinWatch(h.name); err != nil {
				return nil, err
			}
			st = kw.state()
		}
		next, readNext := backend.Jitter(d.poll), true
		if !until.IsZero() {
			// A few milliseconds past the end, so that the attempt finds it over.
			if e := time.Until(until) + 5*time.Millisecond; e < next {
				next, readNext = e, false
			}
		}
		if lastErr != nil || st.down {
			if b := bo.Next(); b < next {
				next, readNext = b, true
			}
		}
		timer := time.NewTimer(max(next, 0))
		select {
		case <-wctx.Done():
			timer.Stop()
			if d.closed.Load() {
				return nil, errClosed
			}
			return nil, waitEnded(ctx, lastErr)
		case <-timer.C:
			read = readNext
		case <-st.changed:
			timer.Stop()
			read = false
		}
	}
}

// Refresh implements backend.Driver: an update of the Lease's renewTime and
// duration conditional on the holder's last write. When that write is stale
// because an earlier refresh was applied with its answer lost, it reads the
// Lease, and carries on if it is still the holder's grant.
func (d *Driver) Refresh(ctx context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	h, ok := g.Data.(*hold)
	if !ok {
		return 0, fmt.Errorf("k8s driver: grant of another driver")
	}
	valid, err := validity(ttl)
	if err != nil {
		return 0, err
	}
	var bo backend.Backoff
	for {
		l := h.current()
		now := metav1.NewMicroTime(time.Now())
		secs := ttlSeconds(ttl)
		l.Spec.RenewTime = &now
		l.Spec.LeaseDurationSeconds = &secs
		rctx, cancel := context.WithTimeout(ctx, d.timeout)
		got, err := d.leases.Update(rctx, l, updateOpts)
		if err == nil {
			cancel()
			h.setLast(got)
			return valid, nil
		}
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			cur, gerr := d.leases.Get(rctx, h.name, metav1.GetOptions{})
			cancel()
			switch {
			case apierrors.IsNotFound(gerr):
				return 0, fmt.Errorf("lease %s deleted: %w", h.name, backend.ErrNotHeld)
			case gerr != nil:
				err = gerr
			case !mine(cur, h):
				return 0, fmt.Errorf("lease %s taken or released by another: %w", h.name, backend.ErrNotHeld)
			default:
				h.setLast(cur) // an earlier write was applied
				continue
			}
		} else {
			cancel()
		}
		if !transient(err) || ctx.Err() != nil {
			return 0, waitEnded(ctx, err)
		}
		if err := backend.Sleep(ctx, bo.Next()); err != nil {
			return 0, waitEnded(ctx, err)
		}
	}
}

// Release implements backend.Driver: an update that clears the holder,
// conditional on the holder's last write. The Lease stays, with its
// leaseTransitions, so that the next grant's token is higher.
func (d *Driver) Release(ctx context.Context, g *backend.Grant) error {
	h, ok := g.Data.(*hold)
	if !ok {
		return fmt.Errorf("k8s driver: grant of another driver")
	}
	h.mu.Lock()
	h.released = true
	stop := h.stop
	h.mu.Unlock()
	if stop != nil {
		stop()
	}
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	return d.release(rctx, h)
}

func (d *Driver) release(ctx context.Context, h *hold) error {
	for {
		_, err := d.leases.Update(ctx, releasedLease(h.current()), updateOpts)
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return err
		}
		cur, gerr := d.leases.Get(ctx, h.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(gerr):
			return fmt.Errorf("lease %s deleted: %w", h.name, backend.ErrNotHeld)
		case gerr != nil:
			return gerr
		case !mine(cur, h):
			return fmt.Errorf("lease %s taken or released by another: %w", h.name, backend.ErrNotHeld)
		}
		h.setLast(cur) // a refresh was applied with its answer lost
	}
}

// giveBack releases a grant that raced its caller's end.
func (d *Driver) giveBack(h *hold) {
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	h.mu.Lock()
	h.released = true
	h.mu.Unlock()
	_ = d.release(ctx, h)
}
