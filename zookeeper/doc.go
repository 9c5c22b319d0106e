// Package zookeeper is dlock's driver for Apache ZooKeeper, over
// go-zookeeper v1.0.4 with one data race fixed ([github.com/dlock-go/dlock/third_party/zk]).
// Importing it registers the DSN scheme "zk" with dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/zookeeper"
//
//	locker, err := dlock.Open(ctx, "zk://zk1:2181,zk2:2181,zk3:2181/dlock?session=10s")
//
// To lock over a *zk.Conn your program already has, call [New] or
// [NewDriver]; [Dial] connects the way Open does and returns the driver.
//
// A lock is Apache Curator's InterProcessMutex recipe in Curator's layout, so
// Curator and go-zookeeper's zk.Lock exclude dlock and dlock excludes them;
// shared locks are reader nodes in the same queue, and counted semaphores are
// Curator's InterProcessSemaphoreV2. The token is the czxid of the holder's
// node ([backend.FencingStrict]); waiters queue in arrival order, each
// watching its predecessor. A lock lives as long as the driver's session: a
// lease is lost the moment the session expires, or when the connection has
// been down so long that the leader may have expired it. docs/zookeeper.md has
// the whole write-up: sessions, validity, the queue order, ACLs, the key
// mapping.
package zookeeper
