package dlock

// Loss: how a lease learns it is lost, and what it does then.

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/observe"
)

// lossKind is an observe.LossCause in a byte, to keep Lease small.
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

// errDeadlinePassed is the cause of a lease that ran out of time.
var errDeadlinePassed = errors.New("deadline passed without a successful renewal")

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

// expireIfPast ends a held lease whose deadline has passed. Once Close has
// begun it only ends the lease: Close waits for its scheduler's goroutines,
// and no clean-up release may be started under it.
func (l *Lease) expireIfPast() { l.expireIfPastAt(l.locker.clk.Now()) }

// expireIfPastAt is expireIfPast with the locker's clock read as now.
func (l *Lease) expireIfPastAt(now time.Duration) {
	l.mu.Lock()
	past := l.state == held && now >= l.deadline
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
	// starts once the lease has ended, if this call ended it: a holder may
	// Close the Locker the moment it sees Done, and Close neither releases a
	// lost lease nor lets the scheduler start anything once it has begun.
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
