package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/sqltable" // mysqltable://
)

// TestSQLGuardMariaDB is the paused-client scenario on MariaDB: tokens from
// the table lock (mysqltable://), the resource a table in the same server,
// guarded with MySQL's placeholders.
func TestSQLGuardMariaDB(t *testing.T) {
	srv := testenv.StartMariaDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("mysql", srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, stmt := range []string{
		"CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, fence bigint NOT NULL DEFAULT 0) ENGINE=InnoDB",
		"INSERT INTO accounts (id, balance) VALUES (1, 0), (2, 0)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	open := func() dlock.Locker {
		l, err := dlock.Open(ctx, srv.URL("mysqltable"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	a, b := open(), open()
	guard := fencing.SQLGuard{Table: "accounts", Placeholder: fencing.QuestionMark}

	// A holds the lock, writes with its token, then pauses past its TTL.
	leaseA, err := a.Acquire(ctx, "accounts/1", dlock.WithTTL(time.Second), dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := guard.Update(ctx, db, leaseA.Token(), 1, "balance = ?", 10); err != nil {
		t.Fatalf("A's write: %v", err)
	}
	// B gets the lock once A's row has expired, and writes.
	leaseB, err := b.Acquire(ctx, "accounts/1")
	if err != nil {
		t.Fatal(err)
	}
	defer leaseB.Release(ctx)
	if leaseB.Token() <= leaseA.Token() {
		t.Fatalf("B's token %d is not above A's %d", leaseB.Token(), leaseA.Token())
	}
	if err := guard.Update(ctx, db, leaseB.Token(), 1, "balance = ?", 20); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	// A wakes up and writes: rejected by the table.
	err = guard.Update(ctx, db, leaseA.Token(), 1, "balance = ?", 12)
	var se *fencing.StaleTokenError
	if !errors.Is(err, fencing.ErrStaleToken) || !errors.As(err, &se) || se.Token != leaseA.Token() {
		t.Fatalf("A's stale write: %v; want a StaleTokenError for token %d", err, leaseA.Token())
	}
	var balance int
	var fence int64
	if err := db.QueryRowContext(ctx, "SELECT balance, fence FROM accounts WHERE id = 1").Scan(&balance, &fence); err != nil {
		t.Fatal(err)
	}
	if balance != 20 || dlock.Token(fence) != leaseB.Token() {
		t.Fatalf("row after the stale write: balance %d fence %d; want 20, %d", balance, fence, leaseB.Token())
	}
}
