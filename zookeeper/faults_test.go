package zookeeper_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/zookeeper"
)

// faultHarness breaks a three-server ZooKeeper ensemble (tickTime=500): the
// lockers' links through one proxy per server, and the servers themselves
// (SIGSTOP of the leader, SIGKILL of the leader until healed, crash and
// restart of the server the holder's session is connected to). Servers keep
// their data directories across restarts.
type faultHarness struct {
	*harness
	ensemble *testenv.ZooKeeperEnsemble
}

func newFaultHarness(t testing.TB) *faultHarness {
	e := testenv.StartZooKeeperEnsemble(t, 3)
	return &faultHarness{harness: newHarness(t, e.Addrs(), shortSession), ensemble: e}
}

func (h *faultHarness) Deployment() string { return "zookeeper-3" }

// NewLocker gives the suite's other lockers (the contender) ZooKeeper's
// default session timeout, 10s, which rides out a leader election: a waiting
// Acquire fails when its session is lost (see Driver.Acquire), and a 2s
// session is lost whenever its server is the leader that stalls or dies,
// since the election takes longer. The holder, reached through LinkedDSN,
// keeps the short session under test (ShortTTL).
func (h *faultHarness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	return h.lockerWith(t, zookeeper.DefaultSessionTimeout)
}

// FailoverTime bounds a leader election after the leader dies or stalls:
// ~2.2s with tickTime=500, longer on a busy machine.
func (h *faultHarness) FailoverTime() time.Duration { return 5 * time.Second }

// LinkedDSN reaches every server through its own proxy, with the lockers'
// session timeout.
func (h *faultHarness) LinkedDSN(t testing.TB) (string, conformance.Link) {
	t.Helper()
	ps := testenv.StartProxies(t, h.ensemble.Addrs()...)
	return fmt.Sprintf("zk://%s%s?session=%s", strings.Join(ps.Addrs(), ","), zookeeper.DefaultRoot, h.session), ps
}

// ServerFaults: see zookeeperMatrix for what each fault does and why. Each
// heal returns once the ensemble has one leader and every running server
// follows it.
func (h *faultHarness) ServerFaults() map[conformance.Fault]conformance.Injector {
	return map[conformance.Fault]conformance.Injector{
		conformance.Stall: func(t testing.TB, _ string) func() {
			return testenv.StallLeader(t, h.ensemble.Leader)
		},
		conformance.KillLeader: func(t testing.TB, _ string) func() {
			return testenv.KillLeader(t, h.ensemble.Leader)
		},
		conformance.Restart: func(t testing.TB, key string) func() {
			srv := h.holderServer(t, key)
			srv.Kill()
			return func() {
				srv.Restart()
				h.ensemble.Leader(t)
			}
		},
	}
}

// holderServer returns the server the session holding key is connected to,
// found with "cons" on each server, or the first server when key is not held
// (a soak may pick a free key) or the session is between servers.
func (h *faultHarness) holderServer(t testing.TB, key string) *testenv.ZooKeeper {
	t.Helper()
	nodes := h.nodes(t, key)
	if len(nodes) == 0 {
		return h.ensemble.Members[0]
	}
	ok, st, err := h.admin.Exists(zookeeper.LockPath(zookeeper.DefaultRoot, key) + "/" + nodes[0])
	if err != nil {
		t.Fatalf("holder node of %q: %v", key, err)
	}
	if !ok {
		return h.ensemble.Members[0]
	}
	for _, z := range h.ensemble.Members {
		ids, err := z.Sessions()
		if err != nil {
			t.Fatalf("sessions of server %d: %v", z.ID(), err)
		}
		if slices.Contains(ids, st.EphemeralOwner) {
			return z
		}
	}
	return h.ensemble.Members[0]
}

var (
	_ conformance.FaultHarness  = (*faultHarness)(nil)
	_ conformance.FailoverTimer = (*faultHarness)(nil)
	_ conformance.ShortTTLer    = (*faultHarness)(nil)
)

// zookeeperMatrix is the three-server ensemble's row of the fault matrix.
// The TTL is the session timeout (2s).
var zookeeperMatrix = conformance.Matrix{
	conformance.Partition: {Outcome: conformance.LossDetected,
		Why: "the session hears nothing from any server; the driver ends it a session timeout (less drift) after the last moment the server is known to have heard from it, before the server can expire it and delete the lock node"},
	conformance.Disconnect: {Outcome: conformance.LossDetected,
		Why: "the connection closes and reconnecting is refused; as for a partition, the driver gives the session up before the server can expire it"},
	conformance.PauseHolder: {Outcome: conformance.LossDetected,
		Why: "the paused holder's deadline (its last renewal, answered through the leader, plus min(TTL, session timeout) less drift) passes before the server expires the session; its writes after SIGCONT are rejected by the Guard"},
	conformance.Stall: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "the leader stops (SIGSTOP); the others elect a new one, which gives every session a fresh timeout; the holder keeps the lock if it reconnects to a live server within its session timeout, else it is told first"},
	conformance.KillLeader: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "the leader dies (SIGKILL) until healed; as for a stalled leader, sessions move to the survivors, and a holder that cannot move in time is told first"},
	conformance.Restart: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "the server the holder's session is connected to crashes and restarts at once with its data; the session moves to another server within its timeout and keeps its lock node"},
}

func TestFaults(t *testing.T) {
	conformance.RunFaults(t, newFaultHarness(t), zookeeperMatrix)
}

func TestSoak(t *testing.T) {
	conformance.Soak(t, newFaultHarness(t), conformance.SoakOptions{Matrix: zookeeperMatrix})
}
