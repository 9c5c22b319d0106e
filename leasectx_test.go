package dlock_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock"
)

func TestLeaseFromContext(t *testing.T) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, "mem://")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := dlock.LeaseFromContext(ctx); got != nil {
		t.Fatalf("a bare ctx carries %v", got)
	}
	err = dlock.Do(ctx, l, "a", func(ctx context.Context, a *dlock.Lease) error {
		if got := dlock.LeaseFromContext(ctx); got != a {
			t.Errorf("Do's ctx carries %v, want its lease %v", got, a)
		}
		return dlock.Do(ctx, l, "b", func(ctx context.Context, b *dlock.Lease) error {
			if got := dlock.LeaseFromContext(ctx); got != b {
				t.Errorf("a nested Do's ctx carries %v, want the inner lease %v", got, b)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}
