package redis_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/redis"
)

// TestNewDriverChecksTheServer: NewDriver checks the server, bounded by its
// ctx, as Open does: with Checks CheckError it refuses a server that can
// evict locks (ErrUnsafeConfig), and it fails, once ctx ends at the latest,
// on an address nobody answers at.
func TestNewDriverChecksTheServer(t *testing.T) {
	evicting := testenv.StartRedis(t, testenv.WithRedisArgs("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"))
	if d, err := redis.NewDriver(context.Background(), rawClient(t, evicting), &redis.Options{Checks: redis.CheckError}); !errors.Is(err, redis.ErrUnsafeConfig) {
		t.Errorf("NewDriver with CheckError on an evicting server: %v, want ErrUnsafeConfig", err)
		if err == nil {
			_ = d.Close()
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	dead := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = dead.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	d, err := redis.NewDriver(ctx, dead, nil)
	if err == nil {
		_ = d.Close()
		t.Fatal("NewDriver on an address nobody answers at succeeded")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("NewDriver took %v, past its ctx's 2s", took)
	}
	t.Logf("NewDriver on a dead address: %v", err)
}
