package k8s_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/election"
	dlockk8s "github.com/dlock-go/dlock/k8s"
)

// elector is a client-go leader elector on a Lease, run by a test: it
// records whom it sees leading and whether it leads.
type elector struct {
	id      string
	le      *leaderelection.LeaderElector
	started chan struct{} // closed when it starts leading
	stopped chan struct{} // closed when Run has returned

	mu      sync.Mutex
	leaders []string // OnNewLeader's identities, in order
}

// Client-go's timing for the tests: a short lease, so that the test is
// quick, with its usual proportions.
const (
	cgLeaseDuration = 4 * time.Second
	cgRenewDeadline = 3 * time.Second
	cgRetryPeriod   = 500 * time.Millisecond
)

// startElector runs a client-go elector with identity id on the Lease name
// until the returned cancel is called, and returns once Run has begun.
func startElector(t *testing.T, cs kubernetes.Interface, name, id string) (*elector, context.CancelFunc) {
	t.Helper()
	e := &elector{id: id, started: make(chan struct{}), stopped: make(chan struct{})}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: name, Namespace: testNamespace},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   cgLeaseDuration,
		RenewDeadline:   cgRenewDeadline,
		RetryPeriod:     cgRetryPeriod,
		ReleaseOnCancel: true,
		Name:            "dlock-interop",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(e.started) },
			OnStoppedLeading: func() {},
			OnNewLeader: func(identity string) {
				e.mu.Lock()
				e.leaders = append(e.leaders, identity)
				e.mu.Unlock()
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.le = le
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(e.stopped)
		le.Run(ctx)
	}()
	stop := func() {
		cancel()
		<-e.stopped
	}
	t.Cleanup(stop)
	return e, stop
}

// sawLeader waits up to d for the elector to report id as the leader.
func (e *elector) sawLeader(id string, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); {
		e.mu.Lock()
		n := len(e.leaders)
		last := ""
		if n > 0 {
			last = e.leaders[n-1]
		}
		e.mu.Unlock()
		if last == id {
			return true
		}
		time.Sleep(20 * time.Millisecond) // OnNewLeader has no channel: poll its record
	}
	return false
}

// TestInteropClientGoElection: a client-go leader elector and a dlock
// election on the same Lease exclude each other, each reads the other's
// holder identity, and leadership passes both ways.
func TestInteropClientGoElection(t *testing.T) {
	h, _ := startHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := h.NewLocker(t)
	const electionName = "interop-election"
	leaseName := dlockk8s.LeaseName(dlockk8s.DefaultPrefix, electionName)

	// dlock leads first; the client-go elector sees it lead and does not.
	first, err := election.Campaign(ctx, l, electionName, "dlock-candidate", dlock.WithTTL(cgLeaseDuration))
	if err != nil {
		t.Fatal(err)
	}
	cg, stopCG := startElector(t, h.cs, leaseName, "client-go-candidate")
	if !cg.sawLeader("dlock-candidate", 10*time.Second) {
		t.Fatalf("client-go saw leaders %v, want dlock-candidate", cg.leaders)
	}
	// Two lease durations: a client-go elector that ignored a live dlock
	// holder would take the Lease within one.
	select {
	case <-cg.started:
		t.Fatal("client-go started leading while dlock led")
	case <-first.Done():
		t.Fatalf("dlock's term ended while it renewed: %v", first.Err())
	case <-time.After(2 * cgLeaseDuration):
	}
	if cg.le.IsLeader() {
		t.Fatal("client-go says it leads while dlock leads")
	}

	// dlock resigns: client-go leads, and dlock reads its identity.
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cg.started:
	case <-time.After(10 * time.Second):
		t.Fatal("client-go did not lead within 10s of dlock's resignation")
	}
	info, err := election.Leader(ctx, l, electionName)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Led || info.Value != "client-go-candidate" {
		t.Fatalf("dlock reads leader %+v, want client-go-candidate", info)
	}
	tctx, tcancel := context.WithTimeout(ctx, 2*cgLeaseDuration)
	_, err = election.Campaign(tctx, l, electionName, "dlock-candidate", dlock.WithTTL(cgLeaseDuration))
	tcancel()
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dlock campaign while client-go leads and renews: %v, want ErrNotAcquired after its deadline", err)
	}

	// client-go stops (releasing on cancel): a waiting dlock campaign
	// leads, with a token above its first term's.
	got := make(chan error, 1)
	var second *election.Leadership
	go func() {
		var err error
		second, err = election.Campaign(ctx, l, electionName, "dlock-again", dlock.WithTTL(cgLeaseDuration))
		got <- err
	}()
	stopCG()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("dlock did not lead within 15s of client-go's release")
	}
	defer second.Resign(ctx)
	if second.Token() <= first.Token() {
		t.Errorf("second dlock term's token %d, not above the first's %d", second.Token(), first.Token())
	}
	lease, err := h.leases.Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if id := *lease.Spec.HolderIdentity; id != "dlock-again" {
		t.Errorf("holderIdentity %q, want the dlock leader's value", id)
	}
}

// TestInteropClientGoTakesOverExpired: a client-go elector takes the Lease
// of a dlock holder that stopped renewing only once its duration passed,
// and the dlock holder is told.
func TestInteropClientGoTakesOverExpired(t *testing.T) {
	h, _ := startHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := h.NewLocker(t)
	const key = "interop-expired"
	lease, err := l.Acquire(ctx, key, dlock.WithTTL(cgLeaseDuration), dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	cg, _ := startElector(t, h.cs, dlockk8s.LeaseName(dlockk8s.DefaultPrefix, key), "client-go-candidate")
	select {
	case <-cg.started:
	case <-time.After(3 * cgLeaseDuration):
		t.Fatal("client-go did not take over the Lease its dlock holder stopped renewing")
	}
	if now := time.Now(); now.Before(lease.Deadline()) {
		t.Errorf("client-go led at %v, before the dlock holder's deadline %v", now, lease.Deadline())
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the dlock holder's lease did not end")
	}
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Errorf("Err() = %v, want ErrLeaseLost", lease.Err())
	}
}
