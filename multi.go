package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// LeaseSet is a set of leases taken all or nothing by AcquireAll or
// TryAcquireAll: every key of the set is held, each with its own lease and
// fencing token, until the set is released or one of them ends. Its methods
// are safe for concurrent use.
type LeaseSet struct {
	leases []*Lease // in key order

	ctx    context.Context // cancelled, with the first lease's error as cause, when any lease ends
	cancel context.CancelCauseFunc
	stops  []func() bool

	mu       sync.Mutex
	released bool
}

// AcquireAll takes every key in keys on l, or none: it acquires them one at a
// time in sorted order, waiting for each as Acquire does, so that two callers
// asking for overlapping sets never deadlock (the one that holds the lowest
// common key goes first). If any acquire fails — ctx ends, the Locker closes,
// the backend fails — the leases already taken are released before it
// returns, and the error names the key that failed (it matches what that
// Acquire's error matches: ErrNotAcquired and ctx.Err() when ctx ended).
//
// opts apply to every key. keys must not be empty or name a key twice (an
// error matching ErrInvalidKey). With WithReentrant, keys that ctx already
// holds on l are nested holds.
func AcquireAll(ctx context.Context, l Locker, keys []string, opts ...Option) (*LeaseSet, error) {
	return acquireAll(ctx, l, keys, true, opts)
}

// TryAcquireAll is AcquireAll with one attempt per key: if any key is held by
// another owner, it releases the keys it took and returns an error matching
// ErrNotAcquired that names that key.
func TryAcquireAll(ctx context.Context, l Locker, keys []string, opts ...Option) (*LeaseSet, error) {
	return acquireAll(ctx, l, keys, false, opts)
}

func acquireAll(ctx context.Context, l Locker, keys []string, wait bool, opts []Option) (*LeaseSet, error) {
	sorted, err := sortedKeys(keys)
	if err != nil {
		return nil, err
	}
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
	set := &LeaseSet{leases: leases}
	set.ctx, set.cancel = context.WithCancelCause(context.Background())
	for _, lease := range leases {
		set.stops = append(set.stops, context.AfterFunc(lease.ctx, func() { set.cancel(lease.Err()) }))
	}
	return set, nil
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

// releaseAll releases leases, the last taken first, each on a detached
// context bounded by its release timeout.
func releaseAll(leases []*Lease) error {
	errs := make([]error, len(leases))
	for i := len(leases) - 1; i >= 0; i-- {
		errs[i] = leases[i].Release(context.Background())
	}
	return errors.Join(errs...)
}

// Leases returns the set's leases in key order (sorted). Each has its own
// token: send each key's token to the resource that key protects.
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

// Done returns a channel that is closed when any lease of the set ends
// (released, expired or lost): from then on the set no longer holds every
// key.
func (s *LeaseSet) Done() <-chan struct{} { return s.ctx.Done() }

// Err returns nil while every lease of the set is held; afterwards, the error
// of the first lease that ended (matching ErrLeaseLost if it was lost, or
// ErrReleased).
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

// Release releases every lease of the set, the last key first, and returns
// the errors of those that were not cleanly released (a lease that was lost
// reports ErrLeaseLost, as Lease.Release does). A second Release returns an
// error matching ErrReleased.
func (s *LeaseSet) Release(ctx context.Context) error {
	s.mu.Lock()
	if s.released {
		s.mu.Unlock()
		return &Error{Op: "release-all", Err: ErrReleased}
	}
	s.released = true
	s.mu.Unlock()
	errs := make([]error, len(s.leases))
	for i := len(s.leases) - 1; i >= 0; i-- {
		errs[i] = s.leases[i].Release(ctx)
	}
	for _, stop := range s.stops {
		stop()
	}
	s.cancel(&Error{Op: "release-all", Err: ErrReleased})
	return errors.Join(errs...)
}
