package k8s_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	dlockk8s "github.com/dlock-go/dlock/k8s"
)

func TestMain(m *testing.M) {
	conformance.Main(m) // in a child process of the fault suite, runs the child and exits
	goleak.VerifyTestMain(m,
		// client-go's logger starts its flush daemon once per process.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		// The raw clientsets of the tests keep idle connections to servers
		// that t.Cleanup stops.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
	)
}

// testNamespace is the namespace of every test's Leases; conformance keys
// are unique per run.
const testNamespace = "default"

// harness runs the conformance suite on one API server.
type harness struct {
	dsn    string
	leases interface {
		Get(context.Context, string, metav1.GetOptions) (*coordinationv1.Lease, error)
		Update(context.Context, *coordinationv1.Lease, metav1.UpdateOptions) (*coordinationv1.Lease, error)
		Delete(context.Context, string, metav1.DeleteOptions) error
	}
	cs kubernetes.Interface
}

// dsnFor returns the DSN of the test Leases through kubeconfig.
func dsnFor(kubeconfig string, extra string) string {
	dsn := "k8s://" + testNamespace + "/?kubeconfig=" + url.QueryEscape(kubeconfig)
	if extra != "" {
		dsn += "&" + extra
	}
	return dsn
}

// clientset returns a plain client-go clientset for kubeconfig.
func clientset(t testing.TB, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS = -1 // no client-side rate limit
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func newHarness(t testing.TB, kubeconfig string) *harness {
	t.Helper()
	cs := clientset(t, kubeconfig)
	return &harness{dsn: dsnFor(kubeconfig, ""), cs: cs, leases: cs.CoordinationV1().Leases(testNamespace)}
}

func (h *harness) DSN(testing.TB) string { return h.dsn }

func (h *harness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	return openLocker(t, h.dsn)
}

func openLocker(t testing.TB, dsn string) dlock.Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// NewSlowPollLocker polls once an hour: only the watch wakes it in time.
func (h *harness) NewSlowPollLocker(t testing.TB) dlock.Locker {
	t.Helper()
	return openLocker(t, h.dsn+"&poll=1h")
}

// Expire clears key's holder, as an expiry taken over would, behind the
// lockers' backs.
func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := dlockk8s.LeaseName(dlockk8s.DefaultPrefix, key)
	for {
		l, err := h.leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Expire(%q): %v", key, err)
		}
		empty := ""
		l.Spec.HolderIdentity = &empty
		_, err = h.leases.Update(ctx, l, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			t.Fatalf("Expire(%q): %v", key, err)
		}
		return
	}
}

// ShortTTL is two whole seconds: a Lease's duration is in seconds.
func (*harness) ShortTTL() time.Duration { return 2 * time.Second }

// Residue reports key's Lease if it has a holder (a released Lease keeps
// only its leaseTransitions, the fence counter).
func (h *harness) Residue(t testing.TB, key string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := dlockk8s.LeaseName(dlockk8s.DefaultPrefix, key)
	l, err := h.leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("Residue(%q): %v", key, err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return nil
	}
	return []string{name + " held by " + *l.Spec.HolderIdentity}
}

var (
	_ conformance.DSNer      = (*harness)(nil)
	_ conformance.Inspector  = (*harness)(nil)
	_ conformance.SlowPoller = (*harness)(nil)
	_ conformance.ShortTTLer = (*harness)(nil)
)

func startHarness(t testing.TB) (*harness, *testenv.KubeAPIServer) {
	t.Helper()
	srv := testenv.StartKubeAPIServer(t)
	return newHarness(t, srv.Kubeconfig), srv
}

func TestConformance(t *testing.T) {
	h, _ := startHarness(t)
	conformance.Run(t, h)
}
