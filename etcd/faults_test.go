package etcd_test

import (
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/testenv"
)

// faultHarness breaks a three-member etcd cluster: the lockers' links
// through one proxy per member, and the members themselves (SIGSTOP of the
// leader, SIGKILL of the leader until healed, crash and restart of a
// follower). Members keep their data directories across restarts.
type faultHarness struct {
	*harness
	cluster *testenv.EtcdCluster
}

func newFaultHarness(t testing.TB) *faultHarness {
	c := testenv.StartEtcdCluster(t, 3)
	return &faultHarness{harness: newHarness(t, c.Endpoints()), cluster: c}
}

func (h *faultHarness) Deployment() string { return "etcd-3" }

// FailoverTime bounds a leader election after the leader dies or stalls:
// ~2.3s with etcd's default 1s election timeout, longer on a busy machine.
func (h *faultHarness) FailoverTime() time.Duration { return 5 * time.Second }

// LinkedDSN reaches every member through its own proxy. The client does not
// sync its endpoint list from the cluster (the driver leaves AutoSyncInterval
// at 0), so it never goes around the proxies.
func (h *faultHarness) LinkedDSN(t testing.TB) (string, conformance.Link) {
	t.Helper()
	ps := testenv.StartProxies(t, h.cluster.Endpoints()...)
	return "etcd://" + strings.Join(ps.Addrs(), ",") + testPrefix, ps
}

// ServerFaults: see etcdMatrix for what each fault does and why. Each heal
// returns once the cluster has a leader again.
func (h *faultHarness) ServerFaults() map[conformance.Fault]conformance.Injector {
	return map[conformance.Fault]conformance.Injector{
		conformance.Stall: func(t testing.TB, _ string) func() {
			return testenv.StallLeader(t, h.cluster.Leader)
		},
		conformance.KillLeader: func(t testing.TB, _ string) func() {
			return testenv.KillLeader(t, h.cluster.Leader)
		},
		conformance.Restart: func(t testing.TB, _ string) func() {
			leader := h.cluster.Leader(t)
			var follower *testenv.Etcd
			for _, m := range h.cluster.Members {
				if m != leader {
					follower = m
					break
				}
			}
			follower.Kill()
			return func() {
				follower.Restart()
				h.cluster.Leader(t)
			}
		},
	}
}

var (
	_ conformance.FaultHarness  = (*faultHarness)(nil)
	_ conformance.FailoverTimer = (*faultHarness)(nil)
	_ conformance.ShortTTLer    = (*faultHarness)(nil)
)

// etcdMatrix is the three-member etcd cluster's row of the fault matrix.
var etcdMatrix = conformance.Matrix{
	conformance.Partition: {Outcome: conformance.LossDetected,
		Why: "keep-alives reach no member, so the lease ends at its deadline, reckoned from before the last keep-alive was sent; the leader expires the lease only a TTL after it granted that keep-alive"},
	conformance.Disconnect: {Outcome: conformance.LossDetected,
		Why: "keep-alives fail on every member and the lease ends at its deadline, before the leader expires it"},
	conformance.PauseHolder: {Outcome: conformance.LossDetected,
		Why: "the paused holder's deadline passes before the leader expires its lease; its writes after SIGCONT are rejected by the Guard"},
	conformance.Stall: {Outcome: conformance.Held | conformance.LossDetected | conformance.Fenced,
		Why: "the leader stops (SIGSTOP); the others elect a new one, which extends every lease, and keep-alives that reach a live member keep the lock; else the lease ends at its deadline, before the key. But when the old leader resumes, its lessor still thinks it is primary and revokes the leases it saw expire, and its proposals are forwarded to the new leader (etcd issue 15247, fixed upstream by PR 16822, not in Debian's etcd 3.4.23): the holder's key is deleted behind its back, and its watch learns it as the waiter's does, so the waiter may be granted first; the Guard fences the old holder"},
	conformance.KillLeader: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "the leader dies (SIGKILL) until healed; as for a stalled leader, the new leader extends the leases, and a holder whose keep-alives miss the election is told at its deadline"},
	conformance.Restart: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "a follower crashes and restarts at once with its data; the quorum is never lost, so the lock is held unless the holder's keep-alives were on that member and fail over too late"},
}

func TestFaults(t *testing.T) {
	conformance.RunFaults(t, newFaultHarness(t), etcdMatrix)
}

func TestSoak(t *testing.T) {
	conformance.Soak(t, newFaultHarness(t), conformance.SoakOptions{Matrix: etcdMatrix})
}

// TestWaiterOutlivesRevokedLease: a waiting Acquire whose own key's lease is
// revoked behind its back (as an etcd leader resuming from a pause does,
// etcd issue 15247) queues again and is granted once the holder releases.
func TestWaiterOutlivesRevokedLease(t *testing.T) {
	srv := testenv.StartEtcd(t)
	h := newHarness(t, []string{srv.Endpoint()})
	ctx := testCtx(t)
	a, b := h.NewLocker(t), h.NewLocker(t)
	const key = "revoked-waiter"
	held, err := a.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease *dlock.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		l, err := b.Acquire(ctx, key)
		got <- result{l, err}
	}()
	// Wait for the waiter's key (the second under the lock name); nothing
	// signals it.
	var waiter *mvccpb.KeyValue
	deadline := time.Now().Add(10 * time.Second)
	for waiter == nil {
		resp, err := h.raw.Get(ctx, etcd.LockName(testPrefix, key)+"/", clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 2 {
			waiter = resp.Kvs[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no waiter's key after 10s: %d keys", len(resp.Kvs))
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if _, err := h.raw.Revoke(ctx, clientv3.LeaseID(waiter.Lease)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		t.Fatalf("the waiter returned while the lock was held: %v, %v", r.lease, r.err)
	case <-time.After(500 * time.Millisecond): // it must keep waiting
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiting Acquire after its lease was revoked: %v", r.err)
	}
	if r.lease.Token() <= held.Token() {
		t.Errorf("token %d, not above the holder's %d", r.lease.Token(), held.Token())
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
