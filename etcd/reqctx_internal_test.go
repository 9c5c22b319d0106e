package etcd

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
)

// Requests carry no deadline to etcd (reqCtx), whatever the caller's ctx: a
// TryAcquire on a ctx that never ends, a release on the Locker's release
// context, and an Acquire, a TryAcquire and their releases on a ctx with a
// deadline. The client's bound still ends them: with the server paused, a
// TryAcquire fails within two request timeouts and an eighth each (the
// request that may have created its key, then the delete of that key).
func TestRequestsCarryNoDeadline(t *testing.T) {
	srv := testenv.StartEtcd(t)
	var mu sync.Mutex
	calls := 0
	var withDeadline []string
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		_, has := ctx.Deadline()
		mu.Lock()
		calls++
		if has {
			withDeadline = append(withDeadline, method)
		}
		mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{srv.Endpoint()},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(record)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const timeout = 500 * time.Millisecond
	d, err := NewDriver(context.Background(), cli, &Options{RequestTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	l, err := dlock.New(d)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	lease, err := l.TryAcquire(context.Background(), "no-deadline/background")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, wait := range []bool{true, false} {
		acquire := l.TryAcquire
		if wait {
			acquire = l.Acquire
		}
		lease, err := acquire(ctx, "no-deadline/deadline")
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	n, got := calls, withDeadline
	mu.Unlock()
	t.Logf("%d unary requests", n)
	if n < 6 {
		t.Fatalf("%d unary requests seen for three acquires and releases: the interceptor is not in the path", n)
	}
	if len(got) > 0 {
		t.Fatalf("requests sent with a deadline (gRPC sends it to etcd as grpc-timeout): %v", got)
	}

	srv.Pause()
	start := time.Now()
	_, err = l.TryAcquire(context.Background(), "no-deadline/paused")
	took := time.Since(start)
	srv.Resume()
	t.Logf("TryAcquire with the server paused: %v after %v", err, took)
	if err == nil {
		t.Fatal("TryAcquire with the server paused succeeded")
	}
	if limit := 2*(timeout+timeout/8) + 500*time.Millisecond; took > limit {
		t.Fatalf("TryAcquire with the server paused took %v; the request timeout is %v", took, timeout)
	}
}
