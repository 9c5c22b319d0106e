package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testenv"
)

// fleetBackends are BenchmarkFleet's backends, in report order; each start
// starts the servers for one run (stopped by tb's cleanup). etcd and
// ZooKeeper run as 3-member clusters; PostgreSQL and MariaDB commit durably
// (fsync on), as in production; pgtable:// and mysqltable:// (package
// sqltable) get servers of their own.
var fleetBackends = []struct {
	name  string
	start func(testing.TB) fleetTarget
}{
	{"redis", func(tb testing.TB) fleetTarget {
		r := testenv.StartRedis(tb)
		return fleetTarget{name: "redis", dsn: r.URL(), pids: func() []int { return []int{r.PID()} },
			reqs: redisCalls(tb, r.Addr()), bytes: redisBytes(tb, r.Addr()), serialNodes: 1}
	}},
	{"redlock3", func(tb testing.TB) fleetTarget {
		var addrs []string
		var pids []int
		var reqs, bs []func() (float64, error)
		for range 3 {
			r := testenv.StartRedis(tb)
			addrs = append(addrs, r.Addr())
			pids = append(pids, r.PID())
			reqs = append(reqs, redisCalls(tb, r.Addr()))
			bs = append(bs, redisBytes(tb, r.Addr()))
		}
		return fleetTarget{name: "redlock3", dsn: "redlock://" + strings.Join(addrs, ","), pids: func() []int { return pids },
			reqs: sumReqs(reqs...), bytes: sumReqs(bs...), serialNodes: 3}
	}},
	{"etcd3", func(tb testing.TB) fleetTarget {
		c := testenv.StartEtcdCluster(tb, 3)
		var reqs, bs []func() (float64, error)
		for _, m := range c.Members {
			reqs = append(reqs, etcdRequests(m.Endpoint()))
			bs = append(bs, promSum(m.Endpoint(), "etcd_network_client_grpc_received_bytes_total", "etcd_network_client_grpc_sent_bytes_total"))
		}
		return fleetTarget{name: "etcd3", dsn: c.URL() + "/dlock", pids: func() []int {
			var p []int
			for _, m := range c.Members {
				p = append(p, m.PID())
			}
			return p
		}, reqs: sumReqs(reqs...), bytes: sumReqs(bs...)}
	}},
	{"zookeeper3", func(tb testing.TB) fleetTarget {
		e := testenv.StartZooKeeperEnsemble(tb, 3)
		var reqs, bs []func() (float64, error)
		for _, m := range e.Members {
			reqs = append(reqs, zkPackets(m.Addr()))
			bs = append(bs, zkMntrSum(m.Addr(), "zk_bytes_received_count"))
		}
		return fleetTarget{name: "zookeeper3", dsn: e.URL("/dlock") + "?session=10s", pids: func() []int {
			var p []int
			for _, m := range e.Members {
				p = append(p, m.PID())
			}
			return p
		}, reqs: sumReqs(reqs...), bytes: sumReqs(bs...)}
	}},
	{"postgres", func(tb testing.TB) fleetTarget {
		p := testenv.StartPostgres(tb,
			testenv.WithPostgresSetting("shared_preload_libraries", "pg_stat_statements"),
			testenv.WithPostgresSetting("fsync", "on"),
			testenv.WithPostgresSetting("synchronous_commit", "on"))
		// Each held or waiting lease pins a connection: stay under the
		// server's max_connections (300).
		return fleetTarget{name: "postgres", dsn: p.URL(), pids: func() []int { return []int{p.PID()} },
			reqs: pgStatements(tb, p.URL()), maxSessions: 250}
	}},
	{"mysql", func(tb testing.TB) fleetTarget {
		m := testenv.StartMariaDB(tb)
		// Each held lease and each waiting Acquire pins a session: stay under
		// MariaDB's max_connections (151).
		return fleetTarget{name: "mysql", dsn: m.URL("mysql"), pids: func() []int { return []int{m.PID()} },
			reqs: mysqlQuestions(tb, m.DSN()), bytes: mysqlStatusSum(tb, m.DSN(), "Bytes_received", "Bytes_sent"),
			maxSessions: 128, maxLeases: 128}
	}},
	{"pgtable", func(tb testing.TB) fleetTarget {
		p := testenv.StartPostgres(tb,
			testenv.WithPostgresSetting("shared_preload_libraries", "pg_stat_statements"),
			testenv.WithPostgresSetting("fsync", "on"),
			testenv.WithPostgresSetting("synchronous_commit", "on"))
		return fleetTarget{name: "pgtable", dsn: pgtableDSN(p.URL()), pids: func() []int { return []int{p.PID()} },
			reqs: pgStatements(tb, p.URL()), maxSessions: 250}
	}},
	{"mysqltable", func(tb testing.TB) fleetTarget {
		m := testenv.StartMariaDB(tb)
		return fleetTarget{name: "mysqltable", dsn: m.URL("mysqltable"), pids: func() []int { return []int{m.PID()} },
			reqs: mysqlQuestions(tb, m.DSN()), bytes: mysqlStatusSum(tb, m.DSN(), "Bytes_received", "Bytes_sent"),
			maxSessions: 128}
	}},
	{"nats", func(tb testing.TB) fleetTarget {
		n := testenv.StartNATS(tb)
		return fleetTarget{name: "nats", dsn: n.URL() + "/dlock", pids: func() []int { return []int{n.PID()} },
			reqs: natsInMsgs(n.MonitorEndpoint()), bytes: natsBytes(n.MonitorEndpoint())}
	}},
}

// redisBytes returns a reader of the bytes the server has received and sent
// (INFO stats total_net_input_bytes + total_net_output_bytes).
func redisBytes(tb testing.TB, addr string) func() (float64, error) {
	c := newRedisClient(tb, addr)
	return func() (float64, error) {
		s, err := c.Info(context.Background(), "stats").Result()
		if err != nil {
			return 0, fmt.Errorf("INFO stats on %s: %w", addr, err)
		}
		var sum float64
		found := 0
		for line := range strings.Lines(s) {
			line = strings.TrimSpace(line)
			for _, k := range []string{"total_net_input_bytes:", "total_net_output_bytes:"} {
				if v, ok := strings.CutPrefix(line, k); ok {
					n, err := strconv.ParseFloat(v, 64)
					if err != nil {
						return 0, fmt.Errorf("INFO stats on %s: bad line %q", addr, line)
					}
					sum += n
					found++
				}
			}
		}
		if found != 2 {
			return 0, fmt.Errorf("INFO stats on %s: no byte counters", addr)
		}
		return sum, nil
	}
}

// promSum returns a reader of the sum of the named metrics (all their label
// sets) from endpoint's /metrics.
func promSum(endpoint string, names ...string) func() (float64, error) {
	return func() (float64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		resp, err := natsHTTP.Do(req)
		if err != nil {
			return 0, fmt.Errorf("/metrics: %w", err)
		}
		defer resp.Body.Close()
		var sum float64
		found := false
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			for _, n := range names {
				if rest, ok := strings.CutPrefix(line, n); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
					v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
					if err != nil {
						return 0, fmt.Errorf("/metrics: bad line %q", line)
					}
					sum += v
					found = true
				}
			}
		}
		if err := sc.Err(); err != nil {
			return 0, fmt.Errorf("/metrics: %w", err)
		}
		if !found {
			return 0, fmt.Errorf("/metrics: none of %v", names)
		}
		return sum, nil
	}
}

// zkMntrSum returns a reader of the sum of the named counters of ZooKeeper's
// mntr command.
func zkMntrSum(addr string, names ...string) func() (float64, error) {
	return func() (float64, error) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return 0, fmt.Errorf("zookeeper mntr: %w", err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("mntr")); err != nil {
			return 0, fmt.Errorf("zookeeper mntr: %w", err)
		}
		var sum float64
		found := 0
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), "\t")
			if !ok {
				continue
			}
			for _, n := range names {
				if k == n {
					f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
					if err != nil {
						return 0, fmt.Errorf("zookeeper mntr: bad line %q", sc.Text())
					}
					sum += f
					found++
				}
			}
		}
		if found != len(names) {
			return 0, fmt.Errorf("zookeeper mntr: not all of %v (%v)", names, sc.Err())
		}
		return sum, nil
	}
}

// mysqlStatusSum returns a reader of the sum of the named global status
// variables.
func mysqlStatusSum(tb testing.TB, dsn string, names ...string) func() (float64, error) {
	db := newMySQLDB(tb, dsn)
	return func() (float64, error) {
		var sum float64
		for _, n := range names {
			var name string
			var v float64
			if err := db.QueryRowContext(context.Background(), "SHOW GLOBAL STATUS LIKE '"+n+"'").Scan(&name, &v); err != nil {
				return 0, fmt.Errorf("mysql: reading %s: %w", n, err)
			}
			sum += v
		}
		return sum, nil
	}
}

// natsBytes returns a reader of the bytes the server has received and sent
// (in_bytes + out_bytes from /varz).
func natsBytes(monitor string) func() (float64, error) {
	return func() (float64, error) {
		var v struct {
			In  *float64 `json:"in_bytes"`
			Out *float64 `json:"out_bytes"`
		}
		if err := readVarz(monitor, &v); err != nil {
			return 0, err
		}
		if v.In == nil || v.Out == nil {
			return 0, fmt.Errorf("nats /varz: no in_bytes/out_bytes")
		}
		return *v.In + *v.Out, nil
	}
}
