package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"log"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// Writes to tables without a fence column, fenced by a row of a table of
// fences (CREATE TABLE fences (id varchar(200) PRIMARY KEY, fence bigint NOT
// NULL DEFAULT 0), one row per resource, inserted once): the fence row is
// advanced first and stays locked until the transaction commits, so an older
// holder's transaction can neither commit in between nor after.
func ExampleSQLGuard_InTx() {
	ctx := context.Background()
	var db *sql.DB          // e.g. sql.Open("pgx", dsn)
	var locker dlock.Locker // e.g. dlock.Open(ctx, "pgtable://…")
	if db == nil || locker == nil {
		return // this example shows the calls; it has no database to run on
	}
	guard := fencing.SQLGuard{Table: "fences"}
	err := dlock.Do(ctx, locker, "invoices", func(ctx context.Context, lease *dlock.Lease) error {
		return guard.InTx(ctx, db, lease.Token(), "invoices", func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "UPDATE invoices SET state = 'sent' WHERE state = 'due'"); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO audit (what) VALUES ('invoices sent')")
			return err
		})
	})
	if errors.Is(err, fencing.ErrStaleToken) {
		log.Print("a newer holder has run; this transaction was refused")
	}
}
