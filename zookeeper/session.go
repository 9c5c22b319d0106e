package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/clock"
)

// Why a session, as the driver sees it, ended.
var (
	errSessionExpired = errors.New("the ZooKeeper session expired: the server deleted its lock nodes")
	errSuspended      = errors.New("disconnected from ZooKeeper for as long as the session timeout: the server may have expired the session")
	errNoSession      = errors.New("no live ZooKeeper session (disconnected)")
)

// session is one ZooKeeper session as the driver knows it. Every lock node the
// driver creates is ephemeral, so it lives exactly as long as its session, and
// every grant made in the session registers its AcquireRequest.OnLost with
// it: when the session ends, every lease of it ends at once, with one call
// each and no goroutine per lease.
//
// A session is lost (lost is closed) when the server says it expired, or when
// the connection has been gone for so long that the server may have expired
// it: the session timeout, less the drift allowance, after the latest moment
// the server is known to have heard from the session (Curator's rule: while
// suspended you cannot know you still hold a lock; past the timeout you must
// assume you do not). If the same session comes back after that, the driver
// treats it as a new one: the leases of the old one stay lost.
type session struct {
	id      int64
	timeout time.Duration // as negotiated with the server
	lost    chan struct{}

	mu      sync.Mutex
	lastAck time.Duration             // on sessions.clk: the leader heard from the session no earlier than this
	why     error                     // why lost was closed
	onLost  map[*lockNode]func(error) // the grants' loss callbacks, until released
}

// watch registers f to be called once, with the reason, when s is lost; at
// once if it is lost already. unwatch drops it (the grant was released).
func (s *session) watch(n *lockNode, f func(error)) {
	if f == nil {
		return
	}
	s.mu.Lock()
	if s.why == nil {
		if s.onLost == nil {
			s.onLost = map[*lockNode]func(error){}
		}
		s.onLost[n] = f
		s.mu.Unlock()
		return
	}
	why := s.why
	s.mu.Unlock()
	f(why)
}

func (s *session) unwatch(n *lockNode) {
	s.mu.Lock()
	delete(s.onLost, n)
	s.mu.Unlock()
}

func (s *session) isLost() bool {
	select {
	case <-s.lost:
		return true
	default:
		return false
	}
}

// err says why the session was lost.
func (s *session) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.why == nil {
		return errNoSession
	}
	return s.why
}

// lose closes s.lost once and tells every grant of the session; callers
// hold sessions.mu. The callbacks (dlock's OnLost) never block.
func (s *session) lose(why error) {
	if s.isLost() {
		return
	}
	s.mu.Lock()
	s.why = why
	watchers := s.onLost
	s.onLost = nil
	s.mu.Unlock()
	close(s.lost)
	for _, f := range watchers {
		f(why)
	}
}

// sessions tracks the driver's current session and its connection state, fed
// by go-zookeeper's session events (or, for a connection the driver does not
// own, by polling its state).
type sessions struct {
	clk       clock.Clock // counts a host suspend, as the servers' clocks do
	mu        sync.Mutex
	cur       *session
	lastID    int64         // id of the latest session the server granted
	connected bool          // cur's connection is up
	changed   chan struct{} // closed and replaced whenever cur changes
	timer     *time.Timer   // while suspended: loses cur when it may have expired
	closed    bool
}

func newSessions() *sessions {
	return &sessions{clk: clock.System, changed: make(chan struct{})}
}

// onClock maps t, read before a request was sent, onto ss.clk: if the host was
// suspended since, t maps earlier than it truly was, the safe side. A zero t
// maps to the clock's origin, long past.
func (ss *sessions) onClock(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return ss.clk.Now() - time.Since(t)
}

// established records that the connection has a session: id, with the given
// negotiated timeout; the handshake was sent at sent (zero if unknown).
func (ss *sessions) established(id int64, timeout time.Duration, sent time.Time) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed || id == 0 {
		return
	}
	ss.connected = true
	ss.stopTimer()
	if c := ss.cur; c != nil && c.id == id && !c.isLost() {
		return // reconnected within the session
	}
	if ss.cur != nil {
		ss.cur.lose(errSessionExpired)
	}
	ss.cur = &session{id: id, timeout: timeout, lost: make(chan struct{}), lastAck: ss.onClock(sent)}
	ss.lastID = id
	close(ss.changed)
	ss.changed = make(chan struct{})
}

// disconnected records that the connection is down. The session is suspended:
// it is lost when the server may have expired it.
func (ss *sessions) disconnected() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed || !ss.connected {
		return
	}
	ss.connected = false
	c := ss.cur
	if c == nil || c.isLost() {
		return
	}
	c.mu.Lock()
	deadline := c.lastAck + c.timeout - backend.DriftAllowance(c.timeout)
	c.mu.Unlock()
	ss.stopTimer()
	ss.armLocked(c, deadline)
}

// armLocked loses c at deadline (on ss.clk) unless it reconnects first. Go's
// timers do not count a host suspend, so the timer never sleeps longer than
// clock.MaxSleep before it reads the clock again. Callers hold ss.mu.
func (ss *sessions) armLocked(c *session, deadline time.Duration) {
	ss.timer = time.AfterFunc(min(max(deadline-ss.clk.Now(), 0), clock.MaxSleep), func() {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if ss.connected || ss.cur != c || ss.closed {
			return
		}
		if ss.clk.Now() < deadline {
			ss.armLocked(c, deadline)
			return
		}
		c.lose(errSuspended)
	})
}

// expired records that the server refused the session as expired.
func (ss *sessions) expired() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.connected = false
	ss.stopTimer()
	if ss.cur != nil {
		ss.cur.lose(errSessionExpired)
	}
}

func (ss *sessions) stopTimer() {
	if ss.timer != nil {
		ss.timer.Stop()
		ss.timer = nil
	}
}

// ack records that the server heard from session id no earlier than t: t is
// when a request it answered was sent.
func (ss *sessions) ack(id int64, t time.Time) {
	ss.mu.Lock()
	c := ss.cur
	ss.mu.Unlock()
	if c == nil || c.id != id {
		return
	}
	at := ss.onClock(t)
	c.mu.Lock()
	if at > c.lastAck {
		c.lastAck = at
	}
	c.mu.Unlock()
}

// current returns the current session, lost or not, or nil before the first.
func (ss *sessions) current() *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.cur
}

// gone reports whether session id has certainly ended: the server has since
// granted another session (go-zookeeper asks for a new one only after the old
// one was refused as expired), or the driver is closed.
func (ss *sessions) gone(id int64) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.closed || ss.lastID != id
}

// live returns the current session if it is not lost. Otherwise, if wait is
// set, it waits for a new session until ctx is done or quit is closed; if not,
// it fails at once.
func (ss *sessions) live(ctx context.Context, wait bool, quit <-chan struct{}) (*session, error) {
	for {
		ss.mu.Lock()
		c, changed, closed := ss.cur, ss.changed, ss.closed
		ss.mu.Unlock()
		switch {
		case closed:
			return nil, errClosed
		case c != nil && !c.isLost():
			return c, nil
		case !wait:
			if c != nil {
				return nil, fmt.Errorf("%w: %w", errNoSession, c.err())
			}
			return nil, errNoSession
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for a ZooKeeper session: %w", ctx.Err())
		case <-quit:
			return nil, errClosed
		}
	}
}

// close loses the current session and stops tracking.
func (ss *sessions) close() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.closed = true
	ss.stopTimer()
	if ss.cur != nil {
		ss.cur.lose(errClosed)
	}
	close(ss.changed)
	ss.changed = make(chan struct{})
}
