package k8s

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dlock-go/dlock/backend"
)

// hold is a granted lock's state, the Grant's Data.
type hold struct {
	name        string // the Lease's name
	key         string
	owner       string
	transitions int32 // the grant's leaseTransitions: another grant changes it
	token       uint64
	onLost      func(cause error)

	mu       sync.Mutex
	last     *coordinationv1.Lease // the holder's last write, as the server stored it
	released bool
	lost     bool
	stop     context.CancelFunc // ends the loss watch
}

// current returns a copy of the holder's last write.
func (h *hold) current() *coordinationv1.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last.DeepCopy()
}

func (h *hold) setLast(l *coordinationv1.Lease) {
	h.mu.Lock()
	h.last = l
	h.mu.Unlock()
}

// markLost tells dlock, once, that the lock is gone, unless it was released.
func (h *hold) markLost(cause error) {
	h.mu.Lock()
	report := !h.released && !h.lost
	h.lost = true
	h.mu.Unlock()
	if report && h.onLost != nil {
		h.onLost(cause)
	}
}

// mine reports whether l is still h's grant: dlock's owner annotation is
// h's and no grant has happened since (every grant, dlock's or client-go's
// leader election's, changes leaseTransitions).
func mine(l *coordinationv1.Lease, h *hold) bool {
	return l != nil && holder(l) != "" && l.Annotations[AnnotationOwner] == h.owner &&
		transitions(l) == h.transitions
}

func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func transitions(l *coordinationv1.Lease) int32 {
	if l.Spec.LeaseTransitions == nil {
		return 0
	}
	return *l.Spec.LeaseTransitions
}

// identity is the holderIdentity of a dlock holder: its label, which
// client-go's leader election and kubectl show, or its owner ID without one.
func identity(label, owner string) string {
	if label != "" {
		return label
	}
	return owner
}

// token is the fencing token of l's current grant: the Lease's creation
// second (by the API server's clock) in the high 32 bits, leaseTransitions
// in the low ones. docs/k8s.md has why this increases across deletes.
func token(l *coordinationv1.Lease) uint64 {
	c := l.CreationTimestamp.Unix()
	if c < 0 {
		c = 0
	}
	return uint64(c)<<32 | uint64(uint32(transitions(l)))
}

// serverSecond is the latest time, in Unix seconds by the API server's
// clock, at which a field manager wrote l: the time of the write that
// returned l, or earlier.
func serverSecond(l *coordinationv1.Lease) int64 {
	var s int64
	for _, m := range l.ManagedFields {
		if m.Time != nil && m.Time.Unix() > s {
			s = m.Time.Unix()
		}
	}
	return s
}

// defaultForeignDuration is how long a Lease that states no duration is
// held after it was last seen to change.
const defaultForeignDuration = 60 * time.Second

// observation is when this driver first saw a version of a Lease.
type observation struct {
	rv   string
	seen time.Time
}

// observations remember, per Lease, when its current version was first
// seen: a holder's Lease expires by the observer's clock, leaseDuration
// after the observer first saw its last write (as client-go's leader
// election judges it), so that only clock rates must agree.
type observations struct {
	mu sync.Mutex
	m  map[string]observation
}

// maxObservations bounds the memory of observations: past it the map starts
// again, which only delays takeovers.
const maxObservations = 10000

// seen returns when rv of name was first seen, now if it is new.
func (o *observations) seen(name, rv string, now time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ob, ok := o.m[name]; ok && ob.rv == rv {
		return ob.seen
	}
	if len(o.m) >= maxObservations {
		clear(o.m)
	}
	o.m[name] = observation{rv: rv, seen: now}
	return now
}

func (o *observations) forget(name string) {
	o.mu.Lock()
	delete(o.m, name)
	o.mu.Unlock()
}

// heldUntil reports whether l is held, and until when by the local clock:
// its duration after this driver first saw its current version.
func (d *Driver) heldUntil(l *coordinationv1.Lease, now time.Time) (time.Time, bool) {
	if holder(l) == "" {
		return time.Time{}, false
	}
	dur := defaultForeignDuration
	if s := l.Spec.LeaseDurationSeconds; s != nil && *s > 0 {
		dur = time.Duration(*s) * time.Second
	}
	until := d.obs.seen(l.Name, l.ResourceVersion, now).Add(dur)
	return until, now.Before(until)
}

// ttlSeconds is the leaseDurationSeconds of a write of ttl: whole seconds,
// rounded up.
func ttlSeconds(ttl time.Duration) int32 {
	s := (ttl + time.Second - 1) / time.Second
	return int32(min(max(s, 1), math.MaxInt32))
}

// validity is what a write of ttl gives: a waiter takes the Lease over no
// sooner than ttlSeconds(ttl) ≥ ttl after it first saw the write, which is
// after the write was sent.
func validity(ttl time.Duration) (time.Duration, error) {
	v := ttl - backend.DriftAllowance(ttl)
	if v <= 0 {
		return 0, fmt.Errorf("%w: ttl %v is too short", backend.ErrInvalidOption, ttl)
	}
	return v, nil
}

// reqCtx returns the context of one write: ctx's values, the driver's
// request timeout, and an end cancelGrace after ctx's, so that the answer of
// a write racing ctx's end says what it did.
func (d *Driver) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.timeout)
	if ctx.Done() == nil {
		return rctx, cancel
	}
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(cancelGrace, cancel) })
	return rctx, func() { stop(); cancel() }
}

// definite reports whether err is the API server's answer (the write was
// refused), as opposed to a lost or missing answer, after which the write
// may have been applied.
func definite(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	return !apierrors.IsServerTimeout(err) && !apierrors.IsTimeout(err) && !apierrors.IsInternalError(err) &&
		!apierrors.IsServiceUnavailable(err)
}

// transient reports whether err may go away by itself: no answer, a
// timeout, an overloaded or restarting server.
func transient(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return true
	}
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}

// waitEnded returns ctx's error once ctx is done, keeping err (the last
// transient error) beside it.
func waitEnded(ctx context.Context, err error) error {
	switch cerr := ctx.Err(); {
	case cerr == nil:
		return err
	case err == nil || errors.Is(err, cerr):
		return cerr
	default:
		return fmt.Errorf("%w (while the API server was unreachable: %w)", cerr, err)
	}
}

// grantLease returns l (a copy of the current Lease, nil for none) changed
// into h's grant: h's identity and annotations, a fresh acquire and renew
// time, the duration of ttl, and leaseTransitions one up (0 for a new Lease).
func grantLease(l *coordinationv1.Lease, name string, h *hold, label string, ttl time.Duration) (*coordinationv1.Lease, error) {
	var next int32
	if l == nil {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
	} else {
		t := transitions(l)
		if t == math.MaxInt32 {
			return nil, fmt.Errorf("lease %s: leaseTransitions is at its maximum; delete the Lease to start a new epoch", name)
		}
		next = t + 1
	}
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[LabelLock] = "true"
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationOwner] = h.owner
	l.Annotations[AnnotationKey] = h.key
	if label != "" {
		l.Annotations[AnnotationLabel] = label
	} else {
		delete(l.Annotations, AnnotationLabel)
	}
	now := metav1.NewMicroTime(time.Now())
	id := identity(label, h.owner)
	secs := ttlSeconds(ttl)
	l.Spec.HolderIdentity = &id
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.AcquireTime = &now
	l.Spec.RenewTime = &now
	l.Spec.LeaseTransitions = &next
	l.Spec.Strategy = nil
	l.Spec.PreferredHolder = nil
	h.transitions = next
	return l, nil
}

// releasedLease returns a copy of l with no holder: what a release or a
// break writes. leaseTransitions stays, so the next grant's token is higher.
func releasedLease(l *coordinationv1.Lease) *coordinationv1.Lease {
	l = l.DeepCopy()
	empty := ""
	now := metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity = &empty
	l.Spec.RenewTime = &now
	delete(l.Annotations, AnnotationOwner)
	delete(l.Annotations, AnnotationLabel)
	return l
}

var updateOpts = metav1.UpdateOptions{FieldManager: FieldManager}
