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
// reason; every capability a driver claims is proved. A FaultHarness can also
// break its deployment: RunFaults checks each fault's claimed Outcome (the
// driver's Matrix) and Soak runs many processes of lockers under faults; both
// need Main in TestMain, and write Records from which
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

	// Expire makes the backend forget key's current holder behind its back,
	// as the server would on expiry (DEL the key, revoke the lease, kill the
	// session); the next grant must still get a higher token.
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
// many clients the backend knows to wait for key, so that the push-wait test
// releases only once the waiter waits (without it, the proof is weaker).
type WaiterCounter interface {
	Waiters(t testing.TB, key string) int
}

// SlowPoller is an optional interface on a Harness whose driver also polls
// while it waits: NewSlowPollLocker returns a locker polling far less often
// than PushWaitBound, so only a push can meet the bound.
type SlowPoller interface {
	NewSlowPollLocker(t testing.TB) dlock.Locker
}

// PushWaitBound is how soon after a release a known waiter must be granted
// the lock on a backend that claims Capabilities().PushWait, well below any
// polling fallback.
const PushWaitBound = 250 * time.Millisecond

// Inspector is an optional interface on a Harness: Residue lists what the
// backend still stores for key, fence counters aside, so that the suites
// check nothing is left once holders and waiters are gone.
type Inspector interface {
	Residue(t testing.TB, key string) []string
}
