package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/zookeeper" // zk://
)

type zkEnv struct {
	srv   *testenv.ZooKeeper
	reqs  func() (float64, error)
	impls []impl
}

func startZooKeeperEnv(tb testing.TB) *zkEnv {
	e := &zkEnv{srv: testenv.StartZooKeeper(tb)}
	addr := e.srv.Addr()
	e.reqs = zkPackets(addr)
	e.impls = []impl{
		dlockImpl("dlock", e.srv.URL("/dlock")+"?session=10s", e.reqs),
		{name: "zk-lock", newLocker: func(tb testing.TB) locker { return zkLock{newZKConn(tb, addr)} }, canWait: true, reqs: e.reqs},
		{name: "floor", newLocker: func(tb testing.TB) locker { return zkFloor{newZKConn(tb, addr)} }, reqs: e.reqs},
	}
	return e
}

// zkPackets returns a reader of the packets the server has received
// (zk_packets_received from the mntr command): every request, and the
// sessions' pings.
func zkPackets(addr string) func() (float64, error) {
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
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "zk_packets_received\t"); ok {
				return strconv.ParseFloat(strings.TrimSpace(v), 64)
			}
		}
		return 0, fmt.Errorf("zookeeper mntr: no zk_packets_received (%v)", sc.Err())
	}
}

// newZKConn connects to addr with a 10s session and waits for the session.
// The goroutine draining its events ends when tb's cleanup closes it.
func newZKConn(tb testing.TB, addr string) *zk.Conn {
	c, events, err := zk.Connect([]string{addr}, benchTTL, zk.WithLogInfo(false), zk.WithLogger(nopLogger{}))
	if err != nil {
		tb.Fatalf("zk connect: %v", err)
	}
	connected := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	wg.Go(func() {
		for ev := range events {
			if ev.State == zk.StateHasSession {
				once.Do(func() { close(connected) })
			}
		}
	})
	tb.Cleanup(func() { c.Close(); wg.Wait() })
	select {
	case <-connected:
	case <-time.After(10 * time.Second):
		tb.Fatalf("zk connect: no session after 10s")
	}
	return c
}

type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}

// zkPath turns a benchmark key into one node name.
func zkPath(root, key string) string { return root + "/" + strings.ReplaceAll(key, "/", "_") }

// zkLock is go-zookeeper's zk.NewLock (the lock recipe: a sequential
// ephemeral node, a watch on the predecessor). It has no try-lock, so the
// uncontended scenario uses Lock; and Lock takes no context.
type zkLock struct{ c *zk.Conn }

func (z zkLock) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	l := zk.NewLock(z.c, zkPath("/zk-lock", key), zk.WorldACL(zk.PermAll))
	if err := l.Lock(); err != nil {
		return nil, err
	}
	return l.Unlock, nil
}

// zkFloor is the least a ZooKeeper lock does: create an ephemeral node,
// delete it.
type zkFloor struct{ c *zk.Conn }

func (z zkFloor) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	if wait {
		return nil, fmt.Errorf("floor: cannot wait")
	}
	p := zkPath("/floor", key)
	for {
		_, err := z.c.Create(p, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		if errors.Is(err, zk.ErrNoNode) {
			if _, err := z.c.Create("/floor", nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return func() error { return z.c.Delete(p, 0) }, nil
	}
}

// BenchmarkZooKeeper compares dlock's ZooKeeper driver, zk.NewLock and the raw
// floor on one standalone server; the scenarios are BenchmarkRedis's.
func BenchmarkZooKeeper(b *testing.B) {
	e := startZooKeeperEnv(b)
	benchBackend(b, e.impls)
}
