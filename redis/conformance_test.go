package redis_test

import (
	"context"
	"sync"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// harness runs the conformance suite on one redis-server. Each locker has its
// own client and connections, as a separate process would.
type harness struct {
	srv *testenv.Redis
	raw *goredis.Client // for Expire, behind the lockers' backs

	mu      sync.Mutex
	clients map[dlock.Locker]*goredis.Client
}

func newHarness(t testing.TB) *harness {
	srv := testenv.StartRedis(t)
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = raw.Close() })
	return &harness{srv: srv, raw: raw, clients: map[dlock.Locker]*goredis.Client{}}
}

func (h *harness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	client := goredis.NewClient(&goredis.Options{Addr: h.srv.Addr(), ContextTimeoutEnabled: true})
	l, err := redis.New(client, nil)
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	h.mu.Lock()
	h.clients[l] = client
	h.mu.Unlock()
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close() // a second Close after Crash is harmless
	})
	return l
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

func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	n, err := h.raw.Del(context.Background(), redis.LockKey(redis.DefaultPrefix, key)).Result()
	if err != nil {
		t.Fatalf("Expire(%q): DEL: %v", key, err)
	}
	if n != 1 {
		t.Fatalf("Expire(%q): the lock key %q did not exist", key, redis.LockKey(redis.DefaultPrefix, key))
	}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, newHarness(t))
}

func BenchmarkConformance(b *testing.B) {
	conformance.RunBenchmarks(b, newHarness(b))
}
