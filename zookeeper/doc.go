// Package zookeeper is dlock's driver for Apache ZooKeeper, over
// github.com/go-zookeeper/zk. Importing it registers the DSN scheme "zk" with
// dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/zookeeper"
//
//	locker, err := dlock.Open(ctx, "zk://zk1:2181,zk2:2181,zk3:2181/dlock?session=10s")
//
// To lock over a *zk.Conn your program already has, call [New] or
// [NewDriver]; [Dial] connects the way Open does and returns the driver.
//
// A lock is Apache Curator's InterProcessMutex recipe in Curator's layout
// (ephemeral sequential nodes in protected mode), so Curator and
// go-zookeeper's zk.Lock exclude dlock and dlock excludes them. The token is
// the czxid of the holder's node ([backend.FencingStrict]); waiters queue in
// arrival order and each watches only its predecessor. A shared acquire
// (package rwlock's readers) queues a reader node "_c_<uuid>-read-lock-<seq>"
// in the same queue: readers ahead of every exclusive node hold the lock
// together, a reader behind a waiting writer waits for it, and Curator's
// InterProcessMutex and zk.Lock take a reader for one more exclusive holder
// (Curator's InterProcessReadWriteLock cannot share the path). A counted
// acquire (package semaphore's permits) is Curator's
// InterProcessSemaphoreV2 on the key's path ("locks" mutex, "leases" nodes
// "_c_<uuid>-lease-<seq>"), so Curator's semaphores and dlock's count each
// other; dlock's lease node records the slot it picked (the lease's key,
// KEY/permits/i), and its czxid is the token. A lock lives as long
// as the driver's session: a lease is lost the moment the session expires, or
// when the connection has been down so long that the leader may have expired
// it, counted only from requests the leader answered. docs/zookeeper.md in
// the repository has the whole write-up: sessions, validity, the queue order
// across ZooKeeper's sequence wrap, and the key mapping.
package zookeeper
