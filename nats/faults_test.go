package nats_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
)

// faultHarness breaks a three-server JetStream cluster whose bucket has three
// replicas: the lockers' links through one proxy per server, and the servers
// themselves (SIGSTOP of the bucket's stream leader, SIGKILL of it until
// healed, crash and restart of a follower). Servers keep their stores across
// restarts.
type faultHarness struct {
	*harness
	cluster *testenv.NATSCluster
}

func newFaultHarness(t testing.TB) *faultHarness {
	c := testenv.StartNATSCluster(t, 3)
	dsn := "nats://" + strings.Join(c.Endpoints(), ",") + "/" + testBucket + "?replicas=3"
	return &faultHarness{harness: newHarness(t, c.URL(), dsn), cluster: c}
}

func (h *faultHarness) Deployment() string { return "nats-3" }

// FailoverTime bounds the election of a new stream leader after the leader
// dies or stalls (JetStream's election timeout is a few seconds), longer on
// a busy machine.
func (h *faultHarness) FailoverTime() time.Duration { return 15 * time.Second }

// LinkedDSN reaches every server through its own proxy; the driver ignores
// the addresses the servers announce, so it never goes around the proxies.
func (h *faultHarness) LinkedDSN(t testing.TB) (string, conformance.Link) {
	t.Helper()
	ps := testenv.StartProxies(t, h.cluster.Endpoints()...)
	return "nats://" + strings.Join(ps.Addrs(), ",") + "/" + testBucket + "?replicas=3", ps
}

// leader returns the server that leads the bucket's stream, asking for up
// to 30s, and fails the test if none does.
func (h *faultHarness) leader(t testing.TB) *testenv.NATS {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s, err := h.js.Stream(ctx, "KV_"+testBucket)
		if err == nil {
			var name string
			if info, ierr := s.Info(ctx); ierr == nil && info.Cluster != nil {
				name = info.Cluster.Leader
			} else {
				err = ierr
			}
			for _, m := range h.cluster.Members {
				if name != "" && m.Name() == name && m.Alive() {
					cancel()
					return m
				}
			}
			last = "leader " + name
		}
		cancel()
		if err != nil {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stream leader among the servers after 30s: %s", last)
		}
		time.Sleep(100 * time.Millisecond) // polling the servers: no signal to wait for
	}
}

// ServerFaults: see natsMatrix for what each fault does and why. Each heal
// returns once the stream has a leader again.
func (h *faultHarness) ServerFaults() map[conformance.Fault]conformance.Injector {
	return map[conformance.Fault]conformance.Injector{
		conformance.Stall: func(t testing.TB, _ string) func() {
			return testenv.StallLeader(t, h.leader)
		},
		conformance.KillLeader: func(t testing.TB, _ string) func() {
			return testenv.KillLeader(t, h.leader)
		},
		conformance.Restart: func(t testing.TB, _ string) func() {
			leader := h.leader(t)
			var follower *testenv.NATS
			for _, m := range h.cluster.Members {
				if m != leader {
					follower = m
					break
				}
			}
			follower.Kill()
			return func() {
				follower.Restart()
				h.leader(t)
			}
		},
	}
}

var (
	_ conformance.FaultHarness  = (*faultHarness)(nil)
	_ conformance.FailoverTimer = (*faultHarness)(nil)
	_ conformance.ShortTTLer    = (*faultHarness)(nil)
)

// natsMatrix is the three-server, three-replica cluster's row of the fault
// matrix.
var natsMatrix = conformance.Matrix{
	conformance.Partition: {Outcome: conformance.LossDetected,
		Why: "renewals reach no server, so the lease ends at its deadline, reckoned from before the last renewal was sent; the stream expires the key only a TTL after it stored that renewal"},
	conformance.Disconnect: {Outcome: conformance.LossDetected,
		Why: "renewals fail on every server and the lease ends at its deadline, before the stream expires the key"},
	conformance.PauseHolder: {Outcome: conformance.LossDetected,
		Why: "the paused holder's deadline passes before the stream expires its key; its writes after SIGCONT are rejected by the Guard"},
	conformance.Stall: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "the stream leader stops (SIGSTOP); the other replicas elect a new one, and a renewal that reaches it in time keeps the lock; else the lease ends at its deadline, before the new leader expires the key by its stored time and TTL"},
	conformance.KillLeader: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "the stream leader dies (SIGKILL) until healed; as for a stalled leader, a renewal after the election keeps the lock, else the holder is told at its deadline"},
	conformance.Restart: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "a follower crashes and restarts at once with its store; the stream keeps its quorum, so the lock is held unless the holder's connection was to that server and its renewals move over too late"},
}

func TestFaults(t *testing.T) {
	conformance.RunFaults(t, newFaultHarness(t), natsMatrix)
}

func TestSoak(t *testing.T) {
	conformance.Soak(t, newFaultHarness(t), conformance.SoakOptions{Matrix: natsMatrix})
}
