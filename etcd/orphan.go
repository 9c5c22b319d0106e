// Orphan: a grant's key moved to a lease of its own that nobody renews.

package etcd

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

// Orphan implements backend.Orphaner. The holder's key is attached to a
// lease the driver renews (shared with its other keys of that TTL) and
// revokes on Close, so Orphan grants a new etcd lease for what is left of
// the grant's TTL, moves the key to it if the key is still the holder's
// (same create revision: the token and the queue order stay), and forgets
// the grant. The driver never renews nor revokes the new lease: the key
// goes when it expires.
func (d *Driver) Orphan(ctx context.Context, bg *backend.Grant) error {
	g, ok := bg.Data.(*grant)
	if !ok {
		return fmt.Errorf("grant of another driver (%T)", bg.Data)
	}
	if g.shared || g.valuePrefix != "" {
		return fmt.Errorf("orphan %s: only a lock can be orphaned, not a shared hold or a permit", g.key)
	}
	g.mu.Lock()
	if g.released {
		g.mu.Unlock()
		return backend.ErrNotHeld
	}
	g.released = true
	busy := g.refreshing > 0
	if g.watch != nil {
		g.watch.Stop()
	}
	g.mu.Unlock()
	d.removeFromLossWatch(g)

	since, ttl := g.ls.times()
	left := time.Until(since.Add(ttl))
	if left <= 0 || g.lost.Load() {
		d.dropKey(g)
		return fmt.Errorf("orphan %s: lease %x has expired: %w", g.key, int64(g.ls.id), backend.ErrNotHeld)
	}
	ask := int64((left + time.Second - 1) / time.Second)
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	resp, err := d.cli.Grant(rctx, ask)
	if err != nil {
		d.dropKey(g)
		return fmt.Errorf("orphan %s: grant lease of %ds: %w", g.key, ask, err)
	}
	txn, err := d.cli.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(g.key), "=", g.rev)).
		Then(clientv3.OpPut(g.key, "", clientv3.WithIgnoreValue(), clientv3.WithLease(resp.ID))).
		Commit()
	if err != nil || !txn.Succeeded {
		_, _ = d.cli.Revoke(rctx, resp.ID)
		d.dropKey(g)
		if err != nil {
			return fmt.Errorf("orphan %s: move the key to lease %x: %w", g.key, int64(resp.ID), err)
		}
		return fmt.Errorf("orphan %s: the key is gone: %w", g.key, backend.ErrNotHeld)
	}
	d.forgetLease(g, busy)
	return nil
}

// forgetLease gives up g's old lease once g's key has left it: a shared
// lease forgets g's name; a lease of its own is reused, or revoked if a
// refresh in flight may renew it after another grant took it (busy).
func (d *Driver) forgetLease(g *grant, busy bool) {
	if g.ls.shared != nil {
		d.detach(g.ls, g.name)
		return
	}
	if busy {
		d.revokeLater(g.ls)
		return
	}
	d.putLease(g.ls)
}

// dropKey deletes g's key where it was not orphaned, as a release that
// failed does: in the background from a shared lease, by revoking a lease of
// its own.
func (d *Driver) dropKey(g *grant) {
	if g.ls.shared != nil {
		d.deleteLater(g.ls, g.name, g.key, g.rev)
		return
	}
	d.revokeLater(g.ls)
}
