package etcd_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/testenv"
)

// TestNewDriverChecksTheCluster: NewDriver checks that the cluster answers,
// as Open does, bounded by its ctx and the request timeout: on a live
// cluster it returns the driver (its prefix without a trailing '/'), and with
// the server paused it fails within about one request timeout.
func TestNewDriverChecksTheCluster(t *testing.T) {
	srv := testenv.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	d, err := etcd.NewDriver(context.Background(), cli, &etcd.Options{Prefix: "/x/"})
	if err != nil {
		t.Fatalf("NewDriver on a live cluster: %v", err)
	}
	if d.Prefix() != "/x" || d.LockName("k") != "/x/k" {
		t.Errorf("Prefix() = %q, LockName(k) = %q", d.Prefix(), d.LockName("k"))
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	const timeout = 500 * time.Millisecond
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	d, err = etcd.NewDriver(context.Background(), cli, &etcd.Options{Prefix: testPrefix, RequestTimeout: timeout})
	took := time.Since(start)
	if err == nil {
		_ = d.Close()
		t.Fatal("NewDriver with the server paused succeeded")
	}
	t.Logf("NewDriver with the server paused: %v after %v", err, took)
	if limit := timeout + timeout/8 + 500*time.Millisecond; took > limit {
		t.Errorf("NewDriver with the server paused took %v, want at most %v", took, limit)
	}
}
