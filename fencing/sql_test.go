package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/postgres"
)

func TestMain(m *testing.M) {
	registerSQLGuards()
	conformance.Main(m) // in a child process of the guard suite, runs the child and exits
	goleak.VerifyTestMain(m)
}

// recorder is an Execer that records statements and reports a fixed row count.
type recorder struct {
	query string
	args  []any
	rows  int64
}

func (r *recorder) ExecContext(_ context.Context, q string, args ...any) (sql.Result, error) {
	r.query, r.args = q, args
	return fencing.ExecFunc(func(context.Context, string, ...any) (int64, error) { return r.rows, nil }).
		ExecContext(context.Background(), q)
}

func TestSQLGuardStatements(t *testing.T) {
	ctx := context.Background()
	r := &recorder{rows: 1}
	g := fencing.SQLGuard{Table: "accounts"}
	if err := g.Update(ctx, r, 34, 7, "balance = $1, note = $2", 100, "x"); err != nil {
		t.Fatal(err)
	}
	if want := "UPDATE accounts SET balance = $1, note = $2, fence = $3 WHERE id = $4 AND (fence IS NULL OR fence <= $5)"; r.query != want {
		t.Fatalf("query\n%s\nwant\n%s", r.query, want)
	}
	if want := []any{100, "x", int64(34), 7, int64(34)}; !reflect.DeepEqual(r.args, want) {
		t.Fatalf("args %v, want %v", r.args, want)
	}
	my := fencing.SQLGuard{Table: "`jobs`", KeyColumn: "name", FenceColumn: "tok", Placeholder: fencing.QuestionMark}
	if err := my.Fence(ctx, r, 5, "nightly"); err != nil {
		t.Fatal(err)
	}
	if want := "UPDATE `jobs` SET tok = ? WHERE name = ? AND (tok IS NULL OR tok <= ?)"; r.query != want {
		t.Fatalf("query\n%s\nwant\n%s", r.query, want)
	}

	// No row changed, and no way to ask why: stale.
	r.rows = 0
	var se *fencing.StaleTokenError
	if err := g.Update(ctx, r, 33, 7, "balance = $1", 1); !errors.As(err, &se) || !errors.Is(err, fencing.ErrStaleToken) || se.Token != 33 {
		t.Fatalf("no row changed: %v", err)
	}
	// Token 0 never reaches the database.
	r.query = ""
	if err := g.Fence(ctx, r, 0, 7); !errors.Is(err, fencing.ErrStaleToken) || r.query != "" {
		t.Fatalf("token 0: %v, query %q", err, r.query)
	}
	if err := (&fencing.SQLGuard{}).Fence(ctx, r, 1, 7); err == nil {
		t.Fatal("a guard without a table accepted a write")
	}
}

// TestSQLGuardEndToEnd is the paused-client scenario on a real PostgreSQL:
// tokens from the postgres driver, the resource a table in the same database.
func TestSQLGuardEndToEnd(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgx.ParseConfig(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, fence bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES (1, 0), (2, 0)`); err != nil {
		t.Fatal(err)
	}
	open := func() dlock.Locker {
		l, err := dlock.Open(ctx, srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	a, b := open(), open()
	guard := fencing.SQLGuard{Table: "accounts"}

	// A holds the lock, writes twice with its token, then pauses past its TTL.
	leaseA, err := a.Acquire(ctx, "accounts/1", dlock.WithTTL(time.Second), dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []int{10, 11} {
		if err := guard.Update(ctx, db, leaseA.Token(), 1, "balance = $1", v); err != nil {
			t.Fatalf("A's write %d: %v", v, err)
		}
	}
	// B gets the lock once A's lease has expired, and writes.
	leaseB, err := b.Acquire(ctx, "accounts/1")
	if err != nil {
		t.Fatal(err)
	}
	defer leaseB.Release(ctx)
	if err := guard.Update(ctx, db, leaseB.Token(), 1, "balance = $1", 20); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	// A wakes up and writes: rejected by the table.
	err = guard.Update(ctx, db, leaseA.Token(), 1, "balance = $1", 12)
	var se *fencing.StaleTokenError
	if !errors.Is(err, fencing.ErrStaleToken) || !errors.As(err, &se) || se.Highest != leaseB.Token() || se.Token != leaseA.Token() {
		t.Fatalf("A's stale write: %v; want a StaleTokenError naming B's token %d", err, leaseB.Token())
	}
	var balance int
	var fence int64
	if err := db.QueryRowContext(ctx, "SELECT balance, fence FROM accounts WHERE id = 1").Scan(&balance, &fence); err != nil {
		t.Fatal(err)
	}
	if balance != 20 || dlock.Token(fence) != leaseB.Token() {
		t.Fatalf("row after the stale write: balance %d fence %d; want 20, %d", balance, fence, leaseB.Token())
	}

	// The same through pgx's own API (no QueryRowContext: no Highest).
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	viaPgx := fencing.ExecFunc(func(ctx context.Context, q string, args ...any) (int64, error) {
		tag, err := conn.Exec(ctx, q, args...)
		return tag.RowsAffected(), err
	})
	if err := guard.Update(ctx, viaPgx, leaseA.Token(), 1, "balance = $1", 13); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("stale write through pgx: %v", err)
	}
	if err := guard.Update(ctx, viaPgx, leaseB.Token(), 1, "balance = $1", 21); err != nil {
		t.Fatalf("current write through pgx: %v", err)
	}

	// A missing row is not a stale token.
	if err := guard.Fence(ctx, db, leaseB.Token(), 99); !errors.Is(err, fencing.ErrNoRow) || errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("write to a missing row: %v, want ErrNoRow", err)
	}

	// Fencing a transaction: the fence row first, then any writes.
	write := func(token dlock.Token, balance int) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := guard.Fence(ctx, tx, token, 2); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = $1 WHERE id = 2", balance); err != nil {
			return err
		}
		return tx.Commit()
	}
	if err := write(leaseB.Token(), 30); err != nil {
		t.Fatal(err)
	}
	if err := write(leaseA.Token(), 31); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("stale transaction: %v", err)
	}
	if err := db.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = 2").Scan(&balance); err != nil || balance != 30 {
		t.Fatalf("row 2 after the stale transaction: %d, %v; want 30", balance, err)
	}
}
