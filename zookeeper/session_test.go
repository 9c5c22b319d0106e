package zookeeper

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/clock"
)

// bubbleClock reads the time of the synctest bubble it was made in, plus a
// jump: what CLOCK_BOOTTIME shows across a host suspend, while Go's timers
// (and the bubble's time.Now) do not move.
type bubbleClock struct {
	origin time.Time
	jumped atomic.Int64
}

func (c *bubbleClock) Now() time.Duration {
	return time.Since(c.origin) + time.Duration(c.jumped.Load())
}

func newTestSessions() *sessions {
	ss := newSessions()
	ss.clk = &bubbleClock{origin: time.Now()}
	return ss
}

// A host suspend while the connection is down: the servers expire the session
// during it, and the driver must count it lost at its first look after resume
// (within clock.MaxSleep), not a whole session timeout of Go's timers later.
func TestSuspendWhileDisconnectedLosesSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 10 * time.Second
		ss := newTestSessions()
		ss.established(1, timeout, time.Now())
		s := ss.current()
		ss.disconnected()
		time.Sleep(time.Second)
		ss.clk.(*bubbleClock).jumped.Store(int64(time.Minute)) // the host slept a minute
		time.Sleep(clock.MaxSleep)
		synctest.Wait()
		if !s.isLost() || !errors.Is(s.err(), errSuspended) {
			t.Fatalf("session not lost %v after resuming from a suspend past its timeout", clock.MaxSleep)
		}
	})
}

// TestSuspendedSessionIsLost checks Curator's rule on a fake clock: a
// disconnected session is lost once the server may have expired it — the
// session timeout less the drift allowance after the server last heard from
// it — and not before.
func TestSuspendedSessionIsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 10 * time.Second
		limit := timeout - backend.DriftAllowance(timeout)
		ss := newTestSessions()
		start := time.Now()
		ss.established(1, timeout, start)
		s := ss.current()

		time.Sleep(3 * time.Second)
		ss.ack(1, time.Now()) // a ping sent at 3s was answered
		ss.ack(2, time.Now().Add(time.Hour))
		time.Sleep(time.Second)
		ss.disconnected() // at 4s: lost at 3s + limit

		time.Sleep(3*time.Second + limit - 4*time.Second - time.Millisecond)
		synctest.Wait()
		if s.isLost() {
			t.Fatalf("lost %v after the last ack, before %v", time.Since(start)-3*time.Second, limit)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if !s.isLost() || !errors.Is(s.err(), errSuspended) {
			t.Fatalf("not lost %v after the last ack (err %v)", limit, s.err())
		}

		// The same session comes back: a new one as far as leases go.
		ss.established(1, timeout, time.Now())
		if s2 := ss.current(); s2 == s || s2.isLost() || s2.id != 1 {
			t.Fatalf("after the session came back: %+v", s2)
		}
	})
}

func TestReconnectInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ss := newTestSessions()
		ss.established(1, 2*time.Second, time.Now())
		s := ss.current()
		ss.disconnected()
		time.Sleep(time.Second)
		ss.established(1, 2*time.Second, time.Now()) // reconnected, same session
		time.Sleep(time.Minute)
		synctest.Wait()
		if s.isLost() || ss.current() != s {
			t.Fatal("a session that reconnected in time was lost")
		}

		// Expired: lost at once, and the next session is another.
		ss.disconnected()
		ss.expired()
		if !s.isLost() || !errors.Is(s.err(), errSessionExpired) {
			t.Fatalf("expired session: lost=%v err=%v", s.isLost(), s.err())
		}
		if ss.gone(1) {
			t.Fatal("session 1 counted as gone before the server granted another")
		}
		if _, err := ss.live(context.Background(), false, nil); !errors.Is(err, errNoSession) {
			t.Fatalf("live without a session: %v", err)
		}
		got := make(chan *session, 1)
		go func() {
			s, _ := ss.live(context.Background(), true, nil)
			got <- s
		}()
		synctest.Wait()
		ss.established(2, 2*time.Second, time.Now())
		if s2 := <-got; s2 == nil || s2.id != 2 || !ss.gone(1) || ss.gone(2) {
			t.Fatalf("next session: %+v", s2)
		}
		ss.close()
		if !ss.current().isLost() || !ss.gone(2) {
			t.Fatal("close did not end the session")
		}
	})
}
