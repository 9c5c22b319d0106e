package zkfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/zkfence"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/third_party/zk"
	_ "github.com/dlock-go/dlock/zookeeper" // zk:// for the paused holder's locks
)

func TestMain(m *testing.M) {
	conformance.RegisterGuard("zookeeper", openTarget)
	conformance.Main(m)
	goleak.VerifyTestMain(m)
}

type discard struct{}

func (discard) Printf(string, ...any) {}

func connect(addr string) (*zk.Conn, error) {
	conn, _, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogInfo(false), zk.WithLogger(discard{}))
	return conn, err
}

// target writes the node /data/RESOURCE through the guard, which it
// creates, empty, when opened.
type target struct {
	conn     *zk.Conn
	g        *zkfence.Guard
	resource string
}

func (t *target) path() string { return "/data/" + t.resource }

func openTarget(_ context.Context, addr, resource string) (conformance.GuardTarget, error) {
	conn, err := connect(addr)
	if err != nil {
		return nil, err
	}
	t := &target{conn: conn, g: &zkfence.Guard{Conn: conn}, resource: resource}
	for _, p := range []string{"/data", t.path()} {
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			conn.Close()
			return nil, err
		}
	}
	return t, nil
}

func (t *target) Write(ctx context.Context, tok dlock.Token, v string) error {
	return t.g.Set(ctx, tok, t.resource, t.path(), []byte(v))
}

func (t *target) Read(context.Context) (string, error) {
	data, _, err := t.conn.Get(t.path())
	return string(data), err
}

func (t *target) Close() error { t.conn.Close(); return nil }

func TestGuardSuite(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	conformance.RunGuardSuite(t, conformance.GuardConfig{
		Guard: "zookeeper", Server: "zookeeper", Config: srv.Addr(), LockDSN: srv.URL("/dlock") + "?session=2s",
		Restart: func(testing.TB) { srv.Kill(); srv.Restart() }, // the transaction log outlives the process
	})
}

// TestMultiOps: the caller's ops run in the fenced multi; a stale token runs
// none of them; a failing op of the caller's fails the multi and leaves the
// fence as it was.
func TestMultiOps(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	conn, err := connect(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := &zkfence.Guard{Conn: conn, Root: "/fences/app"}
	if err := g.Create(ctx, 10, "jobs/a", "/a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Multi(ctx, 10, "jobs/a", &zk.SetDataRequest{Path: "/a", Data: []byte("2"), Version: -1},
		&zk.CreateRequest{Path: "/b", Acl: zk.WorldACL(zk.PermAll)}); err != nil {
		t.Fatal(err)
	}
	err = g.Delete(ctx, 9, "jobs/a", "/b")
	var se *fencing.StaleTokenError
	if !errors.As(err, &se) || se.Token != 9 || se.Highest != 10 {
		t.Fatalf("Delete with token 9 after 10: %v, want a StaleTokenError naming 9 and 10", err)
	}
	if ok, _, _ := conn.Exists("/b"); !ok {
		t.Fatal("the stale Delete deleted /b")
	}
	if err := g.Create(ctx, 12, "jobs/a", "/a", nil); !errors.Is(err, zk.ErrNodeExists) {
		t.Fatalf("a fenced Create of an existing node = %v, want zk.ErrNodeExists", err)
	}
	if hi, err := g.Highest(ctx, "jobs/a"); err != nil || hi != 10 {
		t.Fatalf("after the failed multi Highest = %d, %v; want 10", hi, err)
	}
	if err := g.Delete(ctx, 11, "jobs/a", "/b"); err != nil {
		t.Fatal(err)
	}
	if err := g.Set(ctx, 0, "jobs/a", "/a", nil); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("Set with token 0 = %v, want ErrStaleToken", err)
	}
}
