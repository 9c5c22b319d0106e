package redis_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/rediscore"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// queueLen is the number of waiters in key's fair queue.
func queueLen(t testing.TB, c *goredis.Client, key string) int64 {
	t.Helper()
	n, err := c.ZCard(context.Background(), redis.LockKey(redis.DefaultPrefix, key)+":queue").Result()
	if err != nil {
		t.Fatalf("ZCARD: %v", err)
	}
	return n
}

// scriptCalls is the number of EVALSHA and EVAL calls the server has run.
func scriptCalls(t testing.TB, c *goredis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		_, rest, _ := strings.Cut(line, "calls=")
		v, _, _ := strings.Cut(rest, ",")
		c, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		n += c
	}
	return n
}

func acquireLease(t testing.TB, l dlock.Locker, key string) *dlock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", key, err)
	}
	return lease
}

// TestFairDropsCrashedWaiter: a waiter that crashed while first in the queue
// (its entry written by the real script, then never renewed) holds the queue
// up for its own TTL and no longer: the live waiter behind it is granted
// after the entry expires — not before (the order is kept), and not only at a
// poll (the poll is 30s).
func TestFairDropsCrashedWaiter(t *testing.T) {
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	ctx := testCtx(t)
	const key = "fair/crashed"
	holder := openLocker(t, srv, "fair=true")
	waiter := openLocker(t, srv, "fair=true&poll=30s")
	lease, err := holder.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	k := rediscore.KeysFor(redis.DefaultPrefix, key)
	const crashedTTL = time.Second
	res, err := rediscore.FairAcquire.Run(ctx, raw, []string{k.Lock, k.Fence, k.Queue(), k.QueueExpiry(), k.QueueSeq()},
		"crashed-waiter", 60000, "1", crashedTTL.Milliseconds(), k.Channel).Int64Slice()
	if err != nil || len(res) != 3 || res[0] != 0 || res[2] != 0 {
		t.Fatalf("the crashed waiter's enqueue: %v %v, want [0 pttl 0]", res, err)
	}
	enqueued := time.Now()
	got := waitingAcquire(ctx, waiter, key, dlock.WithTTL(3*time.Second))
	waitFor(t, 5*time.Second, "live waiter queued", func() bool { return queueLen(t, raw, key) == 2 })
	release(t, lease) // names the crashed waiter, which never comes
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer release(t, r.lease)
	waited := r.at.Sub(enqueued)
	t.Logf("live waiter granted %v after the crashed waiter queued (its TTL %v)", waited, crashedTTL)
	if waited < crashedTTL {
		t.Errorf("granted %v after the crashed waiter queued, before its TTL (%v) ran out: FIFO broken", waited, crashedTTL)
	}
	if bound := crashedTTL + 3*time.Second/3 + 500*time.Millisecond; waited > bound {
		t.Errorf("granted %v after the crashed waiter queued; a crashed waiter should hold the queue up for its TTL plus at most one renewal (%v)", waited, bound)
	}
	if n := queueLen(t, raw, key); n != 0 {
		t.Errorf("%d waiters left in the queue", n)
	}
}

// TestFairHandoffWakesOnlyTheHead: with ten clients waiting, a release costs
// the server the release script and the next waiter's acquire — not an
// attempt from every waiting client — and the waiters are granted in the
// order they queued.
func TestFairHandoffWakesOnlyTheHead(t *testing.T) {
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	ctx := testCtx(t)
	const key = "fair/herd"
	const n = 10
	holder := openLocker(t, srv, "fair=true&poll=30s")
	// The first run of a script costs an EVALSHA answered NOSCRIPT and an
	// EVAL: load the release script before counting.
	release(t, acquireLease(t, holder, key+"/warm-up"))
	lease, err := holder.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waits := make([]<-chan acquired, n)
	for i := range n {
		l := openLocker(t, srv, "fair=true&poll=30s")
		waits[i] = waitingAcquire(ctx, l, key, dlock.WithTTL(time.Minute))
		waitFor(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, raw, key) == int64(i+1) })
	}
	// Every waiter has subscribed and made its attempt after the
	// confirmation: nothing more until a release (renewals come every
	// 10–20s at TTL 1m).
	waitFor(t, 5*time.Second, "waiters subscribed", func() bool {
		return numSub(t, raw, redis.ReleaseChannel(redis.DefaultPrefix, key)) == n
	})
	time.Sleep(100 * time.Millisecond)
	for i := range n {
		before := scriptCalls(t, raw)
		release(t, lease)
		r := <-waits[i]
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		calls := scriptCalls(t, raw) - before
		t.Logf("hand-off %d: %d script calls", i, calls)
		if calls > 2 {
			t.Errorf("hand-off %d to waiter %d cost %d script calls, want 2 (release, the head's acquire)", i, i, calls)
		}
		for j := i + 1; j < n; j++ {
			select {
			case r := <-waits[j]:
				t.Fatalf("waiter %d granted (%v) before waiter %d released: not FIFO", j, r.err, i)
			default:
			}
		}
		lease = r.lease
	}
	release(t, lease)
}
