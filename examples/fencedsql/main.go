// Command fencedsql shows a guard checking fencing tokens where the data
// lives: in a PostgreSQL table, through fencing.SQLGuard.
//
// alice takes the lock "config/app" and updates the config row through the
// guard, then her process is paused: her session falls silent and
// PostgreSQL ends it (idle_session_timeout is the lock's TTL), which frees
// her lock. bob takes the lock and updates the row. When alice wakes she
// updates again with her old token, and the table itself refuses it: the
// guard's UPDATE writes only if the row's fence column is not above her
// token. The program prints the timeline and exits 0 if the config is bob's.
//
// It locks on, and writes to, the database of -dsn (default: the
// environment's DATABASE_URL, else
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable), in a table
// dlock_example_config it creates. alice reaches the server through an
// in-process proxy that the program freezes to stand in for the pause.
//
//	cd examples && go run ./fencedsql -dsn 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the database/sql driver "pgx"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/examples/internal/freeze"
	"github.com/dlock-go/dlock/fencing"
	_ "github.com/dlock-go/dlock/postgres" // registers postgres://
)

func main() {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	flag.StringVar(&dsn, "dsn", dsn, "PostgreSQL server, as a postgres:// URL")
	ttl := flag.Duration("ttl", 2*time.Second, "lock TTL: how long PostgreSQL waits for a silent session")
	flag.Parse()
	if err := run(dsn, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "fencedsql:", err)
		os.Exit(1)
	}
}

const schema = `CREATE TABLE IF NOT EXISTS dlock_example_config (
	id    int PRIMARY KEY,
	value text NOT NULL,
	fence bigint NOT NULL DEFAULT 0
);
INSERT INTO dlock_example_config (id, value) VALUES (1, '') ON CONFLICT (id) DO NOTHING`

func run(dsn string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*ttl+30*time.Second)
	defer cancel()
	start := time.Now()
	say := func(who, format string, args ...any) {
		fmt.Printf("%+7.3fs  %-5s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, args...))
	}

	u, err := url.Parse(dsn)
	if err != nil || u.Hostname() == "" {
		return errors.New("bad -dsn URL: want postgres://[user[:password]@]host[:port]/db") // the URL may hold a password: not echoed
	}
	upstream := u.Host
	if u.Port() == "" {
		upstream = net.JoinHostPort(u.Hostname(), "5432")
	}

	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("create the table: %w", err)
	}
	guard := fencing.SQLGuard{Table: "dlock_example_config"}
	const resource, row = "config/app", 1
	write := func(tok dlock.Token, v string) error {
		return guard.Update(ctx, db, tok, row, "value = $1", v)
	}

	proxy, err := freeze.Start(upstream)
	if err != nil {
		return err
	}
	defer proxy.Close()
	viaProxy := *u
	viaProxy.Host = proxy.Addr
	alice, err := dlock.Open(ctx, viaProxy.String(), dlock.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer alice.Close()
	leaseA, err := alice.Acquire(ctx, resource)
	if err != nil {
		return err
	}
	say("alice", "acquired %q with token %v; writes v1", resource, leaseA.Token())
	if err := write(leaseA.Token(), "v1 by alice"); err != nil {
		return fmt.Errorf("alice's first write: %w", err)
	}

	say("alice", "stop-the-world pause: her session falls silent (TTL %v)…", ttl)
	proxy.Freeze()
	bob, err := dlock.Open(ctx, dsn, dlock.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer bob.Close()
	err = dlock.Do(ctx, bob, resource, func(ctx context.Context, lease *dlock.Lease) error {
		say("bob", "acquired once PostgreSQL ended alice's session; token %v; writes v2", lease.Token())
		return write(lease.Token(), "v2 by bob")
	})
	if err != nil {
		return fmt.Errorf("bob: %w", err)
	}
	proxy.Thaw()

	say("alice", "wakes up, still thinks she holds the lock, writes v3 with token %v", leaseA.Token())
	err = write(leaseA.Token(), "v3 by alice")
	stale := errors.Is(err, fencing.ErrStaleToken)
	if stale {
		say("alice", "REFUSED by PostgreSQL: %v", err)
	} else {
		say("alice", "write accepted (err=%v): this must not happen", err)
	}
	var got string
	if err := db.QueryRowContext(ctx, "SELECT value FROM dlock_example_config WHERE id = $1", row).Scan(&got); err != nil {
		return fmt.Errorf("read row %d: %w", row, err)
	}
	say("done", "row %d value = %q (want bob's v2)", row, got)
	if !stale || got != "v2 by bob" {
		return fmt.Errorf("invariant broken: stale write refused=%v, value %q", stale, got)
	}
	return nil
}
