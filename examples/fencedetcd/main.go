// Command fencedetcd shows a guard checking fencing tokens where the data
// lives: in etcd, through package etcdfence.
//
// alice takes the lock "config/app" and writes the config key through the
// guard, then is paused past her lock's TTL. bob takes the lock and writes.
// When alice wakes she writes again with her old token, and etcd itself
// refuses it: the guard's transaction compares her token with the fence key
// and writes in one step. The program prints the timeline and exits 0 if the
// config is bob's.
//
// It locks on, and writes to, an etcd server it starts in-process
// (go.etcd.io/etcd/server/v3/embed), so nothing needs to be installed.
//
//	cd examples && go run ./fencedetcd
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	_ "github.com/dlock-go/dlock/etcd" // registers etcd://
	"github.com/dlock-go/dlock/etcd/etcdfence"
	"github.com/dlock-go/dlock/examples/internal/embedetcd"
	"github.com/dlock-go/dlock/fencing"
)

func main() {
	ttl := flag.Duration("ttl", 2*time.Second, "lock TTL; alice's pause lasts 1.5× this")
	flag.Parse()
	if err := run(*ttl); err != nil {
		fmt.Fprintln(os.Stderr, "fencedetcd:", err)
		os.Exit(1)
	}
}

func run(ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*ttl+30*time.Second)
	defer cancel()
	start := time.Now()
	say := func(who, format string, args ...any) {
		fmt.Printf("%+7.3fs  %-5s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, args...))
	}

	srv, err := embedetcd.Start("fencedetcd")
	if err != nil {
		return fmt.Errorf("embedded etcd: %w", err)
	}
	defer srv.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	guard := etcdfence.Guard{Client: cli}
	const resource, key = "config/app", "/config/app"
	write := func(tok dlock.Token, v string) error {
		return guard.Put(ctx, tok, resource, key, v)
	}

	open := func() (dlock.Locker, error) { return dlock.Open(ctx, srv.DSN("/locks"), dlock.WithTTL(ttl)) }
	alice, err := open()
	if err != nil {
		return err
	}
	defer alice.Close()
	// Her keepalive is off to stand in for the pause: a paused process
	// renews nothing.
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
		say("alice", "REFUSED by etcd: %v", err)
	} else {
		say("alice", "write accepted (err=%v): this must not happen", err)
	}
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return fmt.Errorf("read %s: %v", key, err)
	}
	got := string(resp.Kvs[0].Value)
	say("done", "%s = %q (want bob's v2)", key, got)
	if !stale || got != "v2 by bob" {
		return fmt.Errorf("invariant broken: stale write refused=%v, value %q", stale, got)
	}
	return nil
}
