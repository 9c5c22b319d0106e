package redlock_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redlock"
)

// cluster is N independent redis-server processes and an admin client to
// each, for looking and meddling behind the lockers' backs.
type cluster struct {
	nodes []*testenv.Redis
	admin []*goredis.Client
}

func startCluster(t testing.TB, n int, opts ...testenv.RedisOption) *cluster {
	t.Helper()
	c := &cluster{}
	for range n {
		srv := testenv.StartRedis(t, opts...)
		admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), DialerRetries: 1, MaxRetries: -1})
		t.Cleanup(func() { _ = admin.Close() })
		c.nodes = append(c.nodes, srv)
		c.admin = append(c.admin, admin)
	}
	return c
}

// addrs returns the nodes' addresses.
func (c *cluster) addrs() []string {
	a := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		a[i] = n.Addr()
	}
	return a
}

// dsn returns "redlock://h1,h2,...?params".
func (c *cluster) dsn(params string) string {
	dsn := "redlock://" + strings.Join(c.addrs(), ",")
	if params != "" {
		dsn += "?" + params
	}
	return dsn
}

// clients returns one new client per node, as NewDriver wants them.
func (c *cluster) clients(t testing.TB) []*goredis.Client {
	t.Helper()
	cs := make([]*goredis.Client, len(c.nodes))
	for i, n := range c.nodes {
		cs[i] = goredis.NewClient(&goredis.Options{Addr: n.Addr(), ContextTimeoutEnabled: true, DialerRetries: 1, MaxRetries: -1})
		t.Cleanup(func() { _ = cs[i].Close() })
	}
	return cs
}

// open opens a Locker on the cluster from a DSN.
func (c *cluster) open(t testing.TB, params string, opts ...dlock.Option) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), c.dsn(params), opts...)
	if err != nil {
		t.Fatalf("dlock.Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// holders returns, per node, the owner id in key's lock ("" if none, or if
// the node is down).
func (c *cluster) holders(t testing.TB, key string) []string {
	t.Helper()
	out := make([]string, len(c.admin))
	for i, a := range c.admin {
		if !c.nodes[i].Alive() {
			continue
		}
		v, err := a.Get(context.Background(), redlock.LockKey(redlock.DefaultPrefix, key)).Result()
		if err != nil && err != goredis.Nil {
			t.Fatalf("GET on node %d: %v", i, err)
		}
		out[i] = v
	}
	return out
}

// countHeld returns on how many nodes key is locked.
func (c *cluster) countHeld(t testing.TB, key string) int {
	n := 0
	for _, h := range c.holders(t, key) {
		if h != "" {
			n++
		}
	}
	return n
}

// serverMicros is node i's clock in microseconds.
func (c *cluster) serverMicros(t testing.TB, i int) uint64 {
	t.Helper()
	now, err := c.admin[i].Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return uint64(now.UnixMicro())
}

// testCtx is bounded, so a broken driver fails a test instead of hanging it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func release(t testing.TB, lease *dlock.Lease) {
	t.Helper()
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release(%q): %v", lease.Key(), err)
	}
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

// harness runs the conformance suite on a cluster. Each locker has its own
// clients and connections, as a separate process would.
type harness struct {
	c *cluster

	mu      sync.Mutex
	clients map[dlock.Locker][]*goredis.Client
}

func newHarness(t testing.TB, n int) *harness {
	return &harness{c: startCluster(t, n), clients: map[dlock.Locker][]*goredis.Client{}}
}

func (h *harness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	clients := h.c.clients(t)
	// The default 100ms per-node timeout suits servers on their own hosts; here
	// five servers share two cores with the race detector and other test
	// packages, so a node can miss it for no fault of its own.
	l, err := redlock.New(context.Background(), clients, &redlock.Options{NodeTimeout: 400 * time.Millisecond})
	if err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	h.mu.Lock()
	h.clients[l] = clients
	h.mu.Unlock()
	t.Cleanup(func() { _ = l.Close() }) // before the clients close (cleanups run last first)
	return l
}

// Crash cuts the locker off from every node without releasing anything, as a
// killed process would: its locks must go by their TTL on the nodes' clocks.
func (h *harness) Crash(t testing.TB, l dlock.Locker) {
	h.mu.Lock()
	clients := h.clients[l]
	h.mu.Unlock()
	if clients == nil {
		t.Fatal("Crash: locker not made by this harness")
	}
	for _, c := range clients {
		if err := c.Close(); err != nil {
			t.Fatalf("Crash: %v", err)
		}
	}
}

// Expire deletes the lock key on every node.
func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	total := int64(0)
	for i, a := range h.c.admin {
		n, err := a.Del(context.Background(), redlock.LockKey(redlock.DefaultPrefix, key)).Result()
		if err != nil {
			t.Fatalf("Expire(%q): DEL on node %d: %v", key, i, err)
		}
		total += n
	}
	if q := int64(len(h.c.admin)/2 + 1); total < q {
		t.Fatalf("Expire(%q): the lock key existed on %d nodes, fewer than a quorum", key, total)
	}
}

// Waiters reports 1 when a quorum of nodes has a subscriber to key's release
// channel (the waiter subscribes on every node), else 0.
func (h *harness) Waiters(t testing.TB, key string) int {
	t.Helper()
	ch := redlock.ReleaseChannel(redlock.DefaultPrefix, key)
	n := 0
	for i := range h.c.nodes {
		if numSub(t, h.c, i, ch) > 0 {
			n++
		}
	}
	if n >= len(h.c.nodes)/2+1 {
		return 1
	}
	return 0
}

// NewSlowPollLocker is NewLocker with a 30s polling fallback: only the
// release messages can wake its waiters within conformance.PushWaitBound.
func (h *harness) NewSlowPollLocker(t testing.TB) dlock.Locker {
	t.Helper()
	clients := h.c.clients(t)
	l, err := redlock.New(context.Background(), clients, &redlock.Options{NodeTimeout: 400 * time.Millisecond, PollInterval: 30 * time.Second})
	if err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// Residue lists the nodes where key's lock key is still there, with its
// owner and its remaining TTL (which dates the last write: a key is set and
// extended to the full TTL). The fence counters stay by design: they keep
// the tokens increasing.
func (h *harness) Residue(t testing.TB, key string) []string {
	t.Helper()
	lk := redlock.LockKey(redlock.DefaultPrefix, key)
	var left []string
	for i, owner := range h.c.holders(t, key) {
		if owner != "" {
			pttl, err := h.c.admin[i].PTTL(context.Background(), lk).Result()
			ttl := pttl.String()
			if err != nil {
				ttl = err.Error()
			}
			left = append(left, fmt.Sprintf("node %d %s %s (owner %s, PTTL %s)", i, h.c.nodes[i].Addr(), lk, owner, ttl))
		}
	}
	return left
}

// DSN reaches the harness's nodes with NewLocker's per-node timeout.
func (h *harness) DSN(testing.TB) string {
	return "redlock://" + strings.Join(h.c.addrs(), ",") + "?node_timeout=400ms"
}

var (
	_ conformance.Inspector = (*harness)(nil)
	_ conformance.DSNer     = (*harness)(nil)
)
