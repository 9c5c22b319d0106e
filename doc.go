// Package dlock provides distributed locks with fencing tokens over
// interchangeable backends: Redis, Redlock, etcd, ZooKeeper, PostgreSQL,
// MySQL, a lock table in PostgreSQL or MySQL, and an in-process store for
// tests (package memlock).
//
// # Locks, leases and tokens
//
// A [Locker] grants locks. A granted lock is a [*Lease]: it is renewed in the
// background ([WithAutoRenew]) until released, [Lease.Done] is closed when it
// ends (released, expired or lost), and [Lease.Err] says which. A lock can be
// lost while its holder still works, so each lease carries a fencing [Token],
// strictly increasing per key: send it with every write, and have the resource
// reject a token lower than the highest it has seen (package fencing). [Do]
// runs a function under a lease and cancels its context when the lease is lost.
//
// # Opening a Locker
//
// [Open] takes a DSN whose scheme selects a driver, registered by importing
// the driver's package; [New] takes a driver built in code.
//
//	import _ "github.com/dlock-go/dlock/redis"
//
//	locker, err := dlock.Open(ctx, "redis://127.0.0.1:6379/0?ttl=10s")
//
// # Errors and capabilities
//
// Every error is an [*Error] that matches one of the sentinel errors
// ([ErrNotAcquired], [ErrLeaseLost], …) with errors.Is. [Locker.Capabilities]
// says what a backend guarantees: how far its tokens can be trusted
// ([FencingLevel]), whether waiters are served in order, whether it survives
// the loss of a server.
//
// # Options, observers and primitives
//
// An [Option] configures a Locker, an [AcquireOption] one acquire, and a
// [LeaseOption] (WithTTL, WithLabel, …) either; an option given where it does
// not belong does not compile. [WithObserver] takes an [observe.Observer]
// (package observe; package dlockotel implements one with OpenTelemetry), and
// [WithLogger] a log/slog logger. Semaphores, read/write locks and leader
// election over any Locker live in packages semaphore, rwlock and election.
//
// # Beyond one lock
//
// [AcquireAll] takes several keys all or nothing; [Inspect], [List], [Break]
// and [Watch] report on and manage any client's locks; [WithReentrant] allows
// nested holds. A Locker that wraps another keeps these by implementing
// [Inspector], [Breaker], [Watcher], [MultiAcquirer] and [Unwrapper].
// docs/guide.md in the repository has the details.
package dlock
