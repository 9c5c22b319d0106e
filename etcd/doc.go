// Package etcd is dlock's driver for etcd v3, through go.etcd.io/etcd/client/v3.
// Importing it registers the DSN schemes "etcd" and "etcds" (TLS) with
// dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/etcd"
//
//	locker, err := dlock.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks?ttl=10s")
//
// To use a *clientv3.Client built in code, call [New] or [NewDriver].
//
// A lock is a key attached to an etcd lease under the lock's name
// ([LockName]), in the layout of etcd's recipes RWMutex, so concurrency.Mutex,
// `etcdctl lock` and recipes readers and writers exclude dlock's holders and
// queue with them. The fencing token is the key's create revision, strictly
// increasing per key ([backend.FencingStrict]); waiters queue FIFO, each
// watching the newest key it waits for. The locks a Locker holds with one TTL
// share one etcd lease and end together if it is lost. Keep the TTL at 5s or
// more (default 15s) so that a lease survives a leader election. Counted
// semaphores use a layout of dlock's own.
//
// DSN: etcd://[user:password@]host[:port][,host[:port]...][/prefix], with the
// parameters dial-timeout and request-timeout (5s each), and ca, cert and key
// (PEM files) for etcds. docs/etcd.md has the whole write-up: guarantees,
// TTLs, key layout and interoperability, semaphores, the DSN in detail.
package etcd
