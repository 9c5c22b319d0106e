// Watching a held key, so that its loss is reported (OnLost) at once.

package etcd

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

// lossWatchDelay is how long after a grant the driver starts watching the
// holder's key for a loss. A lease released sooner costs no watch; a loss in
// that time is found when the watch starts (it checks the key).
const lossWatchDelay = 20 * time.Millisecond

// startLossWatch runs watchLoss for g unless g was released or the driver
// closed meanwhile.
func (d *Driver) startLossWatch(g *grant) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.wg.Add(1) // before Close's Wait: Close sets closed under d.mu first
	d.mu.Unlock()
	defer d.wg.Done()

	g.mu.Lock()
	if g.released {
		g.mu.Unlock()
		return
	}
	ctx, stop := context.WithCancel(d.bg)
	g.stopWatch = stop
	g.mu.Unlock()
	defer stop()
	d.watchLoss(ctx, g)
}

// watchLoss reports g lost when g's key is deleted by anyone but g's Release.
// It ends when ctx is done (Release, Close) or the loss is reported.
func (d *Driver) watchLoss(ctx context.Context, g *grant) {
	var bo backend.Backoff
	seen := g.rev
	for {
		err := d.awaitDelete(ctx, nil, g.key, g.rev, seen)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			g.markLost(fmt.Errorf("key %s was deleted (its lease expired or was revoked, or someone deleted it)", g.key))
			return
		}
		// The watch failed; read the key, then watch again.
		if backend.Sleep(ctx, bo.Next()) != nil {
			return
		}
		rctx, cancel := d.reqCtx(ctx)
		resp, err := d.cli.Get(rctx, g.key, clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			continue
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != g.rev {
			g.markLost(fmt.Errorf("key %s is gone", g.key))
			return
		}
		seen = resp.Header.Revision
	}
}
