package k8s_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dlock-go/dlock"
	dlockk8s "github.com/dlock-go/dlock/k8s"
)

// countingTransport counts the requests sent through it.
type countingTransport struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(r)
}

// countingLocker returns a locker whose driver's requests are added to n.
func countingLocker(t *testing.T, kubeconfig string, n *atomic.Int64) dlock.Locker {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS = -1
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt: rt, n: n} })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := dlockk8s.New(cs, testNamespace, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// TestRequestsPerHandoff bounds the API requests a contended lock costs per
// grant: a release must not make every waiter read and write the Lease, so
// the cost per hand-off does not grow with the number of waiters.
func TestRequestsPerHandoff(t *testing.T) {
	const lockers, waiters, rounds = 2, 4, 10 // 8 waiters in all
	const maxPerGrant = 6.0
	_, srv := startHarness(t)
	var n atomic.Int64
	ls := make([]dlock.Locker, lockers)
	for i := range ls {
		ls[i] = countingLocker(t, srv.Kubeconfig, &n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	key := "herd/" + time.Now().Format("150405.000000")

	// A first grant creates and settles the Lease; the count starts after.
	first, err := ls[0].Acquire(ctx, key, dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	n.Store(0)

	var grants atomic.Int64
	var wg sync.WaitGroup
	for _, l := range ls {
		for range waiters {
			wg.Go(func() {
				for range rounds {
					lease, err := l.Acquire(ctx, key, dlock.WithTTL(30*time.Second))
					if err != nil {
						t.Error(err)
						return
					}
					grants.Add(1)
					if err := lease.Release(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	per := float64(n.Load()) / float64(grants.Load())
	t.Logf("%d grants among %d waiters (%d lockers): %d API requests, %.1f per grant", grants.Load(), lockers*waiters, lockers, n.Load(), per)
	if per > maxPerGrant {
		t.Errorf("%.1f API requests per grant, want at most %v whatever the number of waiters", per, maxPerGrant)
	}
}
