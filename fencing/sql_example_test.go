package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"log"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// A guarded write to a PostgreSQL table whose rows carry a fence column
// (ALTER TABLE accounts ADD COLUMN fence bigint NOT NULL DEFAULT 0). The
// table itself rejects a write from a holder whose lease was lost while a
// newer holder wrote.
func ExampleSQLGuard() {
	ctx := context.Background()
	var db *sql.DB          // e.g. stdlib.OpenDBFromPool(pool), or sql.Open("pgx", dsn)
	var locker dlock.Locker // e.g. dlock.Open(ctx, "postgres://…")
	if db == nil || locker == nil {
		return // this example shows the calls; it has no database to run on
	}
	guard := fencing.SQLGuard{Table: "accounts"}
	err := dlock.Do(ctx, locker, "accounts/7", func(ctx context.Context, lease *dlock.Lease) error {
		// UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND (fence IS NULL OR fence <= $4)
		return guard.Update(ctx, db, lease.Token(), 7, "balance = balance + $1", 100)
	})
	if errors.Is(err, fencing.ErrStaleToken) {
		log.Print("a newer lock holder has written account 7; this write was refused")
	}
}
