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
// counted on the client's clock and its token is timing-dependent
// ([backend.FencingTimingDependent]): it can go backwards in the failure cases
// docs/redlock.md describes. Prefer etcd, ZooKeeper or PostgreSQL where mutual
// exclusion must not depend on timing.
package redlock
