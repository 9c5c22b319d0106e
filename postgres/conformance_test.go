package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/postgres"
)

// harness runs the conformance suite on one private PostgreSQL cluster. Each
// locker is opened from the DSN, with its own pool.
type harness struct {
	srv    *testenv.Postgres
	params string // added to the DSN, e.g. "&tokens=sequence"
}

func newHarness(t testing.TB) *harness {
	return &harness{srv: testenv.StartPostgres(t)}
}

func (h *harness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), h.srv.URL()+h.params)
	if err != nil {
		t.Fatalf("dlock.Open(%q): %v", h.srv.URL()+h.params, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// Expire terminates the session holding key's advisory lock, as
// pg_terminate_backend does, and waits until it is gone.
func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	pid := holderPID(t, h.srv, postgres.Options{}.AdvisoryKey(key))
	if pid == 0 {
		t.Fatalf("Expire(%q): no session holds its advisory lock", key)
	}
	h.srv.TerminateBackend(t, pid)
}

// holderPID returns the backend pid holding k, or 0.
func holderPID(t testing.TB, srv *testenv.Postgres, k postgres.AdvisoryKey) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := connect(t, ctx, srv)
	defer conn.Close(ctx)
	classid, objid, objsubid := k.PgLocks()
	var pid int
	err := conn.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory'
		AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = $3 AND granted`,
		int64(classid), int64(objid), objsubid).Scan(&pid)
	if err == pgx.ErrNoRows {
		return 0
	}
	if err != nil {
		t.Fatalf("pg_locks: %v", err)
	}
	return pid
}

func connect(t testing.TB, ctx context.Context, srv *testenv.Postgres) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return conn
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t))
}

// TestConformanceSequenceTokens runs the suite with tokens=sequence.
func TestConformanceSequenceTokens(t *testing.T) {
	h := newHarness(t)
	h.params = "&tokens=sequence"
	conformance.Run(t, h)
}

// Waiters counts the sessions waiting for key's advisory lock.
func (h *harness) Waiters(t testing.TB, key string) int {
	t.Helper()
	return waiters(t, h.srv, key)
}

// Residue lists the sessions that still hold or wait for key's advisory
// lock. The key's row in the fence table stays by design: it keeps the
// tokens increasing.
func (h *harness) Residue(t testing.TB, key string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := connect(t, ctx, h.srv)
	defer conn.Close(ctx)
	classid, objid, objsubid := postgres.Options{}.AdvisoryKey(key).PgLocks()
	rows, err := conn.Query(ctx, `SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory'
		AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = $3`,
		int64(classid), int64(objid), objsubid)
	if err != nil {
		t.Fatalf("Residue(%q): pg_locks: %v", key, err)
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var pid int
		var granted bool
		if err := rows.Scan(&pid, &granted); err != nil {
			t.Fatalf("Residue(%q): %v", key, err)
		}
		left = append(left, fmt.Sprintf("advisory lock of backend %d (granted %v)", pid, granted))
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("Residue(%q): %v", key, err)
	}
	return left
}

// DSN is the DSN NewLocker opens.
func (h *harness) DSN(testing.TB) string { return h.srv.URL() + h.params }

var (
	_ conformance.Inspector = (*harness)(nil)
	_ conformance.DSNer     = (*harness)(nil)
)
