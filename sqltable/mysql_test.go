package sqltable_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // database/sql's "mysql", for the test's own statements

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/sqltable"
)

// mysqlHarness runs the conformance suite on the table lock over one
// MariaDB server (Debian's; the dialect is MySQL's).
type mysqlHarness struct {
	srv *testenv.MariaDB
}

func newMySQLHarness(t testing.TB) *mysqlHarness {
	return &mysqlHarness{srv: testenv.StartMariaDB(t)}
}

func (h *mysqlHarness) DSN(t testing.TB) string { return h.srv.URL("mysqltable") }

func (h *mysqlHarness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), h.DSN(t))
	if err != nil {
		t.Fatalf("dlock.Open(%q): %v", h.DSN(t), err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func (h *mysqlHarness) db(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", h.srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Expire moves the row's expiry into the past, as the server's clock
// passing it would.
func (h *mysqlHarness) Expire(t testing.TB, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := h.db(t).ExecContext(ctx, "UPDATE "+sqltable.DefaultTable+" SET expires_utc = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE `key` = ? AND owner <> '' AND expires_utc > UTC_TIMESTAMP(6)", key)
	if err != nil {
		t.Fatalf("Expire(%q): %v", key, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("Expire(%q): not held", key)
	}
}

func TestConformanceMySQL(t *testing.T) {
	conformance.Run(t, newMySQLHarness(t))
}

// TestMySQLTokensSurviveARestart: the row's counter is committed with the
// grant (innodb_flush_log_at_trx_commit=1), so the first grant after a
// SIGKILL and InnoDB's crash recovery has a higher token than the last one
// before it.
func TestMySQLTokensSurviveARestart(t *testing.T) {
	h := newMySQLHarness(t)
	tokensSurviveARestart(t, h.NewLocker(t), func() { h.srv.Kill(); h.srv.Restart() })
}

// TestMySQLRefusesAsyncCommit: with innodb_flush_log_at_trx_commit=0 a
// crash loses the last second of commits: Open refuses the server.
func TestMySQLRefusesAsyncCommit(t *testing.T) {
	h := newMySQLHarness(t)
	ctx := testCtx(t)
	if _, err := h.db(t).ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = 0"); err != nil {
		t.Fatal(err)
	}
	_, err := dlock.Open(ctx, h.DSN(t))
	if !errors.Is(err, sqltable.ErrAsyncCommit) {
		t.Fatalf("Open with innodb_flush_log_at_trx_commit=0: %v, want ErrAsyncCommit", err)
	}
}

// mysqlFaultHarness breaks the MariaDB deployment: the lockers' link through
// a proxy, and the server (SIGKILL then a restart through crash recovery;
// SIGSTOP).
type mysqlFaultHarness struct{ *mysqlHarness }

func (h mysqlFaultHarness) Deployment() string { return "mysqltable" }

func (h mysqlFaultHarness) LinkedDSN(t testing.TB) (string, conformance.Link) {
	t.Helper()
	p := testenv.StartProxy(t, h.srv.Addr())
	return "mysqltable://root@" + p.Addr() + "/mysql?timeout=5s", p
}

func (h mysqlFaultHarness) ServerFaults() map[conformance.Fault]conformance.Injector {
	return conformance.ProcessFaults(h.srv, conformance.Restart)
}

var _ conformance.FaultHarness = mysqlFaultHarness{}

// TestFaultsMySQL: the table lock's claims are the same on MariaDB
// (tableMatrix): no session holds the lock, the row and its counter are
// committed durably, and rows expire by the server's clock.
func TestFaultsMySQL(t *testing.T) {
	conformance.RunFaults(t, mysqlFaultHarness{newMySQLHarness(t)}, tableMatrix)
}
