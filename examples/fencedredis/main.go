// Command fencedredis shows a guard checking fencing tokens where the data
// lives: in Redis, through package redisfence.
//
// alice takes the lock "config/app" and writes the config key through the
// guard, then is paused past her lock's TTL. bob takes the lock and writes.
// When alice wakes she writes again with her old token, and Redis itself
// refuses it: the guard's script compares her token with the fence key and
// writes in one step. The program prints the timeline and exits 0 if the
// config is bob's.
//
// It locks on, and writes to, the Redis server of -redis (default: the
// environment's REDIS_URL, else redis://127.0.0.1:6379/0).
//
//	cd examples && go run ./fencedredis -redis redis://127.0.0.1:6379/0
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/redisfence"
	_ "github.com/dlock-go/dlock/redis" // registers redis://
)

func main() {
	dsn := os.Getenv("REDIS_URL")
	if dsn == "" {
		dsn = "redis://127.0.0.1:6379/0"
	}
	flag.StringVar(&dsn, "redis", dsn, "Redis server, as a redis:// URL")
	ttl := flag.Duration("ttl", 2*time.Second, "lock TTL; alice's pause lasts 1.5× this")
	flag.Parse()
	if err := run(dsn, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "fencedredis:", err)
		os.Exit(1)
	}
}

func run(dsn string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*ttl+30*time.Second)
	defer cancel()
	start := time.Now()
	say := func(who, format string, args ...any) {
		fmt.Printf("%+7.3fs  %-5s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, args...))
	}

	opt, err := goredis.ParseURL(dsn)
	if err != nil {
		return errors.New("bad -redis URL") // the URL may hold a password: not echoed
	}
	cli := goredis.NewClient(opt)
	defer cli.Close()
	guard := redisfence.Guard{Client: cli}
	const resource = "config/app"
	key := redisfence.Key(resource, ":value") // shares the fence's hash tag
	write := func(tok dlock.Token, v string) error {
		return guard.Set(ctx, tok, resource, key, v, 0)
	}

	open := func() (dlock.Locker, error) { return dlock.Open(ctx, dsn, dlock.WithTTL(ttl)) }
	alice, err := open()
	if err != nil {
		return err
	}
	defer alice.Close()
	// Her renewal is off to stand in for the pause: a paused process renews
	// nothing.
	leaseA, err := alice.Acquire(ctx, resource, dlock.WithAutoRenew(false))
	if err != nil {
		return err
	}
	say("alice", "acquired %q with token %v; writes v1", resource, leaseA.Token())
	if err := write(leaseA.Token(), "v1 by alice"); err != nil {
		return fmt.Errorf("alice's first write: %w", err)
	}

	pause, paused := ttl*3/2, time.Now()
	say("alice", "stop-the-world pause for %v (TTL %v)…", pause, ttl)
	bob, err := open()
	if err != nil {
		return err
	}
	defer bob.Close()
	err = dlock.Do(ctx, bob, resource, func(ctx context.Context, lease *dlock.Lease) error {
		say("bob", "acquired with token %v; writes v2", lease.Token())
		return write(lease.Token(), "v2 by bob")
	})
	if err != nil {
		return fmt.Errorf("bob: %w", err)
	}
	time.Sleep(time.Until(paused.Add(pause))) // the rest of alice's pause

	say("alice", "wakes up, still thinks she holds the lock, writes v3 with token %v", leaseA.Token())
	err = write(leaseA.Token(), "v3 by alice")
	stale := errors.Is(err, fencing.ErrStaleToken)
	if stale {
		say("alice", "REFUSED by Redis: %v", err)
	} else {
		say("alice", "write accepted (err=%v): this must not happen", err)
	}
	got, err := cli.Get(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	say("done", "%s = %q (want bob's v2)", key, got)
	if !stale || got != "v2 by bob" {
		return fmt.Errorf("invariant broken: stale write refused=%v, value %q", stale, got)
	}
	return nil
}
