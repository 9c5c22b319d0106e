package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// topologyTimeout bounds the wait for a Sentinel or Cluster deployment to
// settle (sentinels discovering each other, cluster_state:ok, a failover).
const topologyTimeout = 20 * time.Second

// SentinelMasterName is the name under which StartSentinel's sentinels
// monitor the master.
const SentinelMasterName = "mymaster"

// Sentinel is a replicated Redis deployment the test owns, started by
// StartSentinel: one master, one replica of it, and three sentinels
// monitoring them with a quorum of two.
type Sentinel struct {
	t testing.TB
	// Master and Replica are the data nodes as started. After a failover
	// their roles are swapped; CurrentMaster asks the sentinels.
	Master, Replica *Redis
	// Sentinels are the three redis-server --sentinel processes.
	Sentinels []*Redis
}

// SentinelConfig tunes the sentinels StartSentinelWith starts.
type SentinelConfig struct {
	// DownAfter is down-after-milliseconds: how long the master must not
	// answer before a sentinel thinks it down. Default: 500ms, for quick
	// failover tests; tests that want no failover should use a few seconds,
	// so that a loaded machine cannot trigger one.
	DownAfter time.Duration
	// FailoverTimeout is failover-timeout. Default: 2s.
	FailoverTimeout time.Duration
}

// StartSentinel is StartSentinelWith with the default SentinelConfig.
func StartSentinel(t testing.TB, opts ...RedisOption) *Sentinel {
	t.Helper()
	return StartSentinelWith(t, SentinelConfig{}, opts...)
}

// StartSentinelWith starts a master, a replica (--replicaof the master) and
// three sentinels (redis-server --sentinel, from the Debian package
// redis-server), each on a free 127.0.0.1 port in its own temp dir. With the
// default cfg the sentinels use down-after-milliseconds 500 and
// failover-timeout 2000, so a killed master is replaced in about 2s. It
// returns once the replica's link is up and every sentinel knows the replica
// and the two other sentinels (5–8s: sentinels announce themselves every
// 2s). opts apply to both data nodes. Everything is stopped in t.Cleanup.
func StartSentinelWith(t testing.TB, cfg SentinelConfig, opts ...RedisOption) *Sentinel {
	t.Helper()
	if cfg.DownAfter <= 0 {
		cfg.DownAfter = 500 * time.Millisecond
	}
	if cfg.FailoverTimeout <= 0 {
		cfg.FailoverTimeout = 2 * time.Second
	}
	master := StartRedis(t, opts...)
	replica := StartRedis(t, append(append([]RedisOption(nil), opts...),
		WithRedisArgs("--replicaof", "127.0.0.1", strconv.Itoa(master.Port())))...)
	s := &Sentinel{t: t, Master: master, Replica: replica}
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	rc := goredis.NewClient(&goredis.Options{Addr: replica.Addr()})
	defer rc.Close()
	poll(ctx, t, "replica link up", func() error {
		info, err := rc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("replica not in sync: %s", info)
		}
		return nil
	})
	for i := 0; i < 3; i++ {
		s.Sentinels = append(s.Sentinels, startSentinel(t, master.Port(), cfg))
	}
	for _, sn := range s.Sentinels {
		c := goredis.NewSentinelClient(&goredis.Options{Addr: sn.Addr()})
		poll(ctx, t, "sentinel "+sn.Addr()+" discovers its peers", func() error {
			m, err := c.Master(ctx, SentinelMasterName).Result()
			if err != nil {
				return err
			}
			if m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
				return fmt.Errorf("num-slaves=%s num-other-sentinels=%s", m["num-slaves"], m["num-other-sentinels"])
			}
			return nil
		})
		_ = c.Close()
	}
	return s
}

func startSentinel(t testing.TB, masterPort int, cfg SentinelConfig) *Redis {
	t.Helper()
	bin := Binary(t, "redis-server", "redis-server")
	dir := t.TempDir()
	return startRetrying(t, "starting redis-server --sentinel", func() (*Redis, error) {
		port := FreePort(t)
		conf := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %[3]s %[5]d
sentinel failover-timeout %[3]s %[6]d
sentinel parallel-syncs %[3]s 1
`, port, dir, SentinelMasterName, masterPort, cfg.DownAfter.Milliseconds(), cfg.FailoverTimeout.Milliseconds())
		path := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			t.Fatalf("testenv: writing %s: %v", path, err)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p := NewProcess(t, ProcessConfig{
			Name:  "redis-sentinel",
			Path:  bin,
			Args:  []string{path, "--sentinel"},
			Dir:   dir,
			Ports: []int{port},
			Ready: func(ctx context.Context, pid int) error { return redisReady(ctx, addr, pid) },
		})
		if err := p.Start(); err != nil {
			return nil, err
		}
		return &Redis{Process: p, port: port}, nil
	})
}

// SentinelAddrs returns the sentinels' addresses, "127.0.0.1:PORT".
func (s *Sentinel) SentinelAddrs() []string {
	var addrs []string
	for _, sn := range s.Sentinels {
		addrs = append(addrs, sn.Addr())
	}
	return addrs
}

// URL returns the deployment's dlock DSN,
// "redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/mymaster".
func (s *Sentinel) URL() string {
	return "redis+sentinel://" + strings.Join(s.SentinelAddrs(), ",") + "/" + SentinelMasterName
}

// CurrentMaster returns the master's address as the first sentinel that
// answers reports it.
func (s *Sentinel) CurrentMaster(ctx context.Context) (string, error) {
	var lastErr error
	for _, sn := range s.Sentinels {
		c := goredis.NewSentinelClient(&goredis.Options{Addr: sn.Addr()})
		a, err := c.GetMasterAddrByName(ctx, SentinelMasterName).Result()
		_ = c.Close()
		if err == nil && len(a) == 2 {
			return net.JoinHostPort(a[0], a[1]), nil
		}
		lastErr = err
	}
	return "", fmt.Errorf("no sentinel reports a master: %w", lastErr)
}

// WaitFailover waits until every sentinel reports newMaster as the master and
// newMaster itself answers INFO replication with role:master. It fails the
// test after 20s.
func (s *Sentinel) WaitFailover(newMaster *Redis) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	c := goredis.NewClient(&goredis.Options{Addr: newMaster.Addr()})
	defer c.Close()
	poll(ctx, s.t, "failover to "+newMaster.Addr(), func() error {
		for _, sn := range s.Sentinels {
			sc := goredis.NewSentinelClient(&goredis.Options{Addr: sn.Addr()})
			a, err := sc.GetMasterAddrByName(ctx, SentinelMasterName).Result()
			_ = sc.Close()
			if err != nil {
				return err
			}
			if len(a) != 2 || net.JoinHostPort(a[0], a[1]) != newMaster.Addr() {
				return fmt.Errorf("sentinel %s reports master %v", sn.Addr(), a)
			}
		}
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "role:master") {
			return fmt.Errorf("%s is not master yet", newMaster.Addr())
		}
		return nil
	})
}

// Cluster is a Redis Cluster the test owns, started by StartCluster: three
// masters, no replicas, each owning a third of the 16384 slots.
type Cluster struct {
	// Nodes are the masters; Nodes[i] owns slots [i*16384/3, (i+1)*16384/3).
	Nodes []*Redis
}

// StartCluster starts three redis-server processes with --cluster-enabled
// yes (each on a free 127.0.0.1 port, with its cluster bus on another free
// port via --cluster-port, in its own temp dir), assigns each a third of the
// slots with CLUSTER ADDSLOTSRANGE, joins them with CLUSTER MEET, and returns
// once every node reports cluster_state:ok, knows the other two, and has its
// bus links to them connected (about 1–2s). opts apply to every node.
// Everything is stopped in t.Cleanup.
func StartCluster(t testing.TB, opts ...RedisOption) *Cluster {
	t.Helper()
	cl := &Cluster{}
	var busPorts []int
	for i := 0; i < 3; i++ {
		bus := FreePort(t)
		busPorts = append(busPorts, bus)
		o := append(append([]RedisOption(nil), opts...), WithRedisArgs(
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", "2000",
		))
		cl.Nodes = append(cl.Nodes, StartRedis(t, o...))
	}
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	var clients []*goredis.Client
	for _, n := range cl.Nodes {
		c := goredis.NewClient(&goredis.Options{Addr: n.Addr()})
		defer c.Close()
		clients = append(clients, c)
	}
	const slots = 16384
	for i, c := range clients {
		lo, hi := i*slots/3, (i+1)*slots/3-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("testenv: CLUSTER ADDSLOTSRANGE %d %d on %s: %v", lo, hi, cl.Nodes[i].Addr(), err)
		}
	}
	for i, n := range cl.Nodes[1:] {
		if err := clients[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", n.Port(), busPorts[i+1]).Err(); err != nil {
			t.Fatalf("testenv: CLUSTER MEET %s: %v", n.Addr(), err)
		}
	}
	for i, c := range clients {
		// cluster_state:ok and three known nodes hold while a node learned
		// of by gossip is still in handshake, and a PUBLISH skips a node
		// whose bus link is not up (a released lock's waiter there was not
		// woken in CI): every node must list all three, links connected.
		poll(ctx, t, "cluster_state:ok and every bus link connected on "+cl.Nodes[i].Addr(), func() error {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s", info)
			}
			nodes, err := c.ClusterNodes(ctx).Result()
			if err != nil {
				return err
			}
			lines := strings.Split(strings.TrimSpace(nodes), "\n")
			if len(lines) != 3 {
				return fmt.Errorf("%d nodes known:\n%s", len(lines), nodes)
			}
			for _, line := range lines {
				f := strings.Fields(line)
				if len(f) < 8 || f[7] != "connected" || strings.Contains(f[2], "handshake") || strings.Contains(f[2], "noaddr") {
					return fmt.Errorf("link not connected: %s", line)
				}
			}
			return nil
		})
	}
	return cl
}

// Addrs returns the nodes' addresses, "127.0.0.1:PORT".
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, n := range c.Nodes {
		addrs = append(addrs, n.Addr())
	}
	return addrs
}

// URL returns the cluster's dlock DSN,
// "redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3".
func (c *Cluster) URL() string { return "redis+cluster://" + strings.Join(c.Addrs(), ",") }

// poll calls f every 20ms until it returns nil, and fails the test with f's
// last error when ctx ends first.
func poll(ctx context.Context, t testing.TB, what string, f func() error) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: waiting for %s: %v (last: %v)", what, ctx.Err(), err)
		case <-tick.C:
		}
	}
}
