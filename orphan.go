package dlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock/backend"
)

// errOrphaned is the cause an orphaned lease ends with (it matches
// ErrReleased).
var errOrphaned = errors.New("orphaned: the lock stays on the backend until its TTL runs out")

// Orphan ends the lease without releasing its lock, which stays on the
// backend, renewed by no one, until its TTL runs out (Done closes; Err matches
// ErrReleased). It fails with errors.ErrUnsupported where locks live with a
// session (PostgreSQL, MySQL, ZooKeeper) or for a nested hold, leaving the lease held.
func (l *Lease) Orphan(ctx context.Context) error {
	if l.outer != nil {
		return l.locker.errorf("orphan", l.Key(), fmt.Errorf("a nested hold cannot be orphaned: %w", errors.ErrUnsupported))
	}
	o, ok := l.locker.drv.(backend.Orphaner)
	if !ok {
		return errUnsupported(l.locker.name, "orphan", "leave a lock to expire on its own")
	}
	if !l.locker.enter() {
		return l.heldErrOr("orphan", ErrClosed)
	}
	defer l.locker.inflight.Done()
	l.expireIfPast()
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return l.heldErr("orphan")
	}
	l.state = releasing
	l.mu.Unlock()
	l.locker.sched.unschedule(l)

	l.calls.RLock()
	err := o.Orphan(ctx, l.grant)
	l.calls.RUnlock()
	switch {
	case err == nil:
		l.end(releasing, withKind(ErrReleased, errOrphaned))
		return nil
	case errors.Is(err, backend.ErrNotHeld):
		l.end(releasing, withKind(ErrLeaseLost, err))
		return l.Err()
	default:
		// Whether the lock stays is unknown; it frees itself after its TTL
		// at the latest, and nobody renews it.
		l.end(releasing, withKind(ErrReleased, fmt.Errorf("orphan not confirmed: %w", err)))
		return l.locker.errorf("orphan", l.Key(), err)
	}
}
