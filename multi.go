package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/clock"
	"github.com/dlock-go/dlock/observe"
)

// LeaseSet is the leases of keys taken all or nothing by AcquireAll, each
// with its own token; its methods are safe for concurrent use.
type LeaseSet struct {
	leases []*Lease // in key order

	ctx    context.Context // cancelled, with the first lease's error as cause, when any lease ends
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	released bool
}

// MultiAcquirer, behind [AcquireAll] and [TryAcquireAll], is implemented by
// Open's and New's Lockers; without it, a wrapper's sets are taken key by key.
type MultiAcquirer interface {
	AcquireAll(ctx context.Context, keys []string, opts ...AcquireOption) (*LeaseSet, error)
	TryAcquireAll(ctx context.Context, keys []string, opts ...AcquireOption) (*LeaseSet, error)
}

// AcquireAll takes every key of keys on l, or none, waiting as Acquire does,
// in sorted order so that overlapping sets never deadlock. On failure it
// releases what it took; the error names the key. Empty or repeated keys are
// [ErrInvalidKey], and a re-entrant set held out of order [ErrLockOrder].
func AcquireAll(ctx context.Context, l Locker, keys []string, opts ...AcquireOption) (*LeaseSet, error) {
	if m, ok := l.(MultiAcquirer); ok {
		return m.AcquireAll(ctx, keys, opts...)
	}
	return acquireAll(ctx, l, nil, keys, true, opts)
}

// TryAcquireAll is AcquireAll with one attempt per key: if a key is held, it
// releases the keys it took and returns an error matching [ErrNotAcquired].
func TryAcquireAll(ctx context.Context, l Locker, keys []string, opts ...AcquireOption) (*LeaseSet, error) {
	if m, ok := l.(MultiAcquirer); ok {
		return m.TryAcquireAll(ctx, keys, opts...)
	}
	return acquireAll(ctx, l, nil, keys, false, opts)
}

func (l *locker) AcquireAll(ctx context.Context, keys []string, opts ...AcquireOption) (*LeaseSet, error) {
	return acquireAll(ctx, l, l, keys, true, opts)
}

func (l *locker) TryAcquireAll(ctx context.Context, keys []string, opts ...AcquireOption) (*LeaseSet, error) {
	return acquireAll(ctx, l, l, keys, false, opts)
}

// acquireAll is AcquireAll (wait) or TryAcquireAll on l; lk is l if l is a
// Locker of this package (its atomic step and its lock-order check), else nil.
func acquireAll(ctx context.Context, l Locker, lk *locker, keys []string, wait bool, opts []AcquireOption) (*LeaseSet, error) {
	sorted, err := sortedKeys(keys)
	if err != nil {
		return nil, err
	}
	if lk != nil && wait {
		if err := lk.lockOrder(ctx, sorted, opts); err != nil {
			return nil, err
		}
	}
	if len(sorted) > 1 {
		err := errNoAtomic
		var leases []*Lease
		if lk != nil {
			leases, err = lk.tryAll(ctx, sorted, opts)
		}
		if errors.Is(err, errNoAtomic) {
			leases, err = tryEach(ctx, l, sorted, opts)
		}
		switch {
		case err == nil:
			return newLeaseSet(leases), nil
		case wait && ctx.Err() == nil:
			// One key at a time, below: a key was held, or a try failed
			// (a node slow to answer, a transient error) where a waiting
			// Acquire rides it out.
		case wait:
			// The wait was cancelled while the try was out: report that, as
			// a cancelled Acquire does, with what the try found.
			return nil, fmt.Errorf("all of %d keys: %w: %w (the first try: %w)", len(sorted), ErrNotAcquired, context.Cause(ctx), err)
		default:
			return nil, fmt.Errorf("all of %d keys: %w", len(sorted), err)
		}
	}
	for {
		leases := make([]*Lease, 0, len(sorted))
		for _, k := range sorted {
			var lease *Lease
			if wait {
				lease, err = l.Acquire(ctx, k, opts...)
			} else {
				lease, err = l.TryAcquire(ctx, k, opts...)
			}
			if err != nil {
				releaseAll(leases)
				return nil, fmt.Errorf("all of %d keys: %w", len(sorted), err)
			}
			leases = append(leases, lease)
		}
		// Waiting for a later key may have outlasted an earlier key's lease
		// (a renewal that failed meanwhile, a lock broken): never hand out a
		// set that is already lost.
		lost := slices.IndexFunc(leases, func(lease *Lease) bool { return lease.Err() != nil })
		if lost < 0 {
			return newLeaseSet(leases), nil
		}
		lerr := leases[lost].Err()
		releaseAll(leases)
		if !wait {
			return nil, fmt.Errorf("all of %d keys: %w: %q was lost before the others were taken: %w", len(sorted), ErrNotAcquired, leases[lost].Key(), lerr)
		}
	}
}

func newLeaseSet(leases []*Lease) *LeaseSet {
	set := &LeaseSet{leases: leases}
	set.ctx, set.cancel = context.WithCancelCause(context.Background())
	for _, lease := range leases {
		lease.afterEnd(set, func() { set.cancel(lease.Err()) })
	}
	return set
}

// parallelism bounds the requests in flight of one tryEach or one release of
// a set.
const parallelism = 16

// forEach calls f(0) … f(n-1), up to parallelism at a time, and returns when
// every call has.
func forEach(n int, f func(i int)) {
	if n == 1 {
		f(0)
		return
	}
	var g errgroup.Group
	g.SetLimit(parallelism)
	for i := range n {
		g.Go(func() error { f(i); return nil })
	}
	_ = g.Wait()
}

// tryEach tries every key of sorted at once, one TryAcquire each: all the
// leases, or, if any try failed, it releases the ones taken and returns the
// first error that is not ErrNotAcquired, else the first error.
func tryEach(ctx context.Context, l Locker, sorted []string, opts []AcquireOption) ([]*Lease, error) {
	leases := make([]*Lease, len(sorted))
	errs := make([]error, len(sorted))
	forEach(len(sorted), func(i int) { leases[i], errs[i] = l.TryAcquire(ctx, sorted[i], opts...) })
	var first, held error
	taken := make([]*Lease, 0, len(sorted))
	for i, err := range errs {
		switch {
		case err == nil:
			taken = append(taken, leases[i])
		case !errors.Is(err, ErrNotAcquired) && first == nil:
			first = err
		case held == nil:
			held = err
		}
	}
	if first == nil {
		first = held
	}
	if first != nil {
		_ = releaseAll(taken)
		return nil, first
	}
	return leases, nil
}

// errNoAtomic means the Locker cannot take a set of keys in one step.
var errNoAtomic = errors.New("no atomic multi-key acquire")

// tryAll takes every key of sorted (sorted, distinct, more than one) in one
// atomic step of the driver (backend.MultiAcquirer): all leases, or an error
// matching ErrNotAcquired if one is held, or errNoAtomic if the driver
// cannot, or the acquire is re-entrant (nested holds are per key), shared or
// counted.
func (l *locker) tryAll(ctx context.Context, sorted []string, opts []AcquireOption) ([]*Lease, error) {
	ma, ok := l.drv.(backend.MultiAcquirer)
	if !ok {
		return nil, errNoAtomic
	}
	s, err := l.settingsFor(opts)
	if err != nil {
		return nil, l.errorf("acquire-all", sorted[0], err)
	}
	if s.reentrant || s.shared || s.permits > 0 {
		return nil, errNoAtomic
	}
	if err := ctx.Err(); err != nil {
		return nil, l.errorf("acquire-all", sorted[0], withKind(ErrNotAcquired, err))
	}
	if !l.enter() {
		return nil, l.errorf("acquire-all", sorted[0], ErrClosed)
	}
	defer l.inflight.Done()

	began := time.Now()
	dones := make([]func(observe.AcquireOutcome) observe.LeaseObserver, len(sorted))
	if l.obs != nil {
		for i, k := range sorted {
			_, dones[i] = l.obs.StartAcquire(ctx, observe.AcquireInfo{Backend: l.name, Key: k, Wait: false})
		}
	}
	called, at := clock.Read(l.clk) // as in grantLease
	reqs := make([]backend.AcquireRequest, len(sorted))
	lost := make([]*lossLatch, len(sorted))
	for i, k := range sorted {
		lost[i] = new(lossLatch)
		reqs[i] = backend.AcquireRequest{Key: k, Owner: backend.NewOwnerID(), TTL: s.ttl, Label: s.label, Announce: s.announce, OnLost: lost[i].fire}
	}
	gs, err := ma.TryAcquireAll(ctx, reqs)
	if err == nil && len(gs) != len(reqs) {
		for _, g := range gs {
			l.releaseDetached(g, s.releaseTimeout)
		}
		err = fmt.Errorf("driver returned %d grants for %d keys", len(gs), len(reqs))
	}
	if err != nil {
		err = l.acquireErr(ctx, err)
		for _, done := range dones {
			if done != nil {
				done(observe.AcquireOutcome{Result: resultOf(ctx, err), Took: time.Since(began), Err: err})
			}
		}
		return nil, l.errorf("acquire-all", strings.Join(sorted, ", "), err)
	}
	leases := make([]*Lease, 0, len(gs))
	for i, g := range gs {
		var onGrant func(*Lease)
		if done := dones[i]; done != nil {
			onGrant = func(lease *Lease) {
				lease.obs = done(observe.AcquireOutcome{Result: observe.ResultGranted, Token: uint64(lease.Token()), Took: time.Since(began)})
			}
		}
		lease, err := l.hold("acquire-all", g, s, lost[i], called, at, onGrant)
		if err != nil {
			releaseAll(leases)
			for _, g := range gs[i+1:] {
				l.releaseDetached(g, s.releaseTimeout)
			}
			return nil, err
		}
		leases = append(leases, lease)
	}
	return leases, nil
}

// lockOrder returns an error matching ErrLockOrder if the acquires of
// sorted with opts are re-entrant and ctx holds, on l, a key of sorted that
// sorts above one it does not hold.
func (l *locker) lockOrder(ctx context.Context, sorted []string, opts []AcquireOption) error {
	s, err := l.settingsFor(opts)
	if err != nil || !s.reentrant || s.permits > 0 {
		return nil // a bad option is reported by the acquire
	}
	free := ""
	for _, k := range sorted {
		held := enclosing(ctx, l, k)
		switch {
		case held == nil || held.Err() != nil:
			if free == "" {
				free = k
			}
		case free != "":
			return l.errorf("acquire-all", k, withKind(ErrNotAcquired, fmt.Errorf("%w: ctx holds %q and would wait for %q, which sorts below it (a deadlock with another AcquireAll of both)", ErrLockOrder, k, free)))
		}
	}
	return nil
}

// sortedKeys returns keys sorted, or an error if it is empty or has a
// duplicate or an invalid key.
func sortedKeys(keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, &Error{Op: "acquire-all", Err: fmt.Errorf("%w: no keys", ErrInvalidKey)}
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	for i, k := range sorted {
		if err := validateKey(k); err != nil {
			return nil, &Error{Op: "acquire-all", Key: k, Err: err}
		}
		if i > 0 && sorted[i-1] == k {
			return nil, &Error{Op: "acquire-all", Key: k, Err: fmt.Errorf("%w: key listed twice", ErrInvalidKey)}
		}
	}
	return sorted, nil
}

// releaseAll releases leases, up to parallelism at a time, each on a
// detached context bounded by its release timeout.
func releaseAll(leases []*Lease) error {
	errs := make([]error, len(leases))
	forEach(len(leases), func(i int) { errs[i] = leases[i].Release(context.Background()) })
	return errors.Join(errs...)
}

// Leases returns the set's leases in key order.
func (s *LeaseSet) Leases() []*Lease { return slices.Clone(s.leases) }

// Lease returns the set's lease of key, or nil if key is not in the set.
func (s *LeaseSet) Lease(key string) *Lease {
	i, ok := slices.BinarySearchFunc(s.leases, key, func(l *Lease, k string) int {
		switch {
		case l.Key() < k:
			return -1
		case l.Key() > k:
			return 1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return s.leases[i]
}

// Done returns a channel that is closed when any lease of the set ends.
func (s *LeaseSet) Done() <-chan struct{} { return s.ctx.Done() }

// Err returns nil while every lease of the set is held, then the error of
// the first that ended ([ErrLeaseLost] or [ErrReleased]).
func (s *LeaseSet) Err() error {
	for _, l := range s.leases {
		if err := l.Err(); err != nil {
			s.cancel(err)
		}
	}
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// Release releases every lease of the set and returns the errors of those not
// cleanly released; a second Release returns [ErrReleased].
func (s *LeaseSet) Release(ctx context.Context) error {
	s.mu.Lock()
	if s.released {
		s.mu.Unlock()
		return &Error{Op: "release-all", Err: ErrReleased}
	}
	s.released = true
	s.mu.Unlock()
	for _, lease := range s.leases {
		lease.stopAfterEnd(s) // the set's ctx ends as released, not as a lease's end
	}
	errs := make([]error, len(s.leases))
	forEach(len(s.leases), func(i int) { errs[i] = s.leases[i].Release(ctx) })
	s.cancel(&Error{Op: "release-all", Err: ErrReleased})
	return errors.Join(errs...)
}
