// Package conformance is the one test suite every dlock driver runs: the same
// safety, fencing and liveness tests, through the public dlock.Locker API, on
// real servers.
//
// A driver's test file provides a Harness and calls Run:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, &harness{srv: testenv.StartRedis(t)})
//	}
//
// A test that needs a capability the driver does not claim is skipped, with the
// reason; every capability a driver claims is proved.
//
// # Faults
//
// A Harness that can also break its deployment implements FaultHarness: a
// LinkedDSN whose connections pass through a breakable proxy, and server
// faults (restart, stall, kill the leader, the effect of a clock jump).
// RunFaults runs a trial per cell of the driver's Matrix — the expected
// Outcome of each fault, stated in the driver's test file — and fails when a
// trial's outcome is not the one claimed; Soak runs several processes of
// lockers under a fault every few seconds. Both need Main in the package's
// TestMain, because paused holders and soak workers are child processes
// (the test binary, re-executed). Results go to $DLOCK_SAFETY_OUT, from which
// conformance/cmd/safety-report writes docs/SAFETY.md.
package conformance

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Harness connects the suite to one deployment of one backend.
type Harness interface {
	// NewLocker returns an independent client, as a separate process would have
	// (its own connections, its own sessions). The suite closes it; the harness
	// may also close it in t.Cleanup (a second Close returning ErrClosed is fine).
	NewLocker(t testing.TB) dlock.Locker

	// Expire makes the backend forget the current holder of key behind the
	// holder's back, as the server would on expiry: DEL the lock key, revoke the
	// lease, kill the session. The next grant of key must still get a higher
	// token.
	Expire(t testing.TB, key string)
}

// ShortTTLer is an optional interface a Harness implements when its backend
// cannot honour the suite's default short TTL (DefaultShortTTL), e.g. etcd,
// whose leases last at least a few seconds.
type ShortTTLer interface {
	// ShortTTL is the shortest TTL the backend honours to within ~10%.
	ShortTTL() time.Duration
}

// DefaultShortTTL is the TTL the suite gives leases in tests that wait for an
// expiry, unless the Harness implements ShortTTLer.
const DefaultShortTTL = 1 * time.Second

// WaiterCounter is an optional interface on a Harness: Waiters reports how
// many clients the backend knows to be waiting for key (subscribers to its
// release channel, queued nodes or keys, sessions blocked on its advisory
// lock). The push-wait test waits for it to see the waiter before it
// releases, so the waiter is known to be waiting; without it, the test gives
// the waiter a moment and says the proof is weaker.
type WaiterCounter interface {
	Waiters(t testing.TB, key string) int
}

// SlowPoller is an optional interface on a Harness whose driver falls back
// to polling while it waits (Redis, Redlock): NewSlowPollLocker returns a
// locker whose polling interval is far above PushWaitBound, so only a
// push-based wake-up can meet the bound.
type SlowPoller interface {
	NewSlowPollLocker(t testing.TB) dlock.Locker
}

// PushWaitBound is how soon after a release a known waiter must be granted
// the lock on a backend that claims Capabilities().PushWait: well below any
// polling fallback (dlock's default poll interval is 0.5–1s, and the suite
// raises it further through SlowPoller).
const PushWaitBound = 250 * time.Millisecond

// Inspector is an optional interface on a Harness: Residue lists what the
// backend still stores for key (lock keys, queued nodes, waiting sessions,
// advisory locks), but not what it keeps by design (fence counters). The
// suite checks that nothing is left once a key's holders released and its
// waiters gave up, and the fault suite after each trial.
type Inspector interface {
	Residue(t testing.TB, key string) []string
}
