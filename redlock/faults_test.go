package redlock_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redlock"
)

// faultHarness breaks a deployment of five redis-servers, each with
// appendonly yes and appendfsync always (so that Restart keeps the data and
// RestartEmpty has to wipe it): the lockers' links through one proxy per
// node, the nodes themselves, and lock keys behind the holder's back (the
// effect of clock jumps, which libfaketime cannot cause: it hangs Debian's
// redis-server).
type faultHarness struct {
	*harness
}

// majority is the nodes a server fault hits when it must take a quorum
// away from the holder: three of five.
var majority = []int{0, 1, 2}

func newFaultHarness(t testing.TB) *faultHarness {
	return &faultHarness{harness: &harness{
		c:       startCluster(t, 5, testenv.WithPersistence()),
		clients: map[dlock.Locker][]*goredis.Client{},
	}}
}

func (h *faultHarness) Deployment() string { return "redlock-5" }

// LinkedDSN reaches every node through its own proxy, with the per-node
// timeout of the in-process harness (see harness.NewLocker).
func (h *faultHarness) LinkedDSN(t testing.TB) (string, conformance.Link) {
	t.Helper()
	ps := testenv.StartProxies(t, h.c.addrs()...)
	return "redlock://" + strings.Join(ps.Addrs(), ",") + "?node_timeout=400ms", ps
}

// ServerFaults: see redlockMatrix for what each fault does and why.
func (h *faultHarness) ServerFaults() map[conformance.Fault]conformance.Injector {
	restart := func(empty bool) conformance.Injector {
		return func(testing.TB, string) func() {
			h.each(majority, func(i int) { h.c.nodes[i].Kill() })
			return func() {
				for _, i := range majority {
					if empty {
						h.c.nodes[i].RestartEmpty()
					} else {
						h.c.nodes[i].Restart()
					}
				}
			}
		}
	}
	return map[conformance.Fault]conformance.Injector{
		conformance.Restart:      restart(false),
		conformance.RestartEmpty: restart(true),
		conformance.Stall: func(testing.TB, string) func() {
			h.c.nodes[0].Pause()
			return h.c.nodes[0].Resume
		},
		conformance.ClockJump: func(t testing.TB, key string) func() {
			h.kleppmann(t, key)
			return func() {}
		},
	}
}

// each runs f(i) for each node index in is, concurrently, and waits.
func (h *faultHarness) each(is []int, f func(i int)) {
	var wg sync.WaitGroup
	for _, i := range is {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

// kleppmann sets up Martin Kleppmann's first scenario around the current
// holder of key: its lock is on nodes 1-3 only, as if its requests to nodes
// 4 and 5 had been lost (the lock keys there are deleted behind its back),
// and node 3's clock jumps forward past the lock's expiry, so the key
// expires there now (deleted: a PEXPIRE of 1ms could be undone by a renewal
// landing within that millisecond). The holder still believes it holds the
// lock, and a quorum, nodes 3-5, is free. Nothing is done to the fence
// counters: a clock jumping forward only raises their floor. Where key is
// not held (a soak may pick a free key) it does the same to whatever is
// there.
func (h *faultHarness) kleppmann(t testing.TB, key string) {
	t.Helper()
	ctx := context.Background()
	lk := redlock.LockKey(redlock.DefaultPrefix, key)
	for _, i := range []int{2, 3, 4} {
		if err := h.c.admin[i].Del(ctx, lk).Err(); err != nil {
			t.Fatalf("ClockJump: DEL on node %d: %v", i+1, err)
		}
	}
}

var (
	_ conformance.FaultHarness = (*faultHarness)(nil)
)

// redlockMatrix is the five-node Redlock deployment's row of the fault
// matrix.
var redlockMatrix = conformance.Matrix{
	conformance.Partition: {Outcome: conformance.LossDetected,
		Why: "renewals reach no node, so the lease ends at its deadline (the validity: TTL less drift and the grant's duration), before the keys expire on the nodes' clocks"},
	conformance.Disconnect: {Outcome: conformance.LossDetected,
		Why: "renewals fail on every node; the lease ends at its deadline, before the keys expire on the nodes"},
	conformance.PauseHolder: {Outcome: conformance.LossDetected,
		Why: "the paused holder's deadline passes before its keys expire on the nodes; its writes after SIGCONT are rejected by the Guard"},
	conformance.Restart: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "three of five nodes crash and restart from their AOF with the lock and the counters; the holder keeps the lock unless a renewal falls while they are down, and then it is told before anyone can be granted"},
	conformance.RestartEmpty: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "three of five nodes restart with no data (Kleppmann's restart variant): the lock is free on a quorum while the holder believes in it; a waiter may be granted before the holder's next renewal finds the quorum gone, and its token, floored at the nodes' clocks (which agree here), is higher, so the Guard fences the old holder"},
	conformance.Stall: {Outcome: conformance.Held,
		Why: "one node of five stopped (SIGSTOP) is a minority: renewals still reach a quorum, and no contender can get one"},
	conformance.ClockJump: {Outcome: conformance.LossDetected | conformance.Fenced,
		Why: "Kleppmann's first scenario, simulated: the holder's lock is on nodes 1-3 only (its keys on 4-5 deleted) and node 3's clock jumps past the expiry (its key deleted); a waiter can take nodes 3-5 while the holder believes, and is granted before the holder's next renewal unless that comes first. Its token is floored at clocks that agree with the holder's nodes, so it is higher and the Guard fences the old holder. UNSAFE (a token going backwards) needs a node in the holder's quorum whose clock was ahead at the holder's grant, which a fault injected after the grant cannot cause: see TestKleppmannNodeForgetsLockClockAhead in anomaly_test.go"},
}

func TestFaults(t *testing.T) {
	conformance.RunFaults(t, newFaultHarness(t), redlockMatrix)
}

func TestSoak(t *testing.T) {
	conformance.Soak(t, newFaultHarness(t), conformance.SoakOptions{Matrix: redlockMatrix})
}
