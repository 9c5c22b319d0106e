package sqltable_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	_ "github.com/jackc/pgx/v5/stdlib" // registers database/sql's "pgx"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/sqltable"
)

// Open a table lock through PgBouncer in transaction pooling mode, where a
// session lock (postgres://) is refused, and run a job under it. The import
// of this package registers the scheme pgtable://.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "pgtable://app:secret@pgbouncer:6432/app?ttl=15s&sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	err = dlock.Do(ctx, locker, "jobs/nightly", func(ctx context.Context, lease *dlock.Lease) error {
		// Send lease.Token() with every write, so the resource can reject a
		// stale holder (fencing.SQLGuard for tables).
		fmt.Println("running with token", lease.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Lock through a *sql.DB you already have (any PostgreSQL driver for
// database/sql); closing the Locker leaves it open.
func ExampleNew() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app:secret@127.0.0.1:5432/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	locker, err := sqltable.New(ctx, db, sqltable.PostgreSQL, &sqltable.Options{Table: "locks"})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
}
