package postgres_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/postgres"
)

// Open a Locker from a DSN and run a job under a lock. The import of this
// package registers the schemes postgres:// and postgresql://.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "postgres://app:secret@127.0.0.1:5432/app?ttl=15s&sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	err = dlock.Do(ctx, locker, "jobs/nightly", func(ctx context.Context, lease *dlock.Lease) error {
		// Send lease.Token() with every write, so the resource can reject a
		// stale holder (see package fencing, and fencing.SQLGuard for tables).
		fmt.Println("running with token", lease.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Lock through a pgx pool you already have. Each held lease takes one of the
// pool's connections until it is released; closing the Locker leaves the pool
// open.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app?pool_max_conns=20")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// A class id keeps dlock's locks apart from other tools' advisory locks.
	locker, err := postgres.New(ctx, pool, &postgres.Options{Int4Pair: true, ClassID: 7401}, dlock.WithTTL(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lease, err := locker.Acquire(wctx, "reports/daily") // waits in the server, up to 5s
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())
	fmt.Println("holding", lease.Key(), "with token", lease.Token())
}

// The advisory lock a key maps to, and how to find its holder in pg_locks.
func ExampleOptions_AdvisoryKey() {
	k := postgres.Options{}.AdvisoryKey("jobs/nightly")
	classid, objid, objsubid := k.PgLocks()
	fmt.Println(k.Int8, k.Int8 == postgres.HashKey(postgres.DefaultNamespace, "jobs/nightly"))
	fmt.Printf("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %d AND objid = %d AND objsubid = %d\n",
		classid, objid, objsubid)

	pair := postgres.Options{Int4Pair: true, ClassID: 7401}.AdvisoryKey("jobs/nightly")
	fmt.Println(pair.Key1, pair.Int4Pair)
	// Output:
	// -348632862236452168 true
	// SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 4213794882 AND objid = 1230920376 AND objsubid = 1
	// 7401 true
}
