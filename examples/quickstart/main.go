// Command quickstart shows why a distributed lock needs fencing tokens.
//
// Three workers take turns depositing into one shared account under one lock.
// One of them, alice, is hit by a stop-the-world pause (think GC or a frozen
// VM) longer than her lock's TTL. The lock passes to bob, who deposits with a
// newer token. When alice wakes she still believes she holds the lock and
// writes — and the account, which checks tokens through a fencing.Guard,
// rejects her stale write. The program prints the timeline and exits 0 if every
// invariant held.
//
// By default the workers lock on a real etcd server that the program starts
// in-process (go.etcd.io/etcd/server/v3/embed: a temporary directory, loopback,
// free ports, logs off), so nothing needs to be installed. -dsn runs the same
// story on any backend instead.
//
//	cd examples && go run ./quickstart                  # embedded etcd, no servers to install
//	cd examples && go run ./quickstart -dsn mem://      # dlock's in-process reference backend
//	cd examples && go run ./quickstart -dsn redis://127.0.0.1:6379/0
//	cd examples && go run ./quickstart -dsn etcd://127.0.0.1:2379/locks
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	_ "github.com/dlock-go/dlock/etcd" // registers etcd:// and etcds://
	"github.com/dlock-go/dlock/examples/internal/embedetcd"
	"github.com/dlock-go/dlock/fencing"
	_ "github.com/dlock-go/dlock/memlock" // registers mem:// (in-process, for -dsn mem://)
	_ "github.com/dlock-go/dlock/redis"   // registers redis:// and rediss://
)

func main() {
	dsn := flag.String("dsn", "", "backend to lock on (etcd://host:2379/prefix, redis://host:port/db, mem://, …); default: an embedded etcd server")
	ttl := flag.Duration("ttl", 2*time.Second, "lock TTL; alice's pause lasts 1.5× this")
	flag.Parse()
	if err := run(*dsn, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// account is the protected resource. Every write carries the writer's fencing
// token; the guard rejects a token older than one it has already accepted.
type account struct {
	guard   fencing.Guard
	mu      sync.Mutex
	balance int
}

func (a *account) deposit(token dlock.Token, amount int) error {
	return a.guard.Do("account/42", token, func() error {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.balance += amount
		return nil
	})
}

type timeline struct {
	start time.Time
	mu    sync.Mutex
}

func (tl *timeline) say(who, format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	fmt.Printf("%+7.3fs  %-6s %s\n", time.Since(tl.start).Seconds(), who, fmt.Sprintf(format, args...))
}

func run(dsn string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*ttl+30*time.Second)
	defer cancel()
	tl := &timeline{start: time.Now()}
	const key = "accounts/42"
	acct := &account{}

	if dsn == "" {
		srv, err := embedetcd.Start("quickstart")
		if err != nil {
			return fmt.Errorf("embedded etcd: %w", err)
		}
		defer srv.Close()
		dsn = srv.DSN("/quickstart")
		tl.say("setup", "started an embedded etcd server on %s (no install needed; -dsn picks another backend)", srv.Addr)
	}

	open := func() (dlock.Locker, error) { return dlock.Open(ctx, dsn, dlock.WithTTL(ttl)) }
	alice, err := open()
	if err != nil {
		return err
	}
	defer alice.Close()
	caps := alice.Capabilities()
	tl.say("setup", "backend %s: fencing %v, FIFO %v", dsnScheme(dsn), caps.Fencing, caps.FIFO)

	// alice takes the lock. Her keepalive is off to stand in for the pause:
	// a paused process renews nothing.
	leaseA, err := alice.Acquire(ctx, key, dlock.WithAutoRenew(false))
	if err != nil {
		return err
	}
	tokA := leaseA.Token()
	tl.say("alice", "acquired %q with token %v; deposits 10", key, tokA)
	if err := acct.deposit(tokA, 10); err != nil {
		return fmt.Errorf("alice's first deposit: %w", err)
	}

	// bob and carol queue for the lock and deposit when they get it.
	newerWrite := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, name := range []string{"bob", "carol"} {
		l, err := open()
		if err != nil {
			return err
		}
		defer l.Close()
		wg.Go(func() {
			tl.say(name, "waits for %q", key)
			err := dlock.Do(ctx, l, key, func(ctx context.Context, lease *dlock.Lease) error {
				tl.say(name, "acquired with token %v; deposits 100", lease.Token())
				if err := acct.deposit(lease.Token(), 100); err != nil {
					return err
				}
				once.Do(func() { close(newerWrite) })
				return nil
			})
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				return
			}
			tl.say(name, "released")
		})
	}

	// alice pauses past her TTL. Her lease ends on her own clock; the backend
	// hands the lock on.
	pause := ttl * 3 / 2
	tl.say("alice", "stop-the-world pause for %v (TTL %v)…", pause, ttl)
	time.Sleep(pause)
	select {
	case <-newerWrite:
	case <-ctx.Done():
		return errors.New("nobody else got the lock while alice was paused")
	}
	tl.say("alice", "wakes up, still thinks she holds the lock, deposits 10 with token %v", tokA)
	err = acct.deposit(tokA, 10)
	stale := errors.Is(err, fencing.ErrStaleToken)
	if stale {
		tl.say("alice", "REJECTED by the account: %v", err)
	} else {
		tl.say("alice", "write accepted (err=%v) — this must not happen", err)
	}
	select {
	case <-leaseA.Done():
		tl.say("alice", "her lease says: %v", leaseA.Err())
	default:
		return errors.New("alice's lease is still open after her TTL")
	}

	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	acct.mu.Lock()
	balance := acct.balance
	acct.mu.Unlock()
	tl.say("done", "balance %d (want 210: 10 + 100 + 100, alice's stale 10 refused)", balance)
	if !stale || balance != 210 {
		return fmt.Errorf("invariant broken: stale write rejected=%v, balance=%d", stale, balance)
	}
	return nil
}

// dsnScheme names the backend without repeating the DSN, which may hold a
// password.
func dsnScheme(dsn string) string {
	for i := 0; i+2 < len(dsn); i++ {
		if dsn[i:i+3] == "://" {
			return dsn[:i]
		}
	}
	return "?"
}
