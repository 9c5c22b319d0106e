package redis_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// testCtx is bounded, so a broken driver fails a test instead of hanging it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func rawClient(t testing.TB, srv *testenv.Redis) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// wakeSetup starts a server for a wake-up test and returns it, a raw client,
// a holder's Locker (a), a waiters' Locker (b) that polls every poll, and
// the test's ctx. With a long poll, a waiter granted sooner than half of it
// was woken (see grantedPromptly).
func wakeSetup(t *testing.T, poll time.Duration) (*testenv.Redis, *goredis.Client, dlock.Locker, dlock.Locker, context.Context) {
	t.Helper()
	srv := testenv.StartRedis(t)
	return srv, rawClient(t, srv), openLocker(t, srv, ""), openLocker(t, srv, "poll="+poll.String()), testCtx(t)
}

// openLocker opens a Locker on srv with extra DSN parameters ("poll=10s").
func openLocker(t testing.TB, srv *testenv.Redis, params string, opts ...dlock.Option) dlock.Locker {
	t.Helper()
	dsn := srv.URL()
	if params != "" {
		dsn += "?" + params
	}
	l, err := dlock.Open(context.Background(), dsn, opts...)
	if err != nil {
		t.Fatalf("dlock.Open(%q): %v", dsn, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func release(t testing.TB, lease *dlock.Lease) {
	t.Helper()
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release(%q): %v", lease.Key(), err)
	}
}

// serverMicros is the server's clock in microseconds.
func serverMicros(t testing.TB, c *goredis.Client) uint64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return uint64(now.UnixMicro())
}

// acquireToken takes and releases key, returning the token.
func acquireToken(t testing.TB, l dlock.Locker, key string) dlock.Token {
	t.Helper()
	lease, err := l.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", key, err)
	}
	release(t, lease)
	return lease.Token()
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func numSub(t testing.TB, c *goredis.Client, channel string) int64 {
	t.Helper()
	m, err := c.PubSubNumSub(context.Background(), channel).Result()
	if err != nil {
		t.Fatalf("PUBSUB NUMSUB: %v", err)
	}
	return m[channel]
}

func TestTokenFloorAfterFenceLoss(t *testing.T) {
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	l := openLocker(t, srv, "")
	const key = "floor/fence-deleted"

	before := serverMicros(t, raw)
	t1 := acquireToken(t, l, key)
	if uint64(t1) < before {
		t.Errorf("first token %d is below the server clock %d µs: not floored", t1, before)
	}
	t2 := acquireToken(t, l, key)
	if t2 <= t1 {
		t.Fatalf("tokens %d then %d: not increasing", t1, t2)
	}
	got, err := raw.Get(context.Background(), redis.FenceKey(redis.DefaultPrefix, key)).Uint64()
	if err != nil || got != uint64(t2) {
		t.Fatalf("fence key holds %d (err %v), want the last token %d", got, err, t2)
	}

	// Lose the counter, as an eviction or FLUSHALL would.
	if err := raw.Del(context.Background(), redis.FenceKey(redis.DefaultPrefix, key)).Err(); err != nil {
		t.Fatal(err)
	}
	t3 := acquireToken(t, l, key)
	if t3 <= t2 {
		t.Fatalf("after the fence key was deleted: token %d, want > %d", t3, t2)
	}
}

func TestTokenFloorAfterRestartWithoutPersistence(t *testing.T) {
	srv := testenv.StartRedis(t) // no persistence: a restart forgets everything
	raw := rawClient(t, srv)
	const key = "floor/restart"
	l := openLocker(t, srv, "")
	var last dlock.Token
	for range 3 {
		last = acquireToken(t, l, key)
	}
	_ = l.Close()

	srv.Restart()
	n, err := raw.Exists(context.Background(), redis.FenceKey(redis.DefaultPrefix, key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("the fence key survived a restart without persistence; the test proves nothing")
	}
	l2 := openLocker(t, srv, "")
	if next := acquireToken(t, l2, key); next <= last {
		t.Fatalf("after a restart without persistence: token %d, want > %d", next, last)
	}
}

func TestTokenSurvivesRestartWithPersistence(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.WithPersistence())
	l := openLocker(t, srv, "")
	const key = "floor/persistent"
	last := acquireToken(t, l, key)
	_ = l.Close()
	srv.Restart()
	l2 := openLocker(t, srv, "")
	if next := acquireToken(t, l2, key); next <= last {
		t.Fatalf("after a restart with persistence: token %d, want > %d", next, last)
	}
}

// oddKeys are keys whose hash tag could go wrong.
var oddKeys = []string{
	"plain",
	"{", "}", "{}", "}{", "{a}", "a{b}c", "a{b", "a%7Bb", "a%7bb", "%", "%25", "%%", "%7D",
	"{user1000}.following",
	"ключ/日本語/🔒",
	"with space/and/slashes",
	":fence", "x}:fence", "x:released",
	strings.Repeat("k", dlock.MaxKeyLen),
}

func TestKeyLayout(t *testing.T) {
	if got, want := redis.LockKey("p:", "a{b}%c"), "p:{a%7Bb%7D%25c}"; got != want {
		t.Errorf("LockKey = %q, want %q", got, want)
	}
	if got, want := redis.FenceKey("p:", "k"), "p:{k}:fence"; got != want {
		t.Errorf("FenceKey = %q, want %q", got, want)
	}
	if got, want := redis.ReleaseChannel("p:", "k"), "p:{k}:released"; got != want {
		t.Errorf("ReleaseChannel = %q, want %q", got, want)
	}

	// Injective: no two keys share a name.
	names := map[string]string{}
	for _, k := range oddKeys {
		for _, n := range []string{redis.LockKey("dlock:", k), redis.FenceKey("dlock:", k)} {
			if other, dup := names[n]; dup {
				t.Errorf("keys %q and %q both map to %q", k, other, n)
			}
			names[n] = k
		}
	}

	// One slot per key: ask a cluster-enabled server, which computes
	// CLUSTER KEYSLOT as Redis Cluster routes.
	srv := testenv.StartRedis(t, testenv.WithRedisArgs("--cluster-enabled", "yes"))
	raw := rawClient(t, srv)
	ctx := testCtx(t)
	for _, k := range oddKeys {
		tag := redis.HashTag(k)
		want, err := raw.ClusterKeySlot(ctx, tag).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		for _, n := range []string{redis.LockKey("dlock:", k), redis.FenceKey("dlock:", k), redis.ReleaseChannel("dlock:", k)} {
			got, err := raw.ClusterKeySlot(ctx, n).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT: %v", err)
			}
			if got != want {
				t.Errorf("key %q: %q is in slot %d, want the tag's slot %d", k, n, got, want)
			}
		}
	}
}

// TestOddKeysAreDistinctLocks holds every odd key at once from one locker:
// a mapping that merged two keys would make one TryAcquire fail.
func TestOddKeysAreDistinctLocks(t *testing.T) {
	srv := testenv.StartRedis(t)
	l := openLocker(t, srv, "")
	ctx := testCtx(t)
	var leases []*dlock.Lease
	for _, k := range oddKeys {
		lease, err := l.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("TryAcquire(%.40q) while holding the other odd keys: %v", k, err)
		}
		leases = append(leases, lease)
	}
	raw := rawClient(t, srv)
	for _, k := range oddKeys {
		n, err := raw.Exists(ctx, redis.LockKey(redis.DefaultPrefix, k)).Result()
		if err != nil || n != 1 {
			t.Errorf("lock key of %.40q: exists=%d err=%v", k, n, err)
		}
	}
	for _, lease := range leases {
		release(t, lease)
	}
}

// TestCluster runs the driver over a ClusterClient against a one-node Redis
// Cluster owning all slots: Redis then rejects any script whose keys span
// slots (CROSSSLOT), so this proves the layout keeps a key in one slot.
func TestCluster(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.WithRedisArgs("--cluster-enabled", "yes"))
	raw := rawClient(t, srv)
	ctx := testCtx(t)
	if err := raw.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("CLUSTER ADDSLOTSRANGE: %v", err)
	}
	waitFor(t, 10*time.Second, "cluster_state:ok", func() bool {
		info, err := raw.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{srv.Addr()}})
	t.Cleanup(func() { _ = cc.Close() })

	// A sanity check that the server enforces slots for scripts.
	err := cc.Eval(ctx, "return redis.call('MGET', KEYS[1], KEYS[2])", []string{"a", "b"}).Err()
	if err == nil {
		t.Fatal("a script over keys in two slots succeeded; the test proves nothing")
	}

	a, err := redis.New(ctx, cc, &redis.Options{PollInterval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	b, err := redis.New(ctx, cc, &redis.Options{PollInterval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for _, k := range oddKeys {
		lease, err := a.Acquire(ctx, k)
		if err != nil {
			t.Fatalf("Acquire(%.40q) on a cluster: %v", k, err)
		}
		if err := lease.Refresh(ctx); err != nil {
			t.Fatalf("Refresh(%.40q) on a cluster: %v", k, err)
		}
		// A waiter woken by the release message, well before its poll.
		got := make(chan error, 1)
		go func() {
			l, err := b.Acquire(ctx, k)
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		waitFor(t, 5*time.Second, "waiter subscribed", func() bool {
			return numSub(t, raw, redis.ReleaseChannel(redis.DefaultPrefix, k)) > 0
		})
		start := time.Now()
		release(t, lease)
		if err := <-got; err != nil {
			t.Fatalf("waiting Acquire(%.40q) on a cluster: %v", k, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("waiter on a cluster took %v after the release; the poll is 10s", d)
		}
	}
	if err := cc.Ping(ctx).Err(); err != nil {
		t.Fatalf("the caller's ClusterClient is unusable after the lockers' use: %v", err)
	}
}

func TestDSN(t *testing.T) {
	srv := testenv.StartRedis(t)
	ctx := testCtx(t)
	// Not --requirepass: testenv's readiness probe does not authenticate.
	if err := rawClient(t, srv).ConfigSet(ctx, "requirepass", "right-password").Err(); err != nil {
		t.Fatal(err)
	}
	host := srv.Addr()
	const secret = "s3cret"

	cases := []struct {
		name, dsn string
		want      []string // substrings of the error
	}{
		{"unknown parameter", "redis://:right-password@" + host + "/0?bogus=1&zz=2", []string{`bogus`, `zz`}},
		{"unknown parameter with password", "redis://u:" + secret + "@" + host + "/0?bogus=1", []string{`bogus`}},
		{"bad go-redis parameter", "redis://u:" + secret + "@" + host + "/0?dial_timeout=soon", []string{"dial_timeout"}},
		{"bad poll", "redis://u:" + secret + "@" + host + "/0?poll=-1s", []string{"poll"}},
		{"repeated poll", "redis://u:" + secret + "@" + host + "/0?poll=1s&poll=2s", []string{"poll"}},
		{"bad fair", "redis://u:" + secret + "@" + host + "/0?fair=maybe", []string{"fair"}},
		{"brace in prefix", "redis://u:" + secret + "@" + host + "/0?prefix=a{b}:", []string{"prefix"}},
		{"empty prefix", "redis://u:" + secret + "@" + host + "/0?prefix=", []string{"prefix"}},
		{"bad db", "redis://u:" + secret + "@" + host + "/zero", []string{"database"}},
		{"bad path", "redis://u:" + secret + "@" + host + "/0/1", []string{"path"}},
		{"wrong password", "redis://:" + secret + "@" + host + "/0", []string{"WRONGPASS"}},
		{"wrong user and password", "redis://bob:" + secret + "@" + host + "/0", []string{"WRONGPASS"}},
		{"escaped password", "redis://:" + secret + "%2F%40x@" + host + "/0?bogus=1", []string{"bogus"}},
		{"nothing listening", "redis://:" + secret + "@127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) + "/0", []string{"ping", "refused"}},
		{"TLS to a plain server", "rediss://:" + secret + "@" + host + "/0?dial_timeout=1s", []string{"ping"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			octx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			l, err := dlock.Open(octx, tc.dsn)
			if err == nil {
				_ = l.Close()
				t.Fatalf("Open(%q) succeeded", tc.dsn)
			}
			msg := err.Error()
			t.Logf("%s", msg)
			if strings.Contains(msg, secret) || strings.Contains(msg, "s3cret%2F") {
				t.Errorf("error contains the password: %s", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
		})
	}

	// Parameter errors match ErrInvalidOption.
	_, err := dlock.Open(ctx, "redis://"+host+"/0?bogus=1")
	if !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("unknown parameter: %v, want it to match ErrInvalidOption", err)
	}

	// Open is bounded by ctx: a paused server never answers PING.
	paused := testenv.StartRedis(t)
	paused.Pause()
	defer paused.Resume()
	start := time.Now()
	octx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if l, err := dlock.Open(octx, paused.URL()); err == nil {
		_ = l.Close()
		t.Fatal("Open of a paused server succeeded")
	} else if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Open of a paused server with a 300ms ctx returned after %v: %v", d, err)
	}

	// The right password, and every driver parameter, work.
	l, err := dlock.Open(ctx, "redis://:right-password@"+host+"/3?prefix=app:&poll=250ms&dial_timeout=2s&ttl=5s")
	if err != nil {
		t.Fatalf("Open with valid parameters: %v", err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, "dsn")
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, lease)
	raw := goredis.NewClient(&goredis.Options{Addr: host, Password: "right-password", DB: 3})
	defer raw.Close()
	if n, err := raw.Exists(ctx, "app:{dsn}").Result(); err != nil || n != 1 {
		t.Errorf("lock key app:{dsn} in db 3: exists=%d err=%v", n, err)
	}
	if ttl, err := raw.PTTL(ctx, "app:{dsn}").Result(); err != nil || ttl > 5*time.Second || ttl < 4*time.Second {
		t.Errorf("PTTL of the lock = %v (err %v), want the DSN's ttl=5s", ttl, err)
	}
}

func TestNewDriverOptions(t *testing.T) {
	srv := testenv.StartRedis(t)
	client := rawClient(t, srv)
	if _, err := redis.NewDriver(context.Background(), nil, nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("NewDriver(nil): %v, want ErrInvalidOption", err)
	}
	if _, err := redis.NewDriver(context.Background(), client, &redis.Options{Prefix: "x{"}); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("prefix with a brace: %v, want ErrInvalidOption", err)
	}
	if _, err := redis.NewDriver(context.Background(), client, &redis.Options{PollInterval: -time.Second}); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("negative poll: %v, want ErrInvalidOption", err)
	}
	d, err := redis.NewDriver(context.Background(), client, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Prefix() != redis.DefaultPrefix || d.Name() != "redis" {
		t.Errorf("Prefix() = %q, Name() = %q", d.Prefix(), d.Name())
	}
	l, err := dlock.New(d, dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	lease, err := l.TryAcquire(ctx, "new-driver")
	if err != nil {
		t.Fatal(err)
	}
	if v := time.Until(lease.Deadline()); v > 10*time.Second-backend.DriftAllowance(10*time.Second) || v < 9*time.Second {
		t.Errorf("lease deadline in %v, want just under TTL − drift", v)
	}
	release(t, lease)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("the caller's client was closed with the Locker: %v", err)
	}
}

func TestTTLTooShort(t *testing.T) {
	srv := testenv.StartRedis(t)
	l := openLocker(t, srv, "")
	_, err := l.TryAcquire(testCtx(t), "short", dlock.WithTTL(2*time.Millisecond))
	if !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("TTL 2ms: %v, want ErrInvalidOption", err)
	}
	// The grant must reach the caller within its 11ms: warm the Locker up
	// (its connection, the scripts loaded), and allow a loaded host a few
	// tries.
	warm, err := l.TryAcquire(testCtx(t), "warm-up")
	if err != nil {
		t.Fatal(err)
	}
	release(t, warm)
	var lease *dlock.Lease
	for try := 1; ; try++ {
		lease, err = l.TryAcquire(testCtx(t), "short", dlock.WithTTL(1500*time.Microsecond+10*time.Millisecond))
		if err == nil {
			break
		}
		if try == 5 {
			t.Fatalf("TTL 11.5ms, try %d: %v", try, err)
		}
		t.Logf("TTL 11.5ms, try %d: %v", try, err)
	}
	// PX is whole milliseconds (11): the deadline must not count the 0.5ms.
	if v := time.Until(lease.Deadline()); v > 11*time.Millisecond {
		t.Errorf("deadline in %v for a TTL sent as 11ms", v)
	}
	_ = lease.Release(context.Background())
}

// TestRetriedAcquireIsIdempotent: a request whose reply was lost and that the
// client retries (same owner) is granted again, with a higher token, instead
// of finding "its own" lock held and waiting for it to expire.
func TestRetriedAcquireIsIdempotent(t *testing.T) {
	srv := testenv.StartRedis(t)
	d, err := redis.NewDriver(context.Background(), rawClient(t, srv), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := testCtx(t)
	req := backend.AcquireRequest{Key: "retry", Owner: backend.NewOwnerID(), TTL: time.Minute}
	g1, err := d.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("second attempt with the same owner: %v", err)
	}
	if g2.Token <= g1.Token {
		t.Errorf("tokens %d then %d", g1.Token, g2.Token)
	}
	other := req
	other.Owner = backend.NewOwnerID()
	if _, err := d.Acquire(ctx, other); !errors.Is(err, backend.ErrHeld) {
		t.Errorf("another owner: %v, want ErrHeld", err)
	}
	if err := d.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, g1); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("second release: %v, want ErrNotHeld", err)
	}
	if _, err := d.Refresh(ctx, g1, time.Minute); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("refresh after release: %v, want ErrNotHeld", err)
	}
}

// waitingAcquire starts l.Acquire(key) and returns a channel that gets its
// result, stamped with the time it returned.
type acquired struct {
	lease *dlock.Lease
	err   error
	at    time.Time
}

func waitingAcquire(ctx context.Context, l dlock.Locker, key string, opts ...dlock.AcquireOption) <-chan acquired {
	c := make(chan acquired, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, opts...)
		c <- acquired{lease, err, time.Now()}
	}()
	return c
}

func TestWaiterWokenByPublish(t *testing.T) {
	const poll = 10 * time.Second
	_, raw, a, b, ctx := wakeSetup(t, poll)
	const key = "wake/publish"
	for i := range 5 {
		lease, err := a.Acquire(ctx, key, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		got := waitingAcquire(ctx, b, key, dlock.WithTTL(time.Minute))
		waitFor(t, 5*time.Second, "waiter subscribed", func() bool {
			return numSub(t, raw, redis.ReleaseChannel(redis.DefaultPrefix, key)) == 1
		})
		time.Sleep(20 * time.Millisecond) // let it pass its confirmed retry
		release(t, grantedPromptly(t, lease, got, poll, fmt.Sprintf("round %d: the waiter", i)))
	}
}

// grantedPromptly releases lease and returns the lease the waiter got
// delivers, failing the test if it came later than a wake-up explains: half
// the waiter's poll interval.
func grantedPromptly(t *testing.T, lease *dlock.Lease, got <-chan acquired, poll time.Duration, who string) *dlock.Lease {
	t.Helper()
	released := time.Now()
	release(t, lease)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	d := r.at.Sub(released)
	t.Logf("%s was granted %v after the release", who, d)
	if d > poll/2 {
		t.Errorf("%s was granted %v after the release; only a poll (%v) explains that", who, d, poll)
	}
	return r.lease
}

// TestLostPublishDoesNotStrand deletes the lock behind the holder's back, with
// no release message: the waiter must still get the lock within a poll.
func TestLostPublishDoesNotStrand(t *testing.T) {
	const poll = 300 * time.Millisecond
	_, raw, a, b, ctx := wakeSetup(t, poll)
	const key = "wake/lost-publish"
	lease, err := a.Acquire(ctx, key, dlock.WithTTL(time.Minute), dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	got := waitingAcquire(ctx, b, key)
	waitFor(t, 5*time.Second, "waiter subscribed", func() bool {
		return numSub(t, raw, redis.ReleaseChannel(redis.DefaultPrefix, key)) == 1
	})
	deleted := time.Now()
	if err := raw.Del(ctx, redis.LockKey(redis.DefaultPrefix, key)).Err(); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	d := r.at.Sub(deleted)
	t.Logf("silent DEL → waiter granted in %v (poll %v)", d, poll)
	if d > poll+time.Second {
		t.Errorf("waiter granted %v after a silent DEL, poll is %v", d, poll)
	}
	release(t, r.lease)
	if err := lease.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("the first holder's release: %v, want ErrLeaseLost", err)
	}
}

// TestWaiterWokenByExpiry: a holder that vanishes is not announced; the waiter
// retries when the holder's TTL runs out, not a poll later.
func TestWaiterWokenByExpiry(t *testing.T) {
	srv := testenv.StartRedis(t)
	const poll, ttl = 10 * time.Second, 500 * time.Millisecond
	b := openLocker(t, srv, "poll="+poll.String())
	ctx := testCtx(t)
	const key = "wake/expiry"
	// A holder that vanished: a dlock holder whose deadline passes releases
	// the lock itself, if its process still runs.
	start := time.Now()
	if err := rawClient(t, srv).Set(ctx, redis.LockKey(redis.DefaultPrefix, key), "ghost", ttl).Err(); err != nil {
		t.Fatal(err)
	}
	r := <-waitingAcquire(ctx, b, key)
	if r.err != nil {
		t.Fatal(r.err)
	}
	d := r.at.Sub(start)
	t.Logf("holder with TTL %v vanished → waiter granted after %v", ttl, d)
	if d < ttl || d > ttl+time.Second {
		t.Errorf("waiter granted %v after a grant with TTL %v (poll %v)", d, ttl, poll)
	}
	release(t, r.lease)
}

// TestWaiterSurvivesRestart: the server restarts (forgetting the lock) while
// a call waits. The pub/sub connection reconnects and the waiter gets the lock
// well before its poll.
func TestWaiterSurvivesRestart(t *testing.T) {
	const poll = 10 * time.Second
	srv, raw, a, b, ctx := wakeSetup(t, poll)
	const key = "wake/restart"
	if _, err := a.Acquire(ctx, key, dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	got := waitingAcquire(ctx, b, key)
	waitFor(t, 5*time.Second, "waiter subscribed", func() bool {
		return numSub(t, raw, redis.ReleaseChannel(redis.DefaultPrefix, key)) == 1
	})
	start := time.Now()
	srv.Restart()
	r := <-got
	if r.err != nil {
		t.Fatalf("waiting Acquire across a restart: %v", r.err)
	}
	d := r.at.Sub(start)
	t.Logf("restart → waiter granted after %v", d)
	if d > poll/2 {
		t.Errorf("waiter granted %v after the restart; only a poll (%v) explains that", d, poll)
	}
	release(t, r.lease)
}

// TestWaiterRidesOutOutage: a waiting Acquire keeps waiting while the server
// is down (its attempts fail with "connection refused"), and is granted once
// the server is back and the lock is free — as on every other backend. The
// old holder's key died with the server, which kept no persistence.
func TestWaiterRidesOutOutage(t *testing.T) {
	srv := testenv.StartRedis(t)
	a := openLocker(t, srv, "")
	b := openLocker(t, srv, "poll=50ms") // attempts every 50ms: several fall in the outage
	ctx := testCtx(t)
	const key = "wake/outage"
	if _, err := a.Acquire(ctx, key, dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	got := waitingAcquire(ctx, b, key)
	srv.Kill()
	select {
	case r := <-got:
		t.Fatalf("waiting Acquire returned during the outage: %v", r.err)
	case <-time.After(3 * time.Second): // the outage: longer than go-redis retries one command
	}
	srv.Restart()
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("waiting Acquire across the outage: %v", r.err)
		}
		release(t, r.lease)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not granted within 10s of the server's return")
	}
}

// TestWaiterOutageThenCtxEnds: a waiter whose ctx ends while the server is
// down returns ctx's error (matching ErrNotAcquired), not the outage's.
func TestWaiterOutageThenCtxEnds(t *testing.T) {
	srv := testenv.StartRedis(t)
	a := openLocker(t, srv, "")
	b := openLocker(t, srv, "poll=50ms")
	const key = "wake/outage-ctx"
	if _, err := a.Acquire(testCtx(t), key, dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(testCtx(t), 700*time.Millisecond)
	defer cancel()
	got := waitingAcquire(ctx, b, key)
	srv.Kill()
	r := <-got
	if !errors.Is(r.err, dlock.ErrNotAcquired) || !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("waiter whose ctx ended during an outage: %v, want ErrNotAcquired and DeadlineExceeded", r.err)
	}
	srv.Restart()
}

// TestManyLocalWaiters: goroutines of one Locker waiting on one key share one
// subscription and are woken one at a time; every one gets the lock, in far
// less time than a poll each.
func TestManyLocalWaiters(t *testing.T) {
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	const poll, n = 10 * time.Second, 20
	l := openLocker(t, srv, "poll="+poll.String())
	ctx := testCtx(t)
	const key = "wake/local-waiters"
	holder, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var tokens []dlock.Token
	for range n {
		wg.Go(func() {
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			tokens = append(tokens, lease.Token())
			mu.Unlock()
			time.Sleep(time.Millisecond)
			release(t, lease)
		})
	}
	channel := redis.ReleaseChannel(redis.DefaultPrefix, key)
	waitFor(t, 5*time.Second, "waiters subscribed", func() bool { return numSub(t, raw, channel) == 1 })
	time.Sleep(100 * time.Millisecond) // let every goroutine reach its wait
	start := time.Now()
	release(t, holder)
	wg.Wait()
	d := time.Since(start)
	t.Logf("%d waiters of one locker served in %v", n, d)
	if len(tokens) != n {
		t.Fatalf("%d grants, want %d", len(tokens), n)
	}
	if d > poll/2 {
		t.Errorf("%d local waiters took %v; a poll is %v", n, d, poll)
	}
	waitFor(t, 5*time.Second, "unsubscribed", func() bool { return numSub(t, raw, channel) == 0 })
}

// TestGrantRacingCancelIsReleased cancels the caller's ctx while the winning
// acquire script is in flight (a hook cancels it as the reply arrives): the
// driver must give the lock back before returning the ctx error.
func TestGrantRacingCancelIsReleased(t *testing.T) {
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	client := rawClient(t, srv)
	var cancelMu sync.Mutex
	var cancelNext context.CancelFunc
	client.AddHook(cancelHook{func() {
		cancelMu.Lock()
		defer cancelMu.Unlock()
		if cancelNext != nil {
			cancelNext()
			cancelNext = nil
		}
	}})
	l, err := redis.New(context.Background(), client, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := testCtx(t)
	for _, try := range []bool{true, false} {
		key := fmt.Sprintf("cancel/race-%v", try)
		cctx, cancel := context.WithCancel(ctx)
		cancelMu.Lock()
		cancelNext = cancel
		cancelMu.Unlock()
		var err error
		if try {
			_, err = l.TryAcquire(cctx, key)
		} else {
			_, err = l.Acquire(cctx, key)
		}
		cancel()
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("try=%v: grant racing cancel: %v, want ErrNotAcquired and context.Canceled", try, err)
		}
		n, err := raw.Exists(ctx, redis.LockKey(redis.DefaultPrefix, key)).Result()
		if err != nil || n != 0 {
			t.Fatalf("try=%v: lock key after a grant raced the cancel: exists=%d err=%v", try, n, err)
		}
	}
}

// cancelHook calls cancel after each EVALSHA/EVAL of the acquire script has
// been answered.
type cancelHook struct{ cancel func() }

func (cancelHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (cancelHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (h cancelHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			for _, a := range cmd.Args() {
				if s, ok := a.(string); ok && strings.HasSuffix(s, ":fence") {
					h.cancel()
				}
			}
		}
		return err
	}
}

// TestSubscriptionChurn: many calls of one Locker start and stop waiting on a
// few keys at once (cancelled waits, grants, re-subscriptions of a channel
// whose UNSUBSCRIBE is still in flight). Every grant must be exclusive, and
// once all calls are done no subscription may remain.
func TestSubscriptionChurn(t *testing.T) {
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	l := openLocker(t, srv, "poll=50ms")
	other := openLocker(t, srv, "poll=50ms")
	ctx := testCtx(t)
	const keys, goroutines, rounds = 3, 12, 40
	var inside [keys]sync.Mutex
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			locker := l
			if g%4 == 0 {
				locker = other
			}
			for r := range rounds {
				k := (g + r) % keys
				wctx, cancel := context.WithTimeout(ctx, time.Duration(1+(g*r)%7)*time.Millisecond)
				lease, err := locker.Acquire(wctx, fmt.Sprintf("churn/%d", k), dlock.WithTTL(10*time.Second))
				cancel()
				if err != nil {
					if !errors.Is(err, dlock.ErrNotAcquired) {
						t.Errorf("Acquire: %v", err)
					}
					continue
				}
				if !inside[k].TryLock() {
					t.Errorf("two holders of churn/%d", k)
				} else {
					time.Sleep(500 * time.Microsecond)
					inside[k].Unlock()
				}
				release(t, lease)
			}
		})
	}
	wg.Wait()
	for k := range keys {
		channel := redis.ReleaseChannel(redis.DefaultPrefix, fmt.Sprintf("churn/%d", k))
		waitFor(t, 5*time.Second, "no subscription left on "+channel, func() bool { return numSub(t, raw, channel) == 0 })
		n, err := raw.Exists(ctx, redis.LockKey(redis.DefaultPrefix, fmt.Sprintf("churn/%d", k))).Result()
		if err != nil || n != 0 {
			t.Errorf("lock key of churn/%d left behind: exists=%d err=%v", k, n, err)
		}
	}
}

// A waiting Acquire whose first attempt ran on the server but whose reply
// came after the caller's deadline leaves nothing of a waiter behind: not a
// writer's mark (which kept readers out for the waiter's TTL, and was left on
// the server by `dlock bench` in CI), nor a place in the fair queue (to which
// a release would hand the lock). A script that keeps the server busy for
// 400ms holds the attempt, sent meanwhile, in the server's socket buffer
// past the deadline; the server runs it afterwards, within the attempt's
// grace (cancelGrace), and the waiter's cleanup follows its answer.
func TestWaiterWhoseReplyCameTooLateLeavesNothing(t *testing.T) {
	srv := testenv.StartRedis(t)
	raw := rawClient(t, srv)
	probe := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ReadTimeout: 20 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = probe.Close() })
	const busy = `local t0 = redis.call('TIME')
local start = t0[1] * 1000000 + t0[2]
while true do
  local t = redis.call('TIME')
  if t[1] * 1000000 + t[2] - start > 400000 then return 1 end
end`
	for _, mode := range []string{"fair=false", "fair=true"} {
		t.Run(mode, func(t *testing.T) {
			l := openLocker(t, srv, mode)
			ctx := testCtx(t)
			key := "late-reply/" + mode
			held, err := l.Acquire(ctx, key, dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			busyDone := make(chan error, 1)
			go func() { busyDone <- raw.Eval(ctx, busy, nil).Err() }()
			// The server is busy once a PING goes unanswered.
			waitFor(t, 5*time.Second, "the server busy", func() bool { return probe.Ping(ctx).Err() != nil })
			wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			_, err = l.Acquire(wctx, key, dlock.WithTTL(time.Minute))
			cancel()
			if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Acquire past its deadline: %v, want ErrNotAcquired and the deadline", err)
			}
			if err := <-busyDone; err != nil {
				t.Fatal(err)
			}
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			lock := redis.LockKey(redis.DefaultPrefix, key)
			keys, err := raw.Keys(ctx, lock+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			// The counters stay: the fence for good, the fair queue's
			// arrival counter for two waiter TTLs.
			left := slices.DeleteFunc(keys, func(k string) bool { return k == lock+":fence" || k == lock+":qseq" })
			if len(left) != 0 {
				t.Errorf("keys of %q left after the release besides its counters: %q", key, left)
			}
		})
	}
}
