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
// A lock is a key set with NX PX by a Lua script that also bumps a per-key
// fence counter floored at the server's clock in microseconds: tokens stay
// strictly increasing across a restart without persistence and across the
// counter's eviction, as long as the server's clock does not step back. The
// lock, counter and release channel share one Cluster hash tag. Release and
// renewal are owner-checked scripts; waiters are woken by pub/sub, with a
// jittered poll as fallback, and ride out an outage until their ctx ends. A
// single server is a single point of failure, and a failover can lose a
// lock (min_replicas narrows, does not close, that window): check tokens at
// the resource.
//
// Counted semaphores (package semaphore's permits) are the
// driver's own layout, in the spirit of Redisson's
// RPermitExpirableSemaphore: under the semaphore's hash tag, a sorted set of
// slot → expiry on the server's clock, a hash of slot → token and holder, a
// key recording n and a fencing counter floored at the server's clock. One
// script per step sweeps the expired permits first; waiters are woken by a
// release message.
//
// Shared locks (package rwlock's readers) are the driver's own
// layout too, in the default mode (not with Options.Fair, which refuses
// them): beside the lock key, a sorted set of shared holder → expiry on the
// server's clock, and one of waiting writers' marks, which keep new shared
// holders out while a writer waits (a crashed writer's mark expires with its
// TTL). The exclusive acquire refuses while a shared holder is live; tokens
// of both modes come from the one counter. docs/redis.md in the repository
// has the whole write-up.
package redis
