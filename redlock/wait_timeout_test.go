package redlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/rediscore"
	"github.com/dlock-go/dlock/redlock"
)

// roundCounter counts the acquire scripts a client sends: one per round of
// the algorithm on that node.
type roundCounter struct{ n *atomic.Int64 }

func (roundCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (roundCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (h roundCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if args := cmd.Args(); cmd.Name() == "evalsha" && len(args) > 1 && args[1] == rediscore.Acquire.Hash() {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

// TestWaiterRidesOutNodeTimeout: a waiting Acquire keeps waiting while one
// node times out (paused) and another refuses connections, so no round can
// reach a quorum; a node's own timeout is not the caller's deadline. Once
// the paused node resumes, the lock is granted.
func TestWaiterRidesOutNodeTimeout(t *testing.T) {
	c := startCluster(t, 3)
	// Node 0's client has a pool of one connection: while a give-back to the
	// paused node holds it, the next round's request waits for it until its
	// node timeout and fails with context.DeadlineExceeded, as a request
	// waiting on a busy pool does.
	clients := make([]*goredis.Client, len(c.nodes))
	for i, n := range c.nodes {
		o := &goredis.Options{Addr: n.Addr(), ContextTimeoutEnabled: true, DialerRetries: 1, MaxRetries: -1}
		if i == 0 {
			o.PoolSize = 1
		}
		clients[i] = goredis.NewClient(o)
		t.Cleanup(func() { _ = clients[i].Close() })
	}
	var rounds atomic.Int64
	clients[2].AddHook(roundCounter{&rounds})
	l, err := redlock.New(context.Background(), clients, &redlock.Options{RetryDelay: 5 * time.Millisecond, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })

	c.nodes[0].Pause() // its requests run out of the node timeout
	c.nodes[1].Stop()  // connection refused
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const key = "wait/node-timeout"
	got := waitingAcquire(ctx, l, key, dlock.WithTTL(10*time.Second))

	// Several rounds fail for want of a quorum; the waiter must still wait.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for rounds.Load() < 5 {
		select {
		case r := <-got:
			t.Fatalf("waiting Acquire returned after %d rounds with its ctx live: %v", rounds.Load(), r.err)
		case <-tick.C:
		}
	}
	c.nodes[0].Resume()
	r := <-got
	if r.err != nil {
		t.Fatalf("waiting Acquire after node 0 resumed: %v", r.err)
	}
	release(t, r.lease)
}

// TestWaiterReturnsPermanentNoQuorum: a waiting Acquire whose every node
// fails for good (wrong password) returns ErrNoQuorum at once, not at the
// end of its ctx.
func TestWaiterReturnsPermanentNoQuorum(t *testing.T) {
	c := startCluster(t, 3)
	ctx := testCtx(t)
	const password = "right-password"
	clients := make([]*goredis.Client, len(c.nodes))
	for i, n := range c.nodes {
		if err := c.admin[i].ConfigSet(ctx, "requirepass", password).Err(); err != nil {
			t.Fatal(err)
		}
		clients[i] = goredis.NewClient(&goredis.Options{Addr: n.Addr(), Password: password, ContextTimeoutEnabled: true, DialerRetries: 1, MaxRetries: -1})
		t.Cleanup(func() { _ = clients[i].Close() })
	}
	l, err := redlock.New(ctx, clients, nil)
	if err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	// Change the password behind the locker's back and drop its connections.
	for _, a := range c.admin {
		if err := a.ConfigSet(ctx, "requirepass", "other-"+password).Err(); err != nil {
			t.Fatal(err)
		}
		_ = a.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err()
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	start := time.Now()
	_, err = l.Acquire(wctx, "wait/permanent")
	if !errors.Is(err, redlock.ErrNoQuorum) || wctx.Err() != nil {
		t.Fatalf("waiting Acquire with a wrong password = %v after %v; want ErrNoQuorum before ctx ends", err, time.Since(start))
	}
	t.Logf("returned after %v: %v", time.Since(start), err)
}
