package redis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// openDSN opens a Locker on dsn, closed in t.Cleanup.
func openDSN(t testing.TB, dsn string, opts ...dlock.Option) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), dsn, opts...)
	if err != nil {
		t.Fatalf("dlock.Open(%q): %v", dsn, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// noFailover keeps a loaded machine from triggering a failover in tests that
// do not want one.
var noFailover = testenv.SentinelConfig{DownAfter: 5 * time.Second, FailoverTimeout: 10 * time.Second}

func TestSentinelConformance(t *testing.T) {
	t.Parallel()
	s := testenv.StartSentinelWith(t, noFailover)
	conformance.Run(t, newHarnessDial(t, func() goredis.UniversalClient {
		return goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:            testenv.SentinelMasterName,
			SentinelAddrs:         s.SentinelAddrs(),
			ContextTimeoutEnabled: true,
		})
	}))
}

func TestClusterConformance(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	conformance.Run(t, newHarnessDial(t, func() goredis.UniversalClient {
		return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	}))
}

// TestClusterDSNAndWakeUp opens redis+cluster:// DSNs and checks, for keys
// on each of the three masters, that a waiter is woken by the release's
// PUBLISH (which Redis Cluster broadcasts to every node) well before its 10s
// poll; in fair mode, that the release hands the lock to the waiter on its
// client's own channel, which need not live on the key's master.
func TestClusterDSNAndWakeUp(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	t.Run("default", func(t *testing.T) { testClusterWakeUp(t, cl, "") })
	t.Run("fair", func(t *testing.T) { testClusterWakeUp(t, cl, "&fair=true") })
}

func testClusterWakeUp(t *testing.T, cl *testenv.Cluster, mode string) {
	ctx := testCtx(t)
	a := openDSN(t, cl.URL()+"?poll=10s"+mode)
	b := openDSN(t, cl.URL()+"?poll=10s"+mode)
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	var nodes []*goredis.Client
	for _, n := range cl.Nodes {
		nodes = append(nodes, rawClient(t, n))
	}

	// One key per master.
	byNode := map[string]string{}
	for i := 0; len(byNode) < 3 && i < 100; i++ {
		k := fmt.Sprintf("jobs/%d", i)
		m, err := cc.MasterForKey(ctx, redis.LockKey(redis.DefaultPrefix, k))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := byNode[m.Options().Addr]; !ok {
			byNode[m.Options().Addr] = k
		}
	}
	if len(byNode) != 3 {
		t.Fatalf("keys landed on %d masters, want 3", len(byNode))
	}
	for addr, k := range byNode {
		lease, err := a.TryAcquire(ctx, k)
		if err != nil {
			t.Fatalf("TryAcquire(%q) on the master %s: %v", k, addr, err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := b.Acquire(ctx, k)
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		ch := redis.ReleaseChannel(redis.DefaultPrefix, k)
		waitFor(t, 5*time.Second, "waiter subscribed", func() bool {
			var n int64
			for _, c := range nodes {
				if mode == "" {
					n += numSub(t, c, ch)
				} else {
					n += int64(len(waiterChannels(t, c)))
				}
			}
			return n > 0
		})
		start := time.Now()
		release(t, lease)
		if err := <-got; err != nil {
			t.Fatalf("waiting Acquire(%q): %v", k, err)
		}
		d := time.Since(start)
		t.Logf("key %q on %s: waiter acquired %v after the release (poll 10s)", k, addr, d)
		if d > 2*time.Second {
			t.Errorf("waiter for %q took %v after the release: not woken by the message", k, d)
		}
	}
}

// TestClusterMinReplicas: a cluster of masters without replicas cannot
// satisfy min_replicas=1. The WAIT must reach the key's own master (no MOVED
// error), and the refused lock must be released.
func TestClusterMinReplicas(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	ctx := testCtx(t)
	l := openDSN(t, cl.URL()+"?min_replicas=1&wait_timeout=50ms")
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	for _, k := range []string{"a", "b", "c", "d"} {
		_, err := l.TryAcquire(ctx, k)
		if !errors.Is(err, redis.ErrTooFewReplicas) {
			t.Fatalf("TryAcquire(%q) with min_replicas=1 and no replicas: %v, want ErrTooFewReplicas", k, err)
		}
		if n, err := cc.Exists(ctx, redis.LockKey(redis.DefaultPrefix, k)).Result(); err != nil || n != 0 {
			t.Errorf("lock %q left behind after the refused acquire: exists=%d err=%v", k, n, err)
		}
	}

	// The startup check reads every master.
	d, err := redis.NewDriver(ctx, cc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if cfgs, err := d.CheckServer(ctx); err != nil || len(cfgs) != 3 {
		t.Fatalf("CheckServer on a 3-master cluster: %+v, %v", cfgs, err)
	}
}

// TestFailoverWithoutWaitLosesLock shows the classic master–replica failure:
// the master grants a lock, dies before the replica has it, Sentinel promotes
// the replica, and a second client takes the lock while the first still holds
// it. The replica is paused and its link cut just before the acquire so it
// never receives the SET: the loss is deterministic, not a race.
//
// The fencing Guard still rejects the first holder's writes: the new master's
// token is its clock in µs, which is above the old master's token because both
// run on this machine's clock. Across machines, the new master's clock would
// have to be no further behind the old one's than the failover took.
func TestFailoverWithoutWaitLosesLock(t *testing.T) {
	t.Parallel()
	s := testenv.StartSentinel(t)
	ctx := testCtx(t)
	a := openDSN(t, s.URL()+"?autorenew=false&ttl=20s")
	master := rawClient(t, s.Master)
	const key = "orders/42"

	s.Replica.Pause()
	if err := master.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		s.Replica.Resume()
		t.Fatalf("CLIENT KILL TYPE replica: %v", err)
	}
	lease1, err := a.TryAcquire(ctx, key)
	s.Master.Kill()
	s.Replica.Resume()
	if err != nil {
		t.Fatalf("TryAcquire before the failover: %v", err)
	}
	start := time.Now()
	s.WaitFailover(s.Replica)
	t.Logf("failover took %v", time.Since(start))

	b := openDSN(t, s.URL()+"?autorenew=false&ttl=20s")
	lease2, err := b.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("a second client could not take the lock after the failover (%v): the test expected the lock to be lost", err)
	}
	if lease1.Err() != nil || !time.Now().Before(lease1.Deadline()) {
		t.Fatalf("the first lease should still believe it is held: err=%v deadline in %v", lease1.Err(), time.Until(lease1.Deadline()))
	}
	t.Logf("two holders at once: tokens %d (old master) and %d (promoted replica)", lease1.Token(), lease2.Token())
	if lease2.Token() <= lease1.Token() {
		t.Fatalf("token after failover %d <= token before %d", lease2.Token(), lease1.Token())
	}

	var g fencing.Guard
	if err := g.Do("orders/42", lease2.Token(), func() error { return nil }); err != nil {
		t.Fatalf("the new holder's write was rejected: %v", err)
	}
	if err := g.Do("orders/42", lease1.Token(), func() error { return nil }); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("the stale holder's write: %v, want ErrStaleToken", err)
	}
	// The first holder learns of the loss at its next refresh.
	if err := lease1.Refresh(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Refresh of the lost lease: %v, want ErrLeaseLost", err)
	}
	release(t, lease2)
}

// TestFailoverWithMinReplicas: with min_replicas=1 an acquire that no replica
// acknowledges fails and leaves nothing behind, and a granted lock survives
// the master's death: after the failover a second client cannot take it.
func TestFailoverWithMinReplicas(t *testing.T) {
	t.Parallel()
	s := testenv.StartSentinel(t)
	ctx := testCtx(t)
	a := openDSN(t, s.URL()+"?min_replicas=1&wait_timeout=200ms&autorenew=false&ttl=20s")
	master := rawClient(t, s.Master)
	const key = "orders/43"

	// A replica that does not answer within wait_timeout: refused, released.
	s.Replica.Pause()
	_, err := a.TryAcquire(ctx, key)
	s.Replica.Resume()
	if !errors.Is(err, redis.ErrTooFewReplicas) {
		t.Fatalf("TryAcquire with the replica paused: %v, want ErrTooFewReplicas", err)
	}
	t.Logf("with the replica paused: %v", err)
	if n, err := master.Exists(ctx, redis.LockKey(redis.DefaultPrefix, key)).Result(); err != nil || n != 0 {
		t.Fatalf("refused lock left on the master: exists=%d err=%v", n, err)
	}

	lease1, err := a.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire with the replica up: %v", err)
	}
	if err := lease1.Refresh(ctx); err != nil {
		t.Fatalf("Refresh with the replica up: %v", err)
	}
	s.Master.Kill()
	start := time.Now()
	s.WaitFailover(s.Replica)
	t.Logf("failover took %v", time.Since(start))

	b := openDSN(t, s.URL()+"?autorenew=false")
	if l, err := b.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		if l != nil {
			_ = l.Release(ctx)
		}
		t.Fatalf("a second client after the failover: %v, want ErrNotAcquired (the lock must survive)", err)
	}
	nm := rawClient(t, s.Replica)
	if v, err := nm.Get(ctx, redis.LockKey(redis.DefaultPrefix, key)).Result(); err != nil || v == "" {
		t.Fatalf("lock on the promoted replica: %q, %v", v, err)
	}
	// The promoted master has no replica left: a refresh that asks for one
	// fails, and the lease is reported lost (the safe side).
	if err := lease1.Refresh(ctx); !errors.Is(err, redis.ErrTooFewReplicas) {
		t.Errorf("Refresh with no replica left: %v, want ErrTooFewReplicas", err)
	}
}

func TestSentinelDSN(t *testing.T) {
	t.Parallel()
	s := testenv.StartSentinelWith(t, noFailover)
	ctx := testCtx(t)
	l := openDSN(t, s.URL()+"?prefix=app:&poll=250ms&dial_timeout=2s")
	lease, err := l.TryAcquire(ctx, "dsn")
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, lease)
	if n, err := rawClient(t, s.Master).Exists(ctx, "app:{dsn}").Result(); err != nil || n != 1 {
		t.Errorf("lock key app:{dsn} on the master: exists=%d err=%v", n, err)
	}

	// OpenUniversal with MasterName builds a Sentinel failover client.
	u, err := redis.OpenUniversal(ctx, &goredis.UniversalOptions{
		Addrs: s.SentinelAddrs(), MasterName: testenv.SentinelMasterName,
	}, &redis.Options{Prefix: "app:", Checks: redis.CheckOff})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.TryAcquire(ctx, "dsn"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("OpenUniversal locker took a held lock: %v", err)
	}
}

func TestTopologyDSNErrors(t *testing.T) {
	const secret = "s3cret"
	cases := []struct{ name, dsn, want string }{
		{"sentinel without master", "redis+sentinel://u:" + secret + "@127.0.0.1:1", "master name"},
		{"sentinel unknown parameter", "redis+sentinel://u:" + secret + "@127.0.0.1:1/mymaster?bogus=1", "bogus"},
		{"cluster with a database", "redis+cluster://u:" + secret + "@127.0.0.1:1/3", "databases"},
		{"cluster empty host", "redis+cluster://u:" + secret + "@127.0.0.1:1,,127.0.0.1:2", "empty host"},
		{"negative min_replicas", "redis://u:" + secret + "@127.0.0.1:1/0?min_replicas=-1", "min_replicas"},
		{"bad wait_timeout", "redis://u:" + secret + "@127.0.0.1:1/0?min_replicas=1&wait_timeout=0s", "wait_timeout"},
		{"bad checks", "redis://u:" + secret + "@127.0.0.1:1/0?checks=maybe", "checks"},
		{"sentinel unreachable", "redis+sentinel://u:" + secret + "@127.0.0.1:1/mymaster?dial_timeout=200ms", "sentinel"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			l, err := dlock.Open(ctx, tc.dsn)
			if err == nil {
				_ = l.Close()
				t.Fatalf("Open(%q) succeeded", tc.dsn)
			}
			msg := err.Error()
			t.Logf("%s", msg)
			if strings.Contains(msg, secret) {
				t.Errorf("error contains the password: %s", msg)
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not mention %q", msg, tc.want)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestStartupChecks(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	evicting := testenv.StartRedis(t, testenv.WithRedisArgs("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"))

	// checks=error refuses a server that can evict the fencing counter.
	_, err := dlock.Open(ctx, evicting.URL()+"?checks=error")
	if !errors.Is(err, redis.ErrUnsafeConfig) || !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("Open with checks=error on allkeys-lru: %v, want ErrUnsafeConfig", err)
	}
	if !strings.Contains(err.Error(), "fencing counters") {
		t.Errorf("error does not say what can be evicted: %v", err)
	}

	// The default, warn, logs and opens.
	var logs syncBuffer
	l, err := redis.OpenUniversal(ctx, &goredis.UniversalOptions{Addrs: []string{evicting.Addr()}},
		&redis.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatalf("OpenUniversal with checks=warn: %v", err)
	}
	_ = l.Close()
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "allkeys-lru") {
		t.Errorf("no eviction warning logged: %s", logs.String())
	}
	if !strings.Contains(logs.String(), "restart it no sooner than the longest lock TTL") {
		t.Errorf("no note about persistence and restarts: %s", logs.String())
	}

	// volatile-* policies can evict the lock itself (it has a TTL).
	volatile := testenv.StartRedis(t, testenv.WithRedisArgs("--maxmemory", "100mb", "--maxmemory-policy", "volatile-ttl"))
	if _, err := dlock.Open(ctx, volatile.URL()+"?checks=error"); !errors.Is(err, redis.ErrUnsafeConfig) {
		t.Errorf("Open with checks=error on volatile-ttl: %v, want ErrUnsafeConfig", err)
	}
	// checks=off opens anything.
	_ = openDSN(t, evicting.URL()+"?checks=off")

	// A durable, non-evicting server passes checks=error, and the facts are exposed.
	durable := testenv.StartRedis(t, testenv.WithPersistence(), testenv.WithRedisArgs("--maxmemory", "100mb"))
	c := goredis.NewClient(&goredis.Options{Addr: durable.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	d, err := redis.NewDriver(ctx, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cfgs, err := d.CheckServer(ctx)
	if err != nil || len(cfgs) != 1 {
		t.Fatalf("CheckServer: %v, %v", cfgs, err)
	}
	if cf := cfgs[0]; !cf.Known || !cf.Durable() || cf.MaxMemoryPolicy != "noeviction" || cf.MaxMemory != 100<<20 || len(cf.Risks()) != 0 {
		t.Errorf("CheckServer on a durable noeviction server: %+v risks %v", cf, cf.Risks())
	}
	_ = openDSN(t, durable.URL()+"?checks=error")

	// CONFIG renamed away (as on many managed services): nothing known,
	// nothing refused.
	hidden := testenv.StartRedis(t, testenv.WithRedisArgs("--rename-command", "CONFIG", ""))
	_ = openDSN(t, hidden.URL()+"?checks=error")
	hc := goredis.NewClient(&goredis.Options{Addr: hidden.Addr()})
	t.Cleanup(func() { _ = hc.Close() })
	hd, err := redis.NewDriver(ctx, hc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hd.Close()
	if cfgs, err := hd.CheckServer(ctx); err != nil || len(cfgs) != 1 || cfgs[0].Known {
		t.Errorf("CheckServer with CONFIG renamed: %+v, %v; want one unknown config", cfgs, err)
	}
}
