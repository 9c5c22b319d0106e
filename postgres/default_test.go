package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
)

// TestDefaultTokenModeStaysCounter holds the two facts that keep counter
// mode the default (docs/postgres.md, "Why counter mode stays the default"):
// sequence mode cannot list its locks, and a client in counter mode that
// opened before sequence mode's objects existed goes on granting counter
// tokens, below every sequence token. A default that moved to sequence mode
// would do that to every fleet upgraded one process at a time.
func TestDefaultTokenModeStaysCounter(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	old, err := dlock.Open(ctx, srv.URL()) // no tokens parameter: the default
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	grant := func(l dlock.Locker) dlock.Token {
		t.Helper()
		lease, err := l.TryAcquire(ctx, "fleet")
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
		return lease.Token()
	}
	first := grant(old)
	if first >= 1<<44 {
		t.Fatalf("the default mode's first token %d is a sequence token: the default is not counter mode", first)
	}
	if _, err := dlock.List(ctx, old, ""); err != nil {
		t.Fatalf("List in counter mode: %v", err)
	}

	upgraded, err := dlock.Open(ctx, srv.URL()+"&tokens=sequence")
	if err != nil {
		t.Fatal(err)
	}
	defer upgraded.Close()
	seq := grant(upgraded)
	if _, err := dlock.List(ctx, upgraded, ""); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("List in sequence mode: %v, want errors.ErrUnsupported", err)
	}
	after := grant(old)
	t.Logf("counter %d, then sequence %d, then counter again %d", first, seq, after)
	if after >= seq {
		t.Fatalf("a counter-mode client's grant after a sequence-mode grant got %d ≥ %d: the hazard this test documents is gone; revisit the default", after, seq)
	}
	// A counter-mode client opened now refuses the database.
	if l, err := dlock.Open(ctx, srv.URL()); !errors.Is(err, dlock.ErrInvalidOption) {
		if err == nil {
			_ = l.Close()
		}
		t.Fatalf("counter mode opened after sequence mode's objects exist: %v, want ErrInvalidOption", err)
	}
}
