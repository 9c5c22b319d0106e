package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock/backend"
	_ "github.com/dlock-go/dlock/etcd" // etcd://
	"github.com/dlock-go/dlock/internal/testenv"
)

type etcdEnv struct {
	srv   *testenv.Etcd
	reqs  func() (float64, error)
	impls []impl
}

func startEtcdEnv(tb testing.TB) *etcdEnv {
	e := &etcdEnv{srv: testenv.StartEtcd(tb)}
	e.reqs = etcdRequests(e.srv.Endpoint())
	ep := e.srv.Endpoint()
	e.impls = []impl{
		dlockImpl("dlock", e.srv.URL()+"/dlock", e.reqs),
		{name: "etcd-mutex", newLocker: func(tb testing.TB) locker { return newEtcdMutex(tb, ep) }, canWait: true, reqs: e.reqs, oneSessionPerWaiter: true},
		{name: "floor", newLocker: func(tb testing.TB) locker { return newEtcdFloor(tb, ep) }, reqs: e.reqs},
	}
	return e
}

// etcdRequests returns a reader of the gRPC messages the server has received
// (grpc_server_msg_received_total over all methods, from /metrics): one per
// unary request, one per message on a stream (watch, lease keep-alive).
func etcdRequests(endpoint string) func() (float64, error) {
	return func() (float64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, fmt.Errorf("etcd /metrics: %w", err)
		}
		defer resp.Body.Close()
		var sum float64
		found := false
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "grpc_server_msg_received_total{") {
				continue
			}
			// Maintenance calls are the benchmark's own (none expected).
			if strings.Contains(line, `grpc_service="etcdserverpb.Maintenance"`) {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err != nil {
				return 0, fmt.Errorf("etcd /metrics: bad line %q", line)
			}
			sum += v
			found = true
		}
		if err := sc.Err(); err != nil {
			return 0, fmt.Errorf("etcd /metrics: %w", err)
		}
		if !found {
			return 0, fmt.Errorf("etcd /metrics: no grpc_server_msg_received_total")
		}
		return sum, nil
	}
}

func newEtcdClient(tb testing.TB, endpoint string) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// etcdMutex is go.etcd.io/etcd/client/v3/concurrency.Mutex, one session (one
// lease, kept alive by the session) per client.
type etcdMutex struct{ s *concurrency.Session }

func newEtcdMutex(tb testing.TB, endpoint string) etcdMutex {
	cli := newEtcdClient(tb, endpoint)
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(benchTTL/time.Second)))
	if err != nil {
		tb.Fatalf("etcd session: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return etcdMutex{s}
}

func (m etcdMutex) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	mu := concurrency.NewMutex(m.s, "/etcd-mutex/"+key)
	var err error
	if wait {
		err = mu.Lock(ctx)
	} else {
		err = mu.TryLock(ctx)
	}
	if err != nil {
		return nil, err
	}
	return func() error { return mu.Unlock(context.Background()) }, nil
}

// etcdFloor is the least an etcd lock with expiry does: a transaction that
// puts the key, attached to a lease, if it does not exist, and a delete of it.
// The lease is granted once per client (a long TTL, never renewed), as dlock
// reuses its leases.
type etcdFloor struct {
	cli   *clientv3.Client
	lease clientv3.LeaseID
}

func newEtcdFloor(tb testing.TB, endpoint string) etcdFloor {
	cli := newEtcdClient(tb, endpoint)
	resp, err := cli.Grant(context.Background(), 3600)
	if err != nil {
		tb.Fatalf("floor: lease grant: %v", err)
	}
	tb.Cleanup(func() { _, _ = cli.Revoke(context.Background(), resp.ID) })
	return etcdFloor{cli, resp.ID}
}

func (f etcdFloor) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	if wait {
		return nil, fmt.Errorf("floor: cannot wait")
	}
	k := "/floor/" + key
	resp, err := f.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, backend.NewOwnerID(), clientv3.WithLease(f.lease))).
		Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("floor: %q is held", k)
	}
	return func() error {
		_, err := f.cli.Delete(context.Background(), k)
		return err
	}, nil
}

// BenchmarkEtcd compares dlock's etcd driver, concurrency.Mutex and the raw
// floor on one etcd server; the scenarios are BenchmarkRedis's.
func BenchmarkEtcd(b *testing.B) {
	e := startEtcdEnv(b)
	benchBackend(b, e.impls)
}
