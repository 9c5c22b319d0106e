package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	_ "github.com/go-sql-driver/mysql" // registers database/sql's "mysql"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/mysql"
)

// Open a locker on MySQL or MariaDB and run a job under a lock. The import
// of this package registers the scheme mysql://.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mysql://app:secret@db:3306/app?ttl=15s&tls=true")
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

// Lock through a *sql.DB you already have (go-sql-driver/mysql); closing the
// Locker leaves it open. Size its pool for the leases you hold at once.
func ExampleNew() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(64)
	locker, err := mysql.New(ctx, db, &mysql.Options{Namespace: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
}

// The GET_LOCK name of a key, to take the same lock from SQL, or to find
// its holder: SELECT IS_USED_LOCK('dlock:…').
func ExampleLockName() {
	fmt.Println(mysql.LockName("dlock", "jobs/nightly"))
	// Output: dlock:fb296842495e5ab800d37ce94144853c2b1de534f14d6d25616cf97634
}
