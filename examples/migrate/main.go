// Command migrate walks a small fleet through a Redis → etcd migration, as
// docs/MIGRATING.md describes it, against real servers:
//
//	cd examples && go run ./migrate -redis redis://127.0.0.1:6379/0 -etcd etcd://127.0.0.1:2379
//
// Workers deposit into one account that checks fencing tokens (a
// fencing.Guard), each under the lock "account/42". The program goes through
// the rollout one step at a time and prints each grant's token:
//
//  1. the old fleet: Redis-only workers;
//  2. the rolling deploy: Redis-only and migrating workers (DSN migrate://?from=…&to=…)
//     side by side — a new-only worker is refused;
//  3. the switch (what `dlock migrate switch-tokens` does), with the migrating
//     workers still running;
//  4. the second rolling deploy: migrating and new-only workers (…&mode=new).
//
// At the end a worker from before the switch that "wakes up" writes with its
// old token and is rejected. The program exits 0 if the account accepted
// every honest write, its tokens strictly increased from the first to the
// last, and the stale write was rejected. Each run uses key prefixes of its
// own (-run, default random), so it can run again on the same servers: it
// leaves a few keys behind under them.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/migrate" // registers migrate://, and with it redis:// and etcd://
)

func main() {
	redisDSN := flag.String("redis", "redis://127.0.0.1:6379/0", "the old backend")
	etcdDSN := flag.String("etcd", "etcd://127.0.0.1:2379", "the new backend")
	runID := flag.String("run", "", "name of this run, used in the key prefixes (default: random)")
	flag.Parse()
	if *runID == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		*runID = hex.EncodeToString(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, *redisDSN, *etcdDSN, *runID); err != nil {
		fmt.Fprintln(os.Stderr, "migrate example:", err)
		os.Exit(1)
	}
}

// account is the protected resource: it rejects a token lower than one it has
// accepted.
type account struct {
	guard   fencing.Guard
	balance int
	last    dlock.Token
}

const resource = "account/42"

func run(ctx context.Context, redisBase, etcdBase, runID string) error {
	from, err := withPrefix(redisBase, "prefix", "example-"+runID+":")
	if err != nil {
		return fmt.Errorf("-redis: %w", err)
	}
	to, err := withPrefix(etcdBase, "", "/example-"+runID)
	if err != nil {
		return fmt.Errorf("-etcd: %w", err)
	}
	migrating := migrate.DSN(from, to, "")
	newOnly := migrate.DSN(from, to, migrate.ModeNew)
	acct := &account{}

	open := func(dsn string) (dlock.Locker, error) { return dlock.Open(ctx, dsn, dlock.WithTTL(5*time.Second)) }
	deposit := func(who string, l dlock.Locker) error {
		return dlock.Do(ctx, l, resource, func(ctx context.Context, lease *dlock.Lease) error {
			t := lease.Token()
			err := acct.guard.Advance(resource, t, func() error { acct.balance += 10; return nil })
			if err != nil {
				return fmt.Errorf("%s: honest write rejected: %w", who, err)
			}
			if t <= acct.last {
				return fmt.Errorf("%s: token %v not above %v", who, t, acct.last)
			}
			acct.last = t
			fmt.Printf("  %-10s token %v\n", who, t)
			return nil
		})
	}

	fmt.Println("1. the old fleet locks on Redis")
	redisOnly, err := open(from)
	if err != nil {
		return err
	}
	defer redisOnly.Close()
	for range 2 {
		if err := deposit("redis-only", redisOnly); err != nil {
			return err
		}
	}

	fmt.Println("2. rolling deploy of LOCK_DSN=migrate://?from=…&to=… (both locks; tokens still Redis's)")
	mig, err := open(migrating)
	if err != nil {
		return err
	}
	defer mig.Close()
	for _, l := range []struct {
		who string
		l   dlock.Locker
	}{{"redis-only", redisOnly}, {"migrating", mig}, {"redis-only", redisOnly}, {"migrating", mig}} {
		if err := deposit(l.who, l.l); err != nil {
			return err
		}
	}
	staleToken := acct.last // held by a worker that is about to pause
	if _, err := open(newOnly); !errors.Is(err, migrate.ErrNotSwitched) {
		return fmt.Errorf("a new-only client before the switch was not refused: %v", err)
	}
	fmt.Println("  new-only   refused before the switch (ErrNotSwitched)")
	if err := redisOnly.Close(); err != nil { // the last Redis-only process goes
		return err
	}

	fmt.Println("3. dlock migrate switch-tokens --from … --to …")
	rec, _, err := migrate.Switch(ctx, from, to, nil)
	if err != nil {
		return err
	}
	fmt.Printf("  switched: new tokens = base %d + etcd revision\n", rec.Base)

	fmt.Println("4. rolling deploy of LOCK_DSN=migrate://?from=…&to=…&mode=new (etcd only)")
	newer, err := open(newOnly)
	if err != nil {
		return err
	}
	defer newer.Close()
	for _, l := range []struct {
		who string
		l   dlock.Locker
	}{{"migrating", mig}, {"new-only", newer}, {"migrating", mig}, {"new-only", newer}} {
		if err := deposit(l.who, l.l); err != nil {
			return err
		}
	}

	fmt.Printf("5. a worker paused since step 2 wakes and writes with token %v\n", staleToken)
	err = acct.guard.Do(resource, staleToken, func() error { acct.balance += 1000; return nil })
	if !errors.Is(err, fencing.ErrStaleToken) {
		return fmt.Errorf("the stale write was not rejected: %v", err)
	}
	fmt.Println("  rejected:", err)
	fmt.Printf("balance %d after 10 honest deposits; tokens strictly increased throughout\n", acct.balance)
	if acct.balance != 100 {
		return fmt.Errorf("balance %d, want 100", acct.balance)
	}
	return nil
}

// withPrefix returns dsn with its key prefix set: the query parameter param,
// or the path if param is "".
func withPrefix(dsn, param, prefix string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return "", errors.New("not a DSN")
	}
	if param == "" {
		u.Path = prefix
	} else {
		q := u.Query()
		q.Set(param, prefix)
		u.RawQuery = q.Encode()
	}
	return u.String(), nil
}
