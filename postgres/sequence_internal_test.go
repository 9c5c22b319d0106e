package postgres

import (
	"context"
	"math"
	"strings"
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
// token, from a new epoch, in a new session (a crash ends them all: here, a
// new driver). The same statements serve, on a caller's pool, a driver
// that may not create the marker sequence.
func TestSequenceTokensFromTheMarkerTable(t *testing.T) {
	defer func(v int) { markSequenceSince = v }(markSequenceSince)
	markSequenceSince = math.MaxInt
	srv := testenv.StartPostgres(t)
	d, pool := poolDriverAt(t, srv.URL(), &Options{Tokens: TokensSequence})
	if d.sql.setMark != "" {
		t.Fatalf("setMark %q without the marker sequence", d.sql.setMark)
	}
	var before uint64
	for range 10 {
		before = grantOnce(t, d, "table-marker")
	}
	if markMade(t, pool) {
		t.Fatal("the marker sequence was created on a server taken for one without unlogged sequences")
	}
	execAll(t, pool, "DELETE FROM dlock_fence_live", "ALTER SEQUENCE dlock_fence_seq RESTART WITH 1")
	d, _ = poolDriverAt(t, srv.URL(), &Options{Tokens: TokensSequence})
	after := grantOnce(t, d, "table-marker")
	t.Logf("before: %d (epoch %d); after the marker table was emptied and the sequence sent back: %d (epoch %d)",
		before, before>>44, after, after>>44)
	if after>>44 != before>>44+1 {
		t.Fatalf("epoch after the marker table was emptied: %d, want %d", after>>44, before>>44+1)
	}
	if after <= before {
		t.Fatalf("token %d ≤ %d before", after, before)
	}
}

// TestSequenceMarkWithoutPrivilege: a role that may use the sequence mode's
// objects but not create the marker sequence (PostgreSQL 15 gives PUBLIC no
// CREATE on schema public) opens the driver all the same, and its grants
// read the marker table.
func TestSequenceMarkWithoutPrivilege(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	open := func(url string) *Driver {
		t.Helper()
		d, _ := poolDriverAt(t, url, &Options{Tokens: TokensSequence})
		return d
	}
	// The objects an administrator made, as before PostgreSQL 15.
	func() {
		defer func(v int) { markSequenceSince = v }(markSequenceSince)
		markSequenceSince = math.MaxInt
		grantOnce(t, open(srv.URL()), "no-privilege")
	}()
	pool, err := pgxpool.New(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	execAll(t, pool,
		"CREATE ROLE limited LOGIN",
		"GRANT SELECT ON dlock_fence TO limited",
		"GRANT SELECT, INSERT, UPDATE ON dlock_fence_epoch, dlock_fence_live TO limited",
		"GRANT USAGE, SELECT, UPDATE ON SEQUENCE dlock_fence_seq TO limited")
	limited := strings.Replace(srv.URL(), "postgres://postgres@", "postgres://limited@", 1)
	d := open(limited)
	if d.sql.setMark != "" {
		t.Fatalf("setMark %q for a role that could not create the marker sequence", d.sql.setMark)
	}
	if markMade(t, pool) {
		t.Fatal("marker sequence made by a role without the privilege")
	}
	first := grantOnce(t, d, "no-privilege")
	execAll(t, pool, "DELETE FROM dlock_fence_live")
	second := grantOnce(t, open(limited), "no-privilege") // a new session, as after a crash
	if second>>44 != first>>44+1 {
		t.Fatalf("epoch after the marker table was emptied: %d, want %d", second>>44, first>>44+1)
	}
	// The marker sequence made by the administrator's driver, with no
	// privilege on it for the role: the role's grants still read the table.
	grantOnce(t, open(srv.URL()), "no-privilege")
	d = open(limited)
	if d.sql.setMark != "" {
		t.Fatalf("setMark %q for a role that may not use the marker sequence", d.sql.setMark)
	}
	if got := grantOnce(t, d, "no-privilege"); got>>44 != second>>44 {
		t.Fatalf("epoch of the role's grant: %d, want %d", got>>44, second>>44)
	}
}

// grantOnce acquires key on d (a TTL of 10s) and releases it, and returns
// the grant's token.
func grantOnce(t *testing.T, d *Driver, key string) uint64 {
	t.Helper()
	ctx := context.Background()
	g, err := d.Acquire(ctx, backend.AcquireRequest{Key: key, Owner: backend.NewOwnerID(), TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	return g.Token
}

// execAll runs stmts on pool in turn; the first that fails fails t.
func execAll(t *testing.T, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, stmt := range stmts {
		if _, err := pool.Exec(context.Background(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

// markMade reports whether the marker sequence dlock_fence_mark exists.
func markMade(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var made bool
	if err := pool.QueryRow(context.Background(), "SELECT to_regclass('dlock_fence_mark') IS NOT NULL").Scan(&made); err != nil {
		t.Fatal(err)
	}
	return made
}
