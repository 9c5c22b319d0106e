package zookeeper

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock/backend"
)

// syncGap is the least time between two syncs that refreshes share: however
// many leases renew, the driver sends at most one such sync per syncGap. A
// refresh waits up to this long for its batch, which shortens nothing: the
// validity counts from the moment dlock called Refresh.
const syncGap = 10 * time.Millisecond

// sharedSync returns once a sync, sent after sharedSync was called, has been
// answered, and when it was sent. The sync goes through the leader, so every
// change the leader committed before it (a deletion of a lock node, with its
// watch event) has reached this client by then. Every refresh that asks
// before the sync is sent shares it (see package internal/batch).
func (d *Driver) sharedSync(ctx context.Context) (time.Time, error) {
	return d.syncs.Do(ctx)
}

// syncRoot is the call the shared syncs make.
func (d *Driver) syncRoot() error {
	select {
	case <-d.quit:
		return errClosed
	default:
	}
	_, err := d.conn.Sync(d.root)
	if err == zk.ErrNoNode { // the root does not exist yet: the sync was done all the same
		err = nil
	}
	return err
}

// nodeGone returns nil if n is still there as far as this client knows after
// a sync, and an error wrapping backend.ErrNotHeld if it is not. The first
// call reads the node with an exists watch; later calls only look whether
// the watch fired (a deletion, or the watch dropped with the session), so
// they cost no request.
func (d *Driver) nodeGone(ctx context.Context, n *lockNode) error {
	if w := n.watch.Load(); w != nil {
		select {
		case ev := <-*w:
			if ev.Type == zk.EventNodeDeleted {
				return fmt.Errorf("%w: %s is gone", backend.ErrNotHeld, n.path)
			}
			// Another event ended the watch (data changed, the watch was
			// dropped): read the node again, with a new watch.
		default:
			return nil
		}
	}
	type exw struct {
		ok bool
		st *zk.Stat
		ch <-chan zk.Event
	}
	r, err := call(ctx, d, func() (exw, error) {
		ok, st, ch, err := d.conn.ExistsW(n.path)
		return exw{ok, st, ch}, err
	})
	switch {
	case err != nil:
		return err
	case !r.ok:
		return fmt.Errorf("%w: %s is gone", backend.ErrNotHeld, n.path)
	case r.st.Czxid != n.czxid || r.st.EphemeralOwner != n.ses.id:
		return fmt.Errorf("%w: %s belongs to another session", backend.ErrNotHeld, n.path)
	}
	// Store a copy: &r.ch would keep all of r on the heap for as long as the
	// lease is held, and the reply's Stat with it (~90 B a lease).
	ch := r.ch
	n.watch.Store(&ch)
	return nil
}
