package postgres

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
)

// TestSequenceTokensFromTheMarkerTable runs sequence mode as on a server
// without unlogged sequences (before PostgreSQL 15): grants read the marker
// table, no marker sequence is made, and a grant after the table was
// emptied and the sequence sent back (what a crash can do) gets a higher
// token, from a new epoch. The same statements serve, on a caller's pool,
// a driver that may not create the marker sequence.
func TestSequenceTokensFromTheMarkerTable(t *testing.T) {
	defer func(v int) { markSequenceSince = v }(markSequenceSince)
	markSequenceSince = math.MaxInt
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := NewDriver(ctx, pool, &Options{Tokens: TokensSequence})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.sql.setMark != "" {
		t.Fatalf("setMark %q without the marker sequence", d.sql.setMark)
	}
	grant := func() uint64 {
		t.Helper()
		g, err := d.Acquire(ctx, backend.AcquireRequest{Key: "table-marker", Owner: backend.NewOwnerID(), TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		return g.Token
	}
	var before uint64
	for range 10 {
		before = grant()
	}
	var made bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('dlock_fence_mark') IS NOT NULL").Scan(&made); err != nil {
		t.Fatal(err)
	}
	if made {
		t.Fatal("the marker sequence was created on a server taken for one without unlogged sequences")
	}
	for _, stmt := range []string{"DELETE FROM dlock_fence_live", "ALTER SEQUENCE dlock_fence_seq RESTART WITH 1"} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	after := grant()
	t.Logf("before: %d (epoch %d); after the marker table was emptied and the sequence sent back: %d (epoch %d)",
		before, before>>44, after, after>>44)
	if after>>44 != before>>44+1 {
		t.Fatalf("epoch after the marker table was emptied: %d, want %d", after>>44, before>>44+1)
	}
	if after <= before {
		t.Fatalf("token %d ≤ %d before", after, before)
	}
}
