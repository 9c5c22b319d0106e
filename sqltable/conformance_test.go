package sqltable_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/sqltable"
)

// harness runs the conformance suite on the table lock over one PostgreSQL
// server, directly or through PgBouncer (url: the server's or the
// bouncer's postgres:// URL).
type harness struct {
	srv *testenv.Postgres
	url string // postgres://… of what the lockers reach
}

func newHarness(t testing.TB) *harness {
	srv := startPostgres(t)
	return &harness{srv: srv, url: srv.URL()}
}

// startPostgres starts a server that makes commits durable
// (synchronous_commit=on, PostgreSQL's default; the test environment's is
// off), as the driver requires.
func startPostgres(t testing.TB) *testenv.Postgres {
	return testenv.StartPostgres(t, testenv.WithPostgresSetting("synchronous_commit", "on"))
}

// newBouncedHarness reaches the server through PgBouncer in transaction
// pooling mode: no session outlives a transaction.
func newBouncedHarness(t testing.TB) *harness {
	srv := startPostgres(t)
	return &harness{srv: srv, url: testenv.StartPgBouncer(t, srv, "transaction").URL()}
}

// dsn is the table lock's DSN for a postgres:// URL.
func dsn(pgURL string) string { return "pgtable" + strings.TrimPrefix(pgURL, "postgres") }

func (h *harness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), dsn(h.url))
	if err != nil {
		t.Fatalf("dlock.Open(%q): %v", dsn(h.url), err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// db opens the server directly (not through the bouncer), for the test's
// own statements.
func (h *harness) db(t testing.TB) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(h.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Expire moves the row's expiry into the past, as the server's clock
// passing it would.
func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := h.db(t).ExecContext(ctx, "UPDATE "+sqltable.DefaultTable+" SET expires_at = clock_timestamp() - interval '1 second' WHERE key = $1 AND owner <> '' AND expires_at > clock_timestamp()", key)
	if err != nil {
		t.Fatalf("Expire(%q): %v", key, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("Expire(%q): not held", key)
	}
}

// DSN is the lockers' DSN (conformance.DSNer: the suite checks what a DSN
// with a wrong password says).
func (h *harness) DSN(t testing.TB) string { return dsn(h.url) }

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t))
}

// TestConformancePgBouncer runs the suite through PgBouncer in transaction
// pooling mode, which the advisory-lock driver refuses.
func TestConformancePgBouncer(t *testing.T) {
	conformance.Run(t, newBouncedHarness(t))
}
