// The key layout under a lock name: exclusive holds under write/, shared
// holds under read/, as etcd's recipes RWMutex lays them out; any other key
// (concurrency.Mutex's, `etcdctl lock`'s, older dlock's) is exclusive.

package etcd

import (
	"strconv"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sub-prefixes of a lock name: recipes RWMutex's, which dlock shares.
const (
	writeDir = "write/"
	readDir  = "read/"
)

// holdKey is the key of a hold of lock name (LockName + "/") by lease id:
// name + "write/" + id in hex, or name + "read/" + id in hex if shared.
func holdKey(name string, shared bool, id clientv3.LeaseID) string {
	dir := writeDir
	if shared {
		dir = readDir
	}
	return name + dir + strconv.FormatInt(int64(id), 16)
}

// nonReadRanges are the two ranges that hold every key under name except
// those under name + "read/": etcd cannot leave a sub-prefix out of one
// range. Each is a key and a range end.
func nonReadRanges(name string) [2][2]string {
	readEnd := clientv3.GetPrefixRangeEnd(name + readDir)
	return [2][2]string{
		{name, name + readDir},
		{readEnd, clientv3.GetPrefixRangeEnd(name)},
	}
}

// isRead reports whether k, a key under lock name, is a shared hold (a key
// under name + "read/", dlock's or a recipes RWMutex reader's).
func isRead(name, k string) bool {
	return len(k) > len(name)+len(readDir) && k[len(name):len(name)+len(readDir)] == readDir
}

// freeFor is the condition of a TryAcquire on lock name: no key under it
// (exclusive), or no key under it but under read/ (shared).
func freeFor(name string, shared bool) []clientv3.Cmp {
	if !shared {
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(name), "=", 0).WithPrefix()}
	}
	rs := nonReadRanges(name)
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(rs[0][0]), "=", 0).WithRange(rs[0][1]),
		clientv3.Compare(clientv3.CreateRevision(rs[1][0]), "=", 0).WithRange(rs[1][1]),
	}
}

// blockers are the reads of the newest key a request on lock name must wait
// for, created before revision below (0: any): one range for an exclusive
// request (every key), two for a shared one (every key not under read/).
// newest picks the answer out of their responses.
func blockers(name string, shared bool, below int64) []clientv3.Op {
	opts := func(end string) []clientv3.OpOption {
		o := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1)}
		if below > 0 {
			o = append(o, clientv3.WithMaxCreateRev(below-1))
		}
		return o
	}
	if !shared {
		return []clientv3.Op{clientv3.OpGet(name, opts(clientv3.GetPrefixRangeEnd(name))...)}
	}
	rs := nonReadRanges(name)
	return []clientv3.Op{clientv3.OpGet(rs[0][0], opts(rs[0][1])...), clientv3.OpGet(rs[1][0], opts(rs[1][1])...)}
}

// newest returns the key with the highest create revision among the range
// responses rs, nil if they are all empty.
func newest(rs []*etcdserverpb.ResponseOp) *mvccpb.KeyValue {
	var top *mvccpb.KeyValue
	for _, r := range rs {
		for _, kv := range r.GetResponseRange().Kvs {
			if top == nil || kv.CreateRevision > top.CreateRevision {
				top = kv
			}
		}
	}
	return top
}
