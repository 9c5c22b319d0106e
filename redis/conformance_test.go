package redis_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// harness runs the conformance suite on one redis-server, a Sentinel
// deployment or a Cluster. Each locker has its own client and connections, as
// a separate process would.
type harness struct {
	dial func() goredis.UniversalClient // a new client with ContextTimeoutEnabled
	raw  goredis.UniversalClient        // for Expire, behind the lockers' backs
	opts *redis.Options
	dsn  string // "" unless the harness reaches one server started by newHarness

	mu      sync.Mutex
	clients map[dlock.Locker]goredis.UniversalClient
}

func newHarness(t testing.TB) *harness {
	srv := testenv.StartRedis(t)
	h := newHarnessDial(t, func() goredis.UniversalClient {
		return goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	})
	h.dsn = "redis://" + srv.Addr() + "/0"
	return h
}

// newHarnessDial returns a harness whose lockers each use a client from dial.
func newHarnessDial(t testing.TB, dial func() goredis.UniversalClient) *harness {
	raw := dial()
	t.Cleanup(func() { _ = raw.Close() })
	return &harness{dial: dial, raw: raw, clients: map[dlock.Locker]goredis.UniversalClient{}}
}

func (h *harness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	return h.lockerWith(t, h.opts)
}

// lockerWith is NewLocker with the driver options opts.
func (h *harness) lockerWith(t testing.TB, opts *redis.Options) dlock.Locker {
	t.Helper()
	client := h.dial()
	rl, err := redis.New(context.Background(), client, opts)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	l := &clientLocker{Locker: rl, client: client}
	h.mu.Lock()
	h.clients[l] = client
	h.mu.Unlock()
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// clientLocker is a Locker that closes its client with it, as one opened
// from a DSN does (redis.New leaves the caller's client open), so that the
// suite sees the client's goroutines end with Close.
type clientLocker struct {
	dlock.Locker
	client goredis.UniversalClient
}

// Inspect, List and Break forward to the wrapped Locker.
func (l *clientLocker) Inspect(ctx context.Context, key string) (dlock.LockInfo, error) {
	return dlock.Inspect(ctx, l.Locker, key)
}

func (l *clientLocker) List(ctx context.Context, prefix string) ([]dlock.LockInfo, error) {
	return dlock.List(ctx, l.Locker, prefix)
}

func (l *clientLocker) Break(ctx context.Context, key string) (dlock.LockInfo, error) {
	return dlock.Break(ctx, l.Locker, key)
}

func (l *clientLocker) Watch(ctx context.Context, key string, changed func()) error {
	return dlock.Watch(ctx, l.Locker, key, changed)
}

func (l *clientLocker) Close() error {
	err := l.Locker.Close()
	_ = l.client.Close() // a second Close, after Crash or Close, is harmless
	return err
}

// Crash cuts the locker off from the server without releasing anything, as a
// killed process would: its locks must go by their TTL on the server's clock.
func (h *harness) Crash(t testing.TB, l dlock.Locker) {
	h.mu.Lock()
	client := h.clients[l]
	h.mu.Unlock()
	if client == nil {
		t.Fatal("Crash: locker not made by this harness")
	}
	if err := client.Close(); err != nil {
		t.Fatalf("Crash: %v", err)
	}
}

// Expire deletes key's lock key or, for the key of a permit's slot
// (NAME/permits/i) held in a counted semaphore, that slot's entries in the
// semaphore's sorted set and holders hash, as the next script's sweep would
// once the permit's expiry passed. The counter stays.
func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	n, err := h.raw.Del(context.Background(), redis.LockKey(redis.DefaultPrefix, key)).Result()
	if err != nil {
		t.Fatalf("Expire(%q): DEL: %v", key, err)
	}
	if name, slot, ok := splitPermitKey(key); ok && n == 0 {
		k := permitKeys(redis.DefaultPrefix, name)
		s := strconv.Itoa(slot)
		pipe := h.raw.TxPipeline()
		zrem := pipe.ZRem(context.Background(), k.permits, s)
		hdel := pipe.HDel(context.Background(), k.holders, s)
		if _, err := pipe.Exec(context.Background()); err != nil {
			t.Fatalf("Expire(%q): ZREM, HDEL: %v", key, err)
		}
		if zrem.Val() != 1 || hdel.Val() != 1 {
			t.Fatalf("Expire(%q): slot %d of %q was not held (ZREM %d, HDEL %d)", key, slot, k.permits, zrem.Val(), hdel.Val())
		}
		return
	}
	if n != 1 {
		t.Fatalf("Expire(%q): the lock key %q did not exist", key, redis.LockKey(redis.DefaultPrefix, key))
	}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t))
}

// TestConformanceFair runs the suite in fair mode, which claims FIFO.
func TestConformanceFair(t *testing.T) {
	h := newHarness(t)
	h.opts = &redis.Options{Fair: true}
	h.dsn += "?fair=true"
	conformance.Run(t, h)
}

func BenchmarkConformance(b *testing.B) {
	conformance.RunBenchmarks(b, newHarness(b))
}

// Waiters counts the waiters: in fair mode the queue, else the subscribers
// to key's release channel (on a Cluster, on every node).
func (h *harness) Waiters(t testing.TB, key string) int {
	t.Helper()
	prefix := redis.DefaultPrefix
	if h.opts != nil && h.opts.Prefix != "" {
		prefix = h.opts.Prefix
	}
	if h.opts != nil && h.opts.Fair {
		// Fair waiters listen on their clients' own channels; the queue
		// counts them.
		q := redis.LockKey(prefix, key) + ":queue"
		n, err := h.raw.ZCard(context.Background(), q).Result()
		if err != nil {
			t.Fatalf("ZCARD %s: %v", q, err)
		}
		return int(n)
	}
	ch := redis.ReleaseChannel(prefix, key)
	if cc, ok := h.raw.(*goredis.ClusterClient); ok {
		// Subscriptions are counted per node, and a client's pub/sub
		// connection may be on any node: add them up.
		var mu sync.Mutex
		n := 0
		err := cc.ForEachShard(context.Background(), func(ctx context.Context, c *goredis.Client) error {
			m, err := c.PubSubNumSub(ctx, ch).Result()
			mu.Lock()
			n += int(m[ch])
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatalf("PUBSUB NUMSUB %s: %v", ch, err)
		}
		return n
	}
	m, err := h.raw.PubSubNumSub(context.Background(), ch).Result()
	if err != nil {
		t.Fatalf("PUBSUB NUMSUB %s: %v", ch, err)
	}
	return int(m[ch])
}

// NewSlowPollLocker is NewLocker with a 30s polling fallback: only the
// release message can wake its waiters within conformance.PushWaitBound.
func (h *harness) NewSlowPollLocker(t testing.TB) dlock.Locker {
	t.Helper()
	o := redis.Options{}
	if h.opts != nil {
		o = *h.opts
	}
	o.PollInterval = 30 * time.Second
	return h.lockerWith(t, &o)
}

// Residue reports the lock key, and the shared holders' and waiting
// writers' sets, if they are still there; the fence counter stays
// by design (it keeps tokens increasing).
func (h *harness) Residue(t testing.TB, key string) []string {
	t.Helper()
	lk := redis.LockKey(redis.DefaultPrefix, key)
	// A key held shared: its shared holders and its waiting writers' marks
	// (each set goes with its last entry).
	names := []string{lk, lk + ":readers", lk + ":writers"}
	if h.opts != nil && h.opts.Fair {
		// A waiter that gave up takes itself out of the queue (an empty
		// sorted set is no key at all); the arrival counter stays, as the
		// fence counter does, until it expires.
		names = append(names, lk+":queue", lk+":qexp", lk+":qwait")
	}
	if name, _, ok := splitPermitKey(key); ok {
		// A permit's slot: the semaphore's keys, which go with its last
		// permit (its counter stays).
		k := permitKeys(redis.DefaultPrefix, name)
		names = append(names, k.permits, k.holders, k.size)
	}
	var left []string
	for _, name := range names {
		n, err := h.raw.Exists(context.Background(), name).Result()
		if err != nil {
			t.Fatalf("Residue: EXISTS: %v", err)
		}
		if n > 0 {
			left = append(left, name)
		}
	}
	return left
}

// DSN reaches the server the harness started ("" for a harness built on
// another client, such as Sentinel's or Cluster's).
func (h *harness) DSN(testing.TB) string { return h.dsn }

var (
	_ conformance.Inspector = (*harness)(nil)
	_ conformance.DSNer     = (*harness)(nil)
)

// semKeys are the Redis names of a counted semaphore (docs/redis.md).
type semKeys struct{ permits, holders, size, fence, channel string }

func permitKeys(prefix, name string) semKeys {
	p := redis.LockKey(prefix, name) + ":permits"
	return semKeys{permits: p, holders: p + ":holders", size: p + ":size", fence: p + ":fence", channel: p + ":released"}
}

// splitPermitKey splits the key of a permit's slot, NAME/permits/i.
func splitPermitKey(key string) (name string, slot int, ok bool) {
	i := strings.LastIndex(key, "/permits/")
	if i <= 0 {
		return "", 0, false
	}
	slot, err := strconv.Atoi(key[i+len("/permits/"):])
	return key[:i], slot, err == nil
}
