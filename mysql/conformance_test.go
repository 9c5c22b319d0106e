package mysql_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // database/sql's "mysql", for the test's own statements

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/mysql"
)

// harness runs the conformance suite on one MariaDB server (Debian's).
type harness struct {
	srv    *testenv.MariaDB
	admin  *sql.DB // the test's own statements
	params string  // "" or the driver's DSN parameters, each with a leading "&" ("&tokens=sequence")
}

func newHarness(t testing.TB) *harness {
	srv := testenv.StartMariaDB(t)
	admin, err := sql.Open("mysql", srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	// No idle connection (and so none of go-sql-driver's goroutines) stays
	// open between the test's statements: the suite counts goroutines.
	admin.SetMaxIdleConns(0)
	t.Cleanup(func() { _ = admin.Close() })
	return &harness{srv: srv, admin: admin}
}

func (h *harness) DSN(t testing.TB) string {
	if h.params == "" {
		return h.srv.URL("mysql")
	}
	return h.srv.URL("mysql") + "?" + h.params[1:]
}

func (h *harness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), h.DSN(t))
	if err != nil {
		t.Fatalf("dlock.Open(%q): %v", h.DSN(t), err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// holder returns the id of the session that holds key's lock, 0 if none.
func (h *harness) holder(t testing.TB, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var id sql.NullInt64
	if err := h.admin.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", mysql.LockName(mysql.DefaultNamespace, key)).Scan(&id); err != nil {
		t.Fatalf("IS_USED_LOCK: %v", err)
	}
	return id.Int64
}

// Expire kills the holder's session, as its wait_timeout would.
func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	id := h.holder(t, key)
	if id == 0 {
		t.Fatalf("Expire(%q): not held", key)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.admin.ExecContext(ctx, "KILL "+strconv.FormatInt(id, 10)); err != nil {
		t.Fatalf("Expire(%q): KILL %d: %v", key, id, err)
	}
	for h.holder(t, key) == id { // KILL returns before the session has ended
		time.Sleep(5 * time.Millisecond)
	}
}

// Waiters counts the sessions blocked in GET_LOCK on key's lock.
func (h *harness) Waiters(t testing.TB, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	err := h.admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock' AND INFO LIKE CONCAT('%', ?, '%')",
		mysql.LockName(mysql.DefaultNamespace, key)).Scan(&n)
	if err != nil {
		t.Fatalf("Waiters(%q): %v", key, err)
	}
	return n
}

// Residue lists the sessions that still hold or wait for key's lock. The
// key's row in the fence table stays by design: it keeps the tokens
// increasing.
func (h *harness) Residue(t testing.TB, key string) []string {
	t.Helper()
	var left []string
	if id := h.holder(t, key); id != 0 {
		left = append(left, "held by session "+strconv.FormatInt(id, 10))
	}
	if n := h.Waiters(t, key); n > 0 {
		left = append(left, strconv.Itoa(n)+" sessions waiting")
	}
	return left
}

var (
	_ conformance.Harness       = (*harness)(nil)
	_ conformance.WaiterCounter = (*harness)(nil)
	_ conformance.Inspector     = (*harness)(nil)
	_ conformance.DSNer         = (*harness)(nil)
)

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t))
}
