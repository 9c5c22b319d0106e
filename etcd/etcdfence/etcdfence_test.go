package etcdfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	_ "github.com/dlock-go/dlock/etcd" // etcd:// for the paused holder's locks
	"github.com/dlock-go/dlock/etcd/etcdfence"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/internal/testenv"
)

func TestMain(m *testing.M) {
	conformance.RegisterGuard("etcd", openTarget)
	conformance.Main(m)
	goleak.VerifyTestMain(m)
}

func newClient(endpoint string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// target writes the key /data/RESOURCE through the guard.
type target struct {
	cli      *clientv3.Client
	g        *etcdfence.Guard
	resource string
}

func openTarget(_ context.Context, endpoint, resource string) (conformance.GuardTarget, error) {
	cli, err := newClient(endpoint)
	if err != nil {
		return nil, err
	}
	return &target{cli: cli, g: &etcdfence.Guard{Client: cli}, resource: resource}, nil
}

func (t *target) Write(ctx context.Context, tok dlock.Token, v string) error {
	return t.g.Put(ctx, tok, t.resource, "/data/"+t.resource, v)
}

func (t *target) Read(ctx context.Context) (string, error) {
	resp, err := t.cli.Get(ctx, "/data/"+t.resource)
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	return string(resp.Kvs[0].Value), nil
}

func (t *target) Close() error { return t.cli.Close() }

func TestGuardSuite(t *testing.T) {
	srv := testenv.StartEtcd(t)
	conformance.RunGuardSuite(t, conformance.GuardConfig{
		Guard: "etcd", Server: "etcd", Config: srv.Endpoint(), LockDSN: srv.URL(),
		Restart: func(testing.TB) { srv.Kill(); srv.Restart() }, // a crash: etcd fsyncs its WAL before replying
	})
}

// TestTxnOps: the caller's own operations run in the fenced transaction, and
// their responses come back in order; a stale token runs none of them, and
// tokens compare as numbers (9 < 10), not as strings.
func TestTxnOps(t *testing.T) {
	srv := testenv.StartEtcd(t)
	cli, err := newClient(srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := &etcdfence.Guard{Client: cli, Prefix: "/fences/"}
	if _, err := cli.Put(ctx, "/jobs/a", "old"); err != nil {
		t.Fatal(err)
	}
	resp, err := g.Txn(ctx, 10, "jobs", clientv3.OpGet("/jobs/a"), clientv3.OpPut("/jobs/a", "new"), clientv3.OpPut("/jobs/b", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Responses) != 3 || string(resp.Responses[0].GetResponseRange().Kvs[0].Value) != "old" {
		t.Fatalf("responses %v, want the Get's \"old\" first of 3", resp.Responses)
	}
	_, err = g.Txn(ctx, 9, "jobs", clientv3.OpPut("/jobs/a", "stale"), clientv3.OpDelete("/jobs/b"))
	var se *fencing.StaleTokenError
	if !errors.As(err, &se) || se.Token != 9 || se.Highest != 10 {
		t.Fatalf("Txn with token 9 after 10: %v, want a StaleTokenError naming 9 and 10", err)
	}
	if got, _ := cli.Get(ctx, "/jobs/", clientv3.WithPrefix()); got.Count != 2 || string(got.Kvs[0].Value) != "new" {
		t.Fatalf("after the stale transaction: %v", got.Kvs)
	}
	if n, err := g.Delete(ctx, 11, "jobs", "/jobs/", clientv3.WithPrefix()); err != nil || n != 2 {
		t.Fatalf("Delete with token 11 = %d, %v; want 2, nil", n, err)
	}
	if hi, err := g.Highest(ctx, "jobs"); err != nil || hi != 11 {
		t.Fatalf("Highest = %d, %v; want 11", hi, err)
	}
	if err := g.Put(ctx, 0, "jobs", "/jobs/a", "x"); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("Put with token 0 = %v, want ErrStaleToken", err)
	}
}
