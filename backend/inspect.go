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

	// Shared is how many hold the lock shared (AcquireRequest.Shared); 0 when
	// it is free or held exclusively. When it is above 0, Token, Owner, Label,
	// Granted and Expires describe one of them — the one granted last where
	// the backend can tell (mem://), with Token 0 where it cannot
	// (PostgreSQL).
	Shared int

	// Token is the holder's fencing token, 0 if the backend cannot tell.
	Token uint64

	// Owner is the holder's owner ID (AcquireRequest.Owner), "" if the backend
	// does not store it.
	Owner string

	// Label is the holder's label (AcquireRequest.Label: by default
	// "hostname:pid"), "" if the holder stored none or the backend has no room
	// for one.
	Label string

	// Granted is when the holder was granted the lock, by the server's clock;
	// zero if the backend does not record it.
	Granted time.Time

	// Expires is when the server drops the lock unless its holder renews it,
	// by the server's clock; zero where the lock lasts as long as a session
	// (ZooKeeper, PostgreSQL) or the backend cannot tell.
	Expires time.Time

	// Waiters is how many clients the backend knows to wait for the lock; -1
	// if it cannot tell (waiters that poll, or that the backend does not
	// list).
	Waiters int
}

// Inspector is an optional interface a Driver implements to report the state
// of locks: dlock.Inspect and dlock.List (and `dlock inspect`, `dlock ls`) use
// it. Both read only, and see every client's locks, not only the driver's.
type Inspector interface {
	// Inspect reports the state of key's lock; a lock nobody holds is not an
	// error (LockInfo.Held false).
	Inspect(ctx context.Context, key string) (LockInfo, error)

	// List reports the held locks whose keys start with prefix ("" for all),
	// in key order.
	List(ctx context.Context, prefix string) ([]LockInfo, error)
}

// Breaker is an optional interface a Driver implements to force-release a
// lock held by someone else (dlock.Break, `dlock break`).
//
// Break removes the current holder of key (every shared holder, if it is
// held shared) and returns what it removed. It must leave the key's token state alone, so that the next grant's token is
// higher than the broken holder's and a fencing guard rejects the broken
// holder's writes once the next holder has written; and the broken holder
// must learn of it no later than its next renewal. It returns an error
// wrapping ErrNotHeld if nobody holds key.
type Breaker interface {
	Break(ctx context.Context, key string) (LockInfo, error)
}

// MultiAcquirer is an optional interface a Driver implements when it can take
// several locks in one atomic step: dlock.AcquireAll and TryAcquireAll use it
// for their first attempt (falling back to one key at a time, in sorted
// order, when a key is held and they are to wait).
type MultiAcquirer interface {
	// TryAcquireAll makes one attempt to take every lock of reqs (distinct
	// keys, Wait false, one TTL) at once. It returns a grant for each, in
	// order, or none and an error wrapping ErrHeld if any of them is held,
	// leaving nothing behind.
	TryAcquireAll(ctx context.Context, reqs []AcquireRequest) ([]*Grant, error)
}

// Watcher is an optional interface a Driver implements to report, as they
// happen, changes of a key's lock — grants, releases, expiries, waiters
// arriving or leaving — so that a follower (dlock.Watch, package election's
// Observe) need not poll.
type Watcher interface {
	// Watch calls changed each time key's lock may have changed, until ctx
	// ends or the driver is closed, from one goroutine the driver owns and
	// waits for in Close. It returns once the watch is in place: a change
	// after it returns is reported. Calls may be spurious, changes that come
	// together may be reported once, and a grant that follows a release may
	// be reported only as the release (the caller reads the state again
	// shortly after). If the watch breaks (a lost connection), changed is
	// called, and again once the watch is back in place.
	Watch(ctx context.Context, key string, changed func()) error
}

// Relabeler is an optional interface a Driver implements to change the label
// of a lock it holds (dlock.Lease.SetLabel; package election's Proclaim, which
// changes the value a leader publishes).
//
// Relabel stores label (checked as AcquireRequest.Label is) as g's label if g
// still holds its lock, where Inspect reads it and so that a Watch of the key
// reports the change. It returns an error wrapping ErrNotHeld if the lock is no
// longer g's. dlock makes no other call with g while Relabel runs, and Relabel
// may update g (its Owner, where the stored value names both owner and label,
// and its Data) for the calls that follow; when it fails, g must still work
// for Refresh and Release.
type Relabeler interface {
	Relabel(ctx context.Context, g *Grant, label string) error
}
