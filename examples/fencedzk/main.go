// Command fencedzk shows a guard checking fencing tokens where the data
// lives: in ZooKeeper, through package zkfence.
//
// alice takes the lock "config/app" and writes the node /config/app through
// the guard, then her process is paused: her session falls silent and
// ZooKeeper expires it. bob takes the lock and writes. When alice wakes she
// writes again with her old token, and ZooKeeper itself refuses it: the
// guard's multi checks her token against the fence node and writes in one
// step. The program prints the timeline and exits 0 if the config is bob's.
//
// It locks on, and writes to, the ZooKeeper server at -addr. alice reaches
// it through an in-process proxy that the program freezes to stand in for
// the pause.
//
//	cd examples && go run ./fencedzk -addr 127.0.0.1:2181
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/examples/internal/freeze"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/zkfence"
	"github.com/dlock-go/dlock/third_party/zk"
	_ "github.com/dlock-go/dlock/zookeeper" // registers zk://
)

func main() {
	addr := flag.String("addr", "127.0.0.1:2181", "ZooKeeper server, host:port")
	session := flag.Duration("session", 4*time.Second, "alice's session timeout (the server clamps it)")
	flag.Parse()
	if err := run(*addr, *session); err != nil {
		fmt.Fprintln(os.Stderr, "fencedzk:", err)
		os.Exit(1)
	}
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

func run(addr string, session time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*session+60*time.Second)
	defer cancel()
	start := time.Now()
	say := func(who, format string, args ...any) {
		fmt.Printf("%+7.3fs  %-5s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, args...))
	}

	conn, _, err := zk.Connect([]string{addr}, 10*time.Second, zk.WithLogger(quiet{}))
	if err != nil {
		return err
	}
	defer conn.Close()
	for _, p := range []string{"/config", "/config/app"} {
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", p, err)
		}
	}
	guard := zkfence.Guard{Conn: conn}
	const resource, node = "config/app", "/config/app"
	write := func(tok dlock.Token, v string) error {
		return guard.Set(ctx, tok, resource, node, []byte(v))
	}

	proxy, err := freeze.Start(addr)
	if err != nil {
		return err
	}
	defer proxy.Close()
	alice, err := dlock.Open(ctx, fmt.Sprintf("zk://%s/dlock-examples?session=%v", proxy.Addr, session))
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

	say("alice", "stop-the-world pause: her session (%v) falls silent…", session)
	proxy.Freeze()
	bob, err := dlock.Open(ctx, "zk://"+addr+"/dlock-examples")
	if err != nil {
		return err
	}
	defer bob.Close()
	err = dlock.Do(ctx, bob, resource, func(ctx context.Context, lease *dlock.Lease) error {
		say("bob", "acquired once ZooKeeper expired alice's session; token %v; writes v2", lease.Token())
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
		say("alice", "REFUSED by ZooKeeper: %v", err)
	} else {
		say("alice", "write accepted (err=%v): this must not happen", err)
	}
	data, _, err := conn.Get(node)
	if err != nil {
		return fmt.Errorf("read %s: %w", node, err)
	}
	got := string(data)
	say("done", "%s = %q (want bob's v2)", node, got)
	if !stale || got != "v2 by bob" {
		return fmt.Errorf("invariant broken: stale write refused=%v, value %q", stale, got)
	}
	return nil
}
