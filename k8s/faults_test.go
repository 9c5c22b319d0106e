package k8s_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
)

// faultHarness breaks one kube-apiserver over one etcd: the lockers' links
// through a proxy, and the API server itself (SIGKILL and restart over the
// same etcd, SIGSTOP).
type faultHarness struct {
	*harness
	srv *testenv.KubeAPIServer
}

func newFaultHarness(t testing.TB) *faultHarness {
	h, srv := startHarness(t)
	return &faultHarness{harness: h, srv: srv}
}

func (h *faultHarness) Deployment() string { return "k8s" }

// FailoverTime bounds the API server's restart, longer on a busy machine.
func (h *faultHarness) FailoverTime() time.Duration { return 60 * time.Second }

// LinkedDSN reaches the API server through a new proxy, with a kubeconfig
// of its own naming the proxy (the serving certificate is for 127.0.0.1).
func (h *faultHarness) LinkedDSN(t testing.TB) (string, conformance.Link) {
	t.Helper()
	p := testenv.StartProxy(t, h.srv.Endpoint())
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(testenv.KubeconfigFor("https://"+p.Addr(), h.srv.CAData, h.srv.Token)), 0o600); err != nil {
		t.Fatal(err)
	}
	return dsnFor(path, "request-timeout=1s"), p
}

// ServerFaults: the API server restarts over the same etcd, or stalls.
func (h *faultHarness) ServerFaults() map[conformance.Fault]conformance.Injector {
	return conformance.ProcessFaults(h.srv, conformance.Restart)
}

var (
	_ conformance.FaultHarness  = (*faultHarness)(nil)
	_ conformance.FailoverTimer = (*faultHarness)(nil)
)

// k8sMatrix is the single API server's row of the fault matrix.
var k8sMatrix = conformance.Matrix{
	conformance.Partition: {Outcome: conformance.LossDetected,
		Why: "renewals reach no API server, so the lease ends at its deadline, reckoned from before the last renewal was sent; a waiter takes the Lease over only its duration after it first saw that renewal"},
	conformance.Disconnect: {Outcome: conformance.LossDetected,
		Why: "renewals fail and the lease ends at its deadline, before a waiter has seen the Lease unchanged for its duration"},
	conformance.PauseHolder: {Outcome: conformance.LossDetected,
		Why: "the paused holder's deadline passes before a waiter has seen its Lease unchanged for its duration; its writes after SIGCONT are rejected by the Guard"},
	conformance.Restart: {Outcome: conformance.Held | conformance.LossDetected,
		Why: "the API server dies (SIGKILL) and restarts over the same etcd, which keeps the Lease; a renewal after the restart keeps the lock, else the lease ends at its deadline, and a waiter takes over only after seeing the Lease unchanged for its duration"},
	conformance.Stall: {Outcome: conformance.LossDetected,
		Why: "the API server stops (SIGSTOP) for longer than the TTL: renewals time out and the lease ends at its deadline; the waiter's clock for the Lease starts only when it reads it after SIGCONT"},
}

func TestFaults(t *testing.T) {
	conformance.RunFaults(t, newFaultHarness(t), k8sMatrix)
}

func TestSoak(t *testing.T) {
	conformance.Soak(t, newFaultHarness(t), conformance.SoakOptions{Matrix: k8sMatrix})
}
