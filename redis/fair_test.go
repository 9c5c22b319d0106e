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

// waiterChannels are the fair-mode clients' wake-up channels that have
// subscribers.
func waiterChannels(t testing.TB, c *goredis.Client) []string {
	t.Helper()
	chans, err := c.PubSubChannels(context.Background(), redis.DefaultPrefix+"waiters:*").Result()
	if err != nil {
		t.Fatalf("PUBSUB CHANNELS: %v", err)
	}
	return chans
}

// fairAttempt runs the fair acquire script for a waiter written by the test
// (a crashed or a leaving one), as the driver calls it: it joins the queue,
// with one TTL for its lease and its place, and a wake-up channel of its own.
func fairAttempt(t testing.TB, c *goredis.Client, k *rediscore.Keys, waiter string, ttl time.Duration) []int64 {
	t.Helper()
	ms := ttl.Milliseconds()
	res, err := rediscore.FairAcquire.Run(context.Background(), c,
		k.FairAcquireKeys(),
		waiter, ms, "1", ms, k.Channel, waiter+"'s channel").Int64Slice()
	if err != nil {
		t.Fatalf("%s's attempt: %v", waiter, err)
	}
	return res
}

// fairEnqueue is fairAttempt for a waiter that must be refused and become
// the head of the queue.
func fairEnqueue(t testing.TB, c *goredis.Client, k *rediscore.Keys, waiter string, ttl time.Duration) {
	t.Helper()
	if res := fairAttempt(t, c, k, waiter, ttl); len(res) != 4 || res[0] != 0 || res[2] != 0 {
		t.Fatalf("%s's enqueue: %v, want [0 pttl 0 now]", waiter, res)
	}
}

// TestFairDropsCrashedWaiter: a waiter that crashed while first in the queue
// (its entry written by the real script, then never renewed) holds the queue
// up for its own TTL and no longer: the release hands it the lock, which
// expires after that TTL, and the live waiter behind it is granted then —
// not before (the order is kept), and not only at a poll (the poll is 30s).
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
	fairEnqueue(t, raw, k, "crashed-waiter", crashedTTL)
	enqueued := time.Now()
	got := waitingAcquire(ctx, waiter, key, dlock.WithTTL(3*time.Second))
	waitFor(t, 5*time.Second, "live waiter queued", func() bool { return queueLen(t, raw, key) == 2 })
	release(t, lease) // hands the lock to the crashed waiter, which never comes
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
// the server the release script alone — it hands the lock to the head of the
// queue, which makes no request of its own, and no other waiting client makes
// one either — the waiters are granted in the order they queued, and each
// grant's token is above the one before.
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
	// Every waiter has subscribed to its client's own channel, not the
	// key's, and made its attempt after the confirmation: nothing more until
	// a release (renewals come every 10–20s at TTL 1m).
	waitFor(t, 5*time.Second, "waiters subscribed", func() bool {
		return len(waiterChannels(t, raw)) == n
	})
	if subs := numSub(t, raw, redis.ReleaseChannel(redis.DefaultPrefix, key)); subs != 0 {
		t.Errorf("%d clients subscribed to the key's release channel, want 0 (fair waiters hear only their own channel)", subs)
	}
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
		if calls != 1 {
			t.Errorf("hand-off %d to waiter %d cost %d script calls, want 1 (the release, which hands the lock over)", i, i, calls)
		}
		if r.lease.Token() <= lease.Token() {
			t.Errorf("hand-off %d: token %d, not above the releaser's %d", i, r.lease.Token(), lease.Token())
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

// TestFairHandedLockPassedOnByAWaiterThatLeaves: a release hands the lock to
// the head of the queue; if that waiter gives up at the same moment (its
// leave request runs after the hand-off), its leave passes the lock on to the
// next waiter at once, rather than leaving it held for the lease TTL the
// waiter asked for. The head here is a waiter written by the real scripts.
func TestFairHandedLockPassedOnByAWaiterThatLeaves(t *testing.T) {
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	ctx := testCtx(t)
	const key = "fair/leaves"
	holder := openLocker(t, srv, "fair=true")
	waiter := openLocker(t, srv, "fair=true&poll=30s")
	lease, err := holder.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	k := rediscore.KeysFor(redis.DefaultPrefix, key)
	const ghost = "leaving-waiter"
	fairEnqueue(t, raw, k, ghost, time.Minute)
	got := waitingAcquire(ctx, waiter, key, dlock.WithTTL(time.Minute))
	waitFor(t, 5*time.Second, "second waiter queued", func() bool { return queueLen(t, raw, key) == 2 })
	release(t, lease)
	if v, err := raw.Get(ctx, k.Lock).Result(); err != nil || v != ghost {
		t.Fatalf("after the release the lock's value is %q (%v), want the head of the queue, %q", v, err, ghost)
	}
	if pttl, err := raw.PTTL(ctx, k.Lock).Result(); err != nil || pttl <= 50*time.Second {
		t.Fatalf("the handed lock's TTL is %v (%v), want the head's lease TTL, 1m", pttl, err)
	}
	select {
	case r := <-got:
		t.Fatalf("the second waiter was granted (%v) while the lock was the head's", r.err)
	default:
	}
	left, err := rediscore.FairRelease.Run(ctx, raw, k.FairReleaseKeys(),
		ghost, k.Channel, "1", "1").Int64()
	if err != nil || left != 1 {
		t.Fatalf("the head's leave: %v %v, want 1", left, err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.lease.Token() <= lease.Token() {
			t.Errorf("the second waiter's token %d is not above the first holder's %d", r.lease.Token(), lease.Token())
		}
		release(t, r.lease)
	case <-time.After(10 * time.Second):
		t.Fatal("the second waiter was not granted within 10s of the head's leave (the lock's TTL is 1m)")
	}
	if n := queueLen(t, raw, key); n != 0 {
		t.Errorf("%d waiters left in the queue", n)
	}
}

// TestFairIgnoresAStaleHandoff: a hand-off message older than the waiter's
// last refused attempt (by the server's clock) is not believed: the lock it
// handed over was lost before that attempt ran, since the attempt found it
// another's. The waiter makes an attempt instead, and keeps waiting. (The
// message is forged here, as such a late one would read.)
func TestFairIgnoresAStaleHandoff(t *testing.T) {
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	ctx := testCtx(t)
	const key = "fair/stale-handoff"
	holder := openLocker(t, srv, "fair=true")
	waiter := openLocker(t, srv, "fair=true&poll=30s")
	// Load the scripts first (a first run costs a NOSCRIPT and an EVAL), so
	// the waiter's attempts can be counted one by one.
	release(t, acquireLease(t, holder, key+"/warm-up"))
	lease, err := holder.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	k := rediscore.KeysFor(redis.DefaultPrefix, key)
	base := scriptCalls(t, raw)
	got := waitingAcquire(ctx, waiter, key, dlock.WithTTL(time.Minute))
	// Its first attempt, then one once its subscription is confirmed; then
	// it waits 10–20s.
	waitFor(t, 5*time.Second, "the waiter's two attempts", func() bool { return scriptCalls(t, raw)-base == 2 })
	name, err := raw.ZRange(ctx, k.Queue(), 0, 0).Result()
	if err != nil || len(name) != 1 {
		t.Fatalf("the queue: %v %v, want the waiter", name, err)
	}
	chans := waiterChannels(t, raw)
	if len(chans) != 1 {
		t.Fatalf("waiter channels %q, want the waiter's", chans)
	}
	if err := raw.Publish(ctx, chans[0], "!999 1 "+name[0]).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the waiter's attempt or grant after the message", func() bool {
		return scriptCalls(t, raw)-base == 3 || len(got) > 0
	})
	select {
	case r := <-got:
		t.Fatalf("the waiter believed a stale hand-off: granted %v, token %d", r.err, r.lease.Token())
	default:
	}
	release(t, lease)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.lease.Token() <= lease.Token() {
		t.Errorf("the waiter's token %d is not above the holder's %d", r.lease.Token(), lease.Token())
	}
	release(t, r.lease)
}

// TestFairHandedWaiterAttemptKeepsTheToken: a waiter whose attempt reaches
// the server after a release handed it the lock (the hand-off message still
// on its way, or lost) is granted the handed lock as it is: the same token,
// nothing announced. A second token would show followers (Watch, election's
// Observe) two grants where there was one.
func TestFairHandedWaiterAttemptKeepsTheToken(t *testing.T) {
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	ctx := testCtx(t)
	const key = "fair/handed-attempt"
	holder := openLocker(t, srv, "fair=true")
	lease, err := holder.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	k := rediscore.KeysFor(redis.DefaultPrefix, key)
	const waiter = "handed-waiter"
	fairEnqueue(t, raw, k, waiter, time.Minute)
	follower := raw.Subscribe(ctx, k.Channel)
	defer follower.Close()
	if _, err := follower.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	release(t, lease)
	handed, err := raw.Get(ctx, k.Fence).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := follower.ReceiveMessage(ctx); err != nil || msg.Payload != rediscore.GrantMessage {
		t.Fatalf("the hand-off's announcement: %v %v, want %q", msg, err, rediscore.GrantMessage)
	}
	if res := fairAttempt(t, raw, k, waiter, time.Minute); len(res) != 2 || res[0] != 1 || res[1] != handed {
		t.Fatalf("the handed waiter's attempt: %v, want [1 %d] (the handed token)", res, handed)
	}
	if now, err := raw.Get(ctx, k.Fence).Int64(); err != nil || now != handed {
		t.Errorf("the counter moved from %d to %d (%v)", handed, now, err)
	}
	if err := raw.Publish(ctx, k.Channel, "marker").Err(); err != nil {
		t.Fatal(err)
	}
	if msg, err := follower.ReceiveMessage(ctx); err != nil || msg.Payload != "marker" {
		t.Errorf("after the attempt the follower heard %v (%v), want nothing before the marker", msg, err)
	}
	if n := queueLen(t, raw, key); n != 0 {
		t.Errorf("%d waiters left in the queue", n)
	}
}
