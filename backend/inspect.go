package backend

import (
	"context"
	"time"
)

// LockInfo is what a backend knows of one lock: who holds it, since and until
// when, with which token, and how many wait for it.
type LockInfo struct {
	// Key is the lock's key.
	Key string

	// Held reports whether someone holds the lock. The fields below describe
	// the holder and are zero when it is not held (Waiters excepted).
	Held bool

	// Shared is how many hold the lock shared, 0 when it is free or held
	// exclusively; when above 0, the holder fields describe one of them (the
	// last granted, where the backend can tell; Token 0 where it cannot).
	Shared int

	// Token is the holder's fencing token, 0 if the backend cannot tell.
	Token uint64

	// Owner is the holder's owner ID (AcquireRequest.Owner), "" if the backend
	// does not store it.
	Owner string

	// Label is the holder's label (AcquireRequest.Label), "" if it stored
	// none or the backend has no room for one.
	Label string

	// Granted is when the holder was granted the lock, by the server's clock;
	// zero if the backend does not record it.
	Granted time.Time

	// Expires is when the server drops the lock unless its holder renews it,
	// by the server's clock; zero where the lock lasts as long as a session
	// (ZooKeeper, PostgreSQL) or the backend cannot tell.
	Expires time.Time

	// Waiters is how many clients the backend knows to wait for the lock, -1
	// if it cannot tell.
	Waiters int
}

// Inspector is an optional interface a Driver implements to report, read
// only, the state of every client's locks (dlock.Inspect, dlock.List).
type Inspector interface {
	// Inspect reports the state of key's lock; a lock nobody holds is not an
	// error (LockInfo.Held false).
	Inspect(ctx context.Context, key string) (LockInfo, error)

	// List reports the held locks whose keys start with prefix ("" for all),
	// in key order.
	List(ctx context.Context, prefix string) ([]LockInfo, error)
}

// Breaker is an optional interface a Driver implements to force-release a
// lock held by someone else (dlock.Break). Break removes key's holders and
// returns what it removed, or fails with ErrNotHeld if nobody holds key; it
// leaves the token state alone (the next grant's token is higher), and the
// broken holder learns of it no later than its next renewal.
type Breaker interface {
	Break(ctx context.Context, key string) (LockInfo, error)
}

// MultiAcquirer is an optional interface a Driver implements to take several
// locks in one atomic step, for dlock.AcquireAll's and TryAcquireAll's first
// attempt.
type MultiAcquirer interface {
	// TryAcquireAll makes one attempt to take every lock of reqs (distinct
	// keys, Wait false, one TTL) at once: a grant for each, in order, or none
	// and ErrHeld if any is held, leaving nothing behind.
	TryAcquireAll(ctx context.Context, reqs []AcquireRequest) ([]*Grant, error)
}

// Watcher is an optional interface a Driver implements to report changes of
// a key's lock as they happen (dlock.Watch, election's Observe).
type Watcher interface {
	// Watch calls changed, from one goroutine the driver owns, each time
	// key's lock may have changed (spuriously, once for several changes, a
	// grant only as the release before it; and when the watch breaks and is
	// back), until ctx ends or the driver is closed. It returns once the watch
	// is in place.
	Watch(ctx context.Context, key string, changed func()) error
}

// Relabeler is an optional interface a Driver implements to change a held
// lock's label (dlock.Lease.SetLabel, election's Proclaim). Relabel stores
// label as g's where Inspect reads it and Watch reports it, or fails with
// ErrNotHeld; it may update g's Owner and Data (dlock makes no other call with
// g meanwhile), and g still works for Refresh and Release if it fails.
type Relabeler interface {
	Relabel(ctx context.Context, g *Grant, label string) error
}
