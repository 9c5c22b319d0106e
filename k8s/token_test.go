package k8s_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dlock-go/dlock"
	dlockk8s "github.com/dlock-go/dlock/k8s"
)

// TestTokenIncreasesAcrossDelete deletes the Lease between grants, as
// anyone with delete rights on Leases can: each new Lease starts its
// leaseTransitions again, yet every token must be above every earlier one.
// Deletes and re-creations come within one second of each other, so a
// token that took only leaseTransitions and the creation second would
// repeat.
func TestTokenIncreasesAcrossDelete(t *testing.T) {
	h, _ := startHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := h.NewLocker(t)
	const key = "token-across-delete"
	name := dlockk8s.LeaseName(dlockk8s.DefaultPrefix, key)
	var last dlock.Token
	for round := range 3 {
		for range 2 {
			lease, err := l.TryAcquire(ctx, key)
			if err != nil {
				t.Fatalf("round %d: TryAcquire: %v", round, err)
			}
			if tok := lease.Token(); tok <= last {
				t.Errorf("round %d: token %d after %d: not above it", round, tok, last)
			} else {
				last = tok
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("round %d: Release: %v", round, err)
			}
		}
		if err := h.leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("round %d: delete the Lease: %v", round, err)
		}
	}
}

// TestDeleteEndsLease: a holder learns at once that its Lease was deleted,
// and a new holder gets a higher token.
func TestDeleteEndsLease(t *testing.T) {
	h, _ := startHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := h.NewLocker(t), h.NewLocker(t)
	const key = "deleted-under-holder"
	lease, err := a.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	if err := h.leases.Delete(ctx, dlockk8s.LeaseName(dlockk8s.DefaultPrefix, key), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
		t.Logf("lease ended %v after the delete", time.Since(deleted))
	case <-time.After(10 * time.Second):
		t.Fatal("the holder of a deleted Lease was not told within 10s (its TTL is a minute)")
	}
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) || !strings.Contains(lease.Err().Error(), "deleted") {
		t.Errorf("Err() = %v, want ErrLeaseLost saying deleted", lease.Err())
	}
	next, err := b.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Token() <= lease.Token() {
		t.Errorf("token after the delete %d, not above the deleted holder's %d", next.Token(), lease.Token())
	}
}

// TestLeaseNames: distinct keys get distinct valid Lease names.
func TestLeaseNames(t *testing.T) {
	keys := []string{"a", "A", "-", "a-b", "a/b", "a.b", "jobs/Nightly", "ключ",
		strings.Repeat("k", 1024), strings.Repeat("k", 1023) + "l", strings.Repeat("K", 300)}
	seen := map[string]string{}
	for _, k := range keys {
		n := dlockk8s.LeaseName(dlockk8s.DefaultPrefix, k)
		if len(n) > 253 || strings.HasSuffix(n, "-") || strings.Trim(n, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			t.Errorf("LeaseName(%.20q) = %q: not a valid name", k, n)
		}
		if other, ok := seen[n]; ok {
			t.Errorf("keys %.20q and %.20q share the name %q", k, other, n)
		}
		seen[n] = k
	}
	if got := dlockk8s.LeaseName("dlock-", "jobs/Nightly"); got != "dlock-jobs-2f-4eightly" {
		t.Errorf(`LeaseName("dlock-", "jobs/Nightly") = %q`, got)
	}
}
