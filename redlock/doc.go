// Package redlock is dlock's driver for Redlock: one lock held on a quorum of
// N independent Redis masters, as the algorithm's authors specify it.
// Importing it registers the DSN schemes "redlock" and "redlocks" (TLS) with
// dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/redlock"
//
//	locker, err := dlock.Open(ctx, "redlock://h1:6379,h2:6379,h3:6379,h4:6379,h5:6379?ttl=10s")
//
// To use go-redis clients built in code (a different password or TLS
// configuration per node, IPv6 literals), call [New] or [NewDriver].
//
// The lock survives the loss of a minority of the nodes. Its validity is
// counted on the client's clock, less a drift allowance, and its token is the
// maximum over the granting quorum of per-node counters floored at each
// node's clock: it is timing-dependent ([backend.FencingTimingDependent]),
// and can go backwards in the failure cases docs/redlock.md describes — the
// whole write-up, in the repository. Prefer etcd, ZooKeeper or PostgreSQL
// where mutual exclusion must not depend on timing.
package redlock
