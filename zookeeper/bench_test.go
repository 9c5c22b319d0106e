package zookeeper_test

import (
	"errors"
	"testing"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/zookeeper"
)

// BenchmarkZooKeeper compares, against one standalone server in one run:
//
//   - Floor: the least a ZooKeeper lock can cost, one ephemeral sequential
//     create and one delete on a raw go-zookeeper connection;
//   - ZkLock: go-zookeeper's own zk.Lock, Lock then Unlock;
//   - AcquireRelease and Handoff8: dlock through its public API (see
//     conformance.RunBenchmarks).
//
// Run with: go test -run '^$' -bench BenchmarkZooKeeper -count 5 ./zookeeper/
func BenchmarkZooKeeper(b *testing.B) {
	srv := testenv.StartZooKeeper(b)
	h := newHarness(b, []string{srv.Addr()}, zookeeper.DefaultSessionTimeout)
	acl := zk.WorldACL(zk.PermAll)
	conn, _, err := zk.Connect([]string{srv.Addr()}, zookeeper.DefaultSessionTimeout, zk.WithLogInfo(false), zk.WithLogger(discard{}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(conn.Close)
	for _, p := range []string{"/bench", "/bench/floor"} {
		if _, err := conn.Create(p, nil, zk.FlagPersistent, acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			b.Fatal(err)
		}
	}

	b.Run("Floor", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, err := conn.Create("/bench/floor/lock-", nil, zk.FlagEphemeralSequential, acl)
			if err != nil {
				b.Fatal(err)
			}
			if err := conn.Delete(p, -1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ZkLock", func(b *testing.B) {
		l := zk.NewLock(conn, "/bench/zklock", acl)
		b.ReportAllocs()
		for b.Loop() {
			if err := l.Lock(); err != nil {
				b.Fatal(err)
			}
			if err := l.Unlock(); err != nil {
				b.Fatal(err)
			}
		}
	})
	conformance.RunBenchmarks(b, h)
}
