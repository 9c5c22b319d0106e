// Package redis is dlock's driver for a single Redis server, a master with
// replicas behind Redis Sentinel, or a Redis Cluster. Importing it registers
// the DSN schemes "redis", "redis+sentinel" and "redis+cluster", and their TLS
// forms "rediss", "rediss+sentinel" and "rediss+cluster", with dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/redis"
//
//	locker, err := dlock.Open(ctx, "redis://user:secret@127.0.0.1:6379/0?ttl=10s&prefix=myapp:")
//
// To use a client built in code (custom TLS, Sentinel credentials), call
// [New], [NewDriver] or [OpenUniversal].
//
// A lock is a key set with NX PX; its fencing token is a per-key counter
// floored at the server's clock, so tokens stay strictly increasing across a
// restart without persistence as long as that clock does not step back.
// Waiters are woken by pub/sub, or granted in order with Options.Fair. A
// single server is a single point of failure, and a failover can lose a lock
// (min_replicas narrows that window): check tokens at the resource. Counted
// semaphores and shared locks use layouts of the driver's own.
// docs/redis.md has the whole write-up: guarantees, topologies, key layout.
package redis
