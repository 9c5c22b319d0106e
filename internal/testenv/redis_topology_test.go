package testenv_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testenv"
)

func TestStartSentinel(t *testing.T) {
	s := testenv.StartSentinel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := s.CurrentMaster(ctx)
	if err != nil || got != s.Master.Addr() {
		t.Fatalf("CurrentMaster = %q, %v; want %q", got, err, s.Master.Addr())
	}
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: testenv.SentinelMasterName, SentinelAddrs: s.SentinelAddrs()})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the sentinels: %v", err)
	}
	s.Master.Kill()
	start := time.Now()
	s.WaitFailover(s.Replica)
	t.Logf("failover took %v", time.Since(start))
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET after failover = %q, %v", v, err)
	}
}

func TestStartCluster(t *testing.T) {
	cl := testenv.StartCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs()})
	defer c.Close()
	nodes := map[string]bool{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if err := c.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		m, err := c.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		nodes[m.Options().Addr] = true
	}
	if len(nodes) != 3 {
		t.Errorf("8 keys landed on %d nodes, want 3: %v", len(nodes), nodes)
	}
}
