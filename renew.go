package dlock

// The keepalive: when a lease renews, and the renewal itself.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/clock"
	"github.com/dlock-go/dlock/observe"
)

// setDeadlineLocked records a grant or renewal sent at start (on the locker's
// clock) with validity v; wall and now are time.Now() and the locker's clock
// read at one moment since (clock.Read).
func (l *Lease) setDeadlineLocked(start, v time.Duration, wall time.Time, now time.Duration) {
	l.deadline = start + v
	l.deadlineAt = wall.Add(l.deadline - now)
	l.nextRenew = start + renewInterval(l.set.ttl, v)
}

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

// renewed records a successful renewal sent at start (on the locker's clock)
// with validity v.
func (l *Lease) renewed(start, v time.Duration) {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return
	}
	if start+v > l.deadline {
		wall, now := clock.Read(l.locker.clk)
		l.setDeadlineLocked(start, v, wall, now)
	} else {
		l.nextRenew = start + renewInterval(l.set.ttl, v)
	}
	next := l.nextEventLocked()
	l.mu.Unlock()
	l.locker.sched.schedule(l, next)
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
	// Its own context, not one derived from a context of the lease's (which
	// would keep a record of it for the rest of the lease): end cancels it.
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
