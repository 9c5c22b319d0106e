package backend

import "context"

// Orphaner is an optional interface a Driver implements when a lock it grants
// can outlive its client: the backend keeps it until its TTL runs out on the
// server's clock, whether or not the client renews it, stays connected or
// closes (dlock.Lease.Orphan). Orphan makes g's lock such a lock, if it is
// not already one, and forgets g: dlock makes no further call with g, and the
// driver's Close must leave the lock in place. It may fail with ErrNotHeld if it
// finds that g's owner no longer holds the lock. Drivers whose locks live with a session
// (PostgreSQL's and MySQL's session locks, ZooKeeper's ephemeral nodes) do
// not implement it.
type Orphaner interface {
	Orphan(ctx context.Context, g *Grant) error
}
