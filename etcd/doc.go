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
// ([LockName]), in the layout of etcd's recipes RWMutex: NAME/write/<lease>
// for an exclusive hold, NAME/read/<lease> for a shared one
// (package rwlock's readers). recipes readers and writers,
// concurrency.Mutex, `etcdctl lock` and concurrency.Election therefore
// exclude dlock's holders and queue with them; every key not under read/ is
// exclusive. The fencing token is the key's create revision: strictly
// increasing per key whatever the timing ([backend.FencingStrict]). Waiters
// queue FIFO and each watches only the newest key it waits for; a held key
// is watched too, so its loss ends the lease at once. The locks a Locker
// holds with one TTL are keys of one shared etcd lease, as a
// concurrency.Session's Mutexes are: an acquire is one request, and their
// renewals share one keep-alive; they end together if that lease is lost.
// The lock survives the loss of a minority of members; keep the TTL at 5s
// or more (default 15s) so that a lease survives a leader election.
//
// Counted semaphores (package semaphore's permits) are in
// a layout of dlock's own, etcd's recipes having none: a permit of slot i is
// the one key under the lock name of the slot key KEY/permits/i, and
// waiters queue by create revision in a waiting room, the keys under the
// lock name of KEY/permits/; each key's value records n ("permits=<n>
// <label>"), so a request with another n fails with dlock.ErrSizeMismatch.
// An uncontended permit is one transaction, a hand-off to a waiter one
// transaction after the release, and the token is the slot key's create
// revision. A concurrency.Mutex or `etcdctl lock` on a slot's lock name
// holds that slot.
//
// DSN: etcd://[user:password@]host[:port][,host[:port]...][/prefix], with the
// parameters dial-timeout and request-timeout (5s each), and ca, cert and key
// (PEM files) for etcds. docs/etcd.md in the repository has the whole
// write-up: guarantees, TTLs, key layout and interoperability (recipes order
// keys by mod revision: a relabelled hold hides from recipes waiters),
// semaphores, and the DSN in detail.
package etcd
