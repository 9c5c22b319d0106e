package bench

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
	dlockk8s "github.com/dlock-go/dlock/k8s"
)

// k8sNamespace holds every Lease of the benchmark.
const k8sNamespace = "default"

// k8sFloorPrefix starts the floor's Lease names, apart from dlock's.
const k8sFloorPrefix = "floor-"

// k8sRequestCycles is the Requests scenario's cycles per implementation.
const k8sRequestCycles = 100

// k8sCounter counts the API requests of the clients it wraps: each
// implementation's own, since the API server also serves its own
// controllers.
type k8sCounter struct{ n atomic.Int64 }

func (c *k8sCounter) reqs() (float64, error) { return float64(c.n.Load()), nil }

type k8sCountingTransport struct {
	rt http.RoundTripper
	c  *k8sCounter
}

func (t k8sCountingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.c.n.Add(1)
	return t.rt.RoundTrip(r)
}

// newK8sClientset returns a clientset for kubeconfig, with no client-side
// rate limit (as the driver's own), whose requests c counts.
func newK8sClientset(tb testing.TB, kubeconfig string, c *k8sCounter) kubernetes.Interface {
	tb.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		tb.Fatalf("k8s: kubeconfig: %v", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS = -1
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return k8sCountingTransport{rt: rt, c: c} })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		tb.Fatalf("k8s: clientset: %v", err)
	}
	return cs
}

func k8sImpls(kubeconfig string) []impl {
	dlockReqs, floorReqs := new(k8sCounter), new(k8sCounter)
	return []impl{
		{
			name: "dlock",
			newLocker: func(tb testing.TB) locker {
				l, err := dlockk8s.New(newK8sClientset(tb, kubeconfig, dlockReqs), k8sNamespace, nil, dlock.WithTTL(benchTTL))
				if err != nil {
					tb.Fatalf("k8s: %v", err)
				}
				tb.Cleanup(func() { _ = l.Close() })
				return dlockLocker{l}
			},
			canWait: true,
			reqs:    dlockReqs.reqs,
		},
		{
			name: "floor",
			newLocker: func(tb testing.TB) locker {
				return k8sFloor{newK8sClientset(tb, kubeconfig, floorReqs).CoordinationV1().Leases(k8sNamespace)}
			},
			reqs: floorReqs.reqs,
		},
	}
}

// k8sFloor is the least a Lease lock does with client-go: a create of the
// Lease with a holder and a duration (refused if it exists), and a delete
// conditional on the create's resourceVersion.
type k8sFloor struct{ leases coordv1.LeaseInterface }

func (f k8sFloor) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	if wait {
		return nil, fmt.Errorf("floor: cannot wait")
	}
	name := dlockk8s.LeaseName(k8sFloorPrefix, key)
	id := backend.NewOwnerID()
	secs := int32(benchTTL.Seconds())
	now := metav1.NowMicro()
	got, err := f.leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &id,
			LeaseDurationSeconds: &secs,
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("floor: %q is held", name)
	}
	if err != nil {
		return nil, err
	}
	rv := got.ResourceVersion
	return func() error {
		return f.leases.Delete(context.Background(), name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	}, nil
}

// BenchmarkK8s compares dlock's Kubernetes Lease driver with the raw
// client-go floor on one kube-apiserver (skipped unless DLOCK_K8S=1):
//
//   - Uncontended: b.N interleaved rounds of an uncontended try-acquire and
//     release of each (runUncontended): IMPL.ops/s, p50-ns, p99-ns.
//   - Requests: the API requests per cycle of each implementation, counted
//     by its client, one implementation at a time: IMPL.reqs/cycle over
//     k8sRequestCycles cycles released at once. It ignores b.N.
func BenchmarkK8s(b *testing.B) {
	srv := testenv.StartKubeAPIServer(b)
	impls := k8sImpls(srv.Kubeconfig)
	b.Run("Uncontended", func(b *testing.B) {
		reportUncontended(b, runUncontended(b, impls, b.N))
	})
	b.Run("Requests", func(b *testing.B) {
		for _, im := range impls {
			report(b, runRequestsPerCycle(b, im, k8sRequestCycles, 0), im.name+".reqs/cycle")
		}
	})
}
