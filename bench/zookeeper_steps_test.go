package bench

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/third_party/zk"
)

// BenchmarkZooKeeperSteps takes dlock's uncontended ZooKeeper cycle apart, step
// by step from the raw floor, all interleaved round by round on one
// standalone server (scripts/bench.sh runs it with -benchtime 3000x -count 3):
//
//   - floor: BenchmarkZooKeeper's floor, an ephemeral node made and deleted;
//   - seq-floor: an ephemeral sequential node, named as dlock names its lock
//     nodes and holding a label, under a container node of the key: the
//     layout of a ZooKeeper lock queue, with no token;
//   - fenced-floor: dlock's create transaction with nothing else of dlock's
//     (a multi that creates that node and writes the key's node, whose new
//     mzxid, the transaction's, is the token and whose child count says
//     whether the lock is granted at once), then the delete: the least a
//     lock with dlock's token, granted in one round trip, takes;
//   - driver: the zookeeper driver called as the Locker calls it, without
//     one;
//   - dlock: dlock.Open.
//
// Reported as BenchmarkZooKeeper's uncontended scenario (IMPL.ops/s,
// IMPL.p50-ns, …).
func BenchmarkZooKeeperSteps(b *testing.B) {
	srv := testenv.StartZooKeeper(b)
	addr, dsn := srv.Addr(), srv.URL("/dlock")+"?session=10s"
	impls := []impl{
		{name: "floor", newLocker: func(tb testing.TB) locker { return zkFloor{newZKConn(tb, addr)} }},
		{name: "seq-floor", newLocker: func(tb testing.TB) locker { return zkQueueFloor{newZKConn(tb, addr), "/seq-floor", false} }},
		{name: "fenced-floor", newLocker: func(tb testing.TB) locker { return zkQueueFloor{newZKConn(tb, addr), "/fenced-floor", true} }},
		{name: "driver", newLocker: func(tb testing.TB) locker { return openDriver(tb, dsn) }},
		dlockImpl("dlock", dsn, nil),
	}
	b.Run("Uncontended", func(b *testing.B) {
		reportUncontended(b, runUncontended(b, impls, b.N))
	})
}

// zkQueueFloor makes an ephemeral sequential node under the key's container
// node below root, named as dlock's lock nodes and holding dlock's default
// label, and deletes it: with fenced, in one multi with a write to the key's
// node, as dlock's driver creates its lock nodes (zookeeper/lock.go,
// createNode), and it fails unless the node is the key's only child, as a
// grant needs. It cannot wait.
type zkQueueFloor struct {
	c      *zk.Conn
	root   string
	fenced bool
}

func (z zkQueueFloor) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	if wait {
		return nil, fmt.Errorf("%s: cannot wait", z.root)
	}
	parent := zkPath(z.root, key)
	id := backend.NewOwnerID()
	name := parent + "/_c_" + id[0:8] + "-" + id[8:12] + "-" + id[12:16] + "-" + id[16:20] + "-" + id[20:32] + "-lock-"
	label := []byte(dlock.DefaultLabel)
	for {
		var path string
		var err error
		if z.fenced {
			var res []zk.MultiResponse
			res, err = z.c.Multi(
				&zk.CreateRequest{Path: name, Data: label, Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeralSequential},
				&zk.SetDataRequest{Path: parent, Version: -1},
			)
			if err == nil {
				if len(res) != 2 || res[1].Stat == nil || res[1].Stat.NumChildren != 1 || res[1].Stat.Mzxid == 0 {
					return nil, fmt.Errorf("%s: %q not granted at once: %+v", z.root, key, res)
				}
				path = res[0].String
			}
		} else {
			path, err = z.c.Create(name, label, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
		}
		if errors.Is(err, zk.ErrNoNode) {
			if _, err := z.c.Create(z.root, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return nil, err
			}
			if _, err := z.c.CreateContainer(parent, nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return func() error { return z.c.Delete(path, -1) }, nil
	}
}
