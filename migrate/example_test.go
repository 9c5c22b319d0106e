package migrate_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/migrate"
)

// The DSNs of a migration from Redis to etcd: deploy the first, run the
// switch, deploy the second.
func ExampleDSN() {
	from := "redis://10.0.0.5:6379/0?prefix=app:"
	to := "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks"
	fmt.Println(migrate.DSN(from, to, ""))
	fmt.Println(migrate.DSN(from, to, migrate.ModeNew))
	// Output:
	// migrate://?from=redis%3A%2F%2F10.0.0.5%3A6379%2F0%3Fprefix%3Dapp%3A&to=etcd%3A%2F%2F10.0.0.1%3A2379%2C10.0.0.2%3A2379%2C10.0.0.3%3A2379%2Flocks
	// migrate://?from=redis%3A%2F%2F10.0.0.5%3A6379%2F0%3Fprefix%3Dapp%3A&to=etcd%3A%2F%2F10.0.0.1%3A2379%2C10.0.0.2%3A2379%2C10.0.0.3%3A2379%2Flocks&mode=new
}

// The switch record names the old backend without credentials or client
// parameters, so differently written DSNs of one deployment match.
func ExampleBackendID() {
	for _, dsn := range []string{
		"redis://user:secret@Cache.internal?prefix=app:&pool_size=50",
		"redis://cache.internal:6379/0?prefix=app:",
	} {
		id, err := migrate.BackendID(dsn)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(id)
	}
	// Output:
	// redis://cache.internal:6379/0?prefix=app%3A
	// redis://cache.internal:6379/0?prefix=app%3A
}

// Application code does not change: it opens whatever LOCK_DSN says. With a
// migrate:// DSN it holds the Redis and the etcd lock while migrating, and
// the etcd lock alone in mode new.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, os.Getenv("LOCK_DSN")) // e.g. migrate.DSN(redisDSN, etcdDSN, "")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	err = dlock.Do(ctx, locker, "invoices/2026-11", func(ctx context.Context, lease *dlock.Lease) error {
		fmt.Println("token", lease.Token()) // Redis's before the switch; etcd's, mapped above it, after
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// The one operator step, in code (the command is
// `dlock migrate switch-tokens --from OLD --to NEW`).
func ExampleSwitch() {
	ctx := context.Background()
	rec, created, err := migrate.Switch(ctx, os.Getenv("OLD_DSN"), os.Getenv("NEW_DSN"), nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("switched now:", created, "base:", rec.Base)
}
