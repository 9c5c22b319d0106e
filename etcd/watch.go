// Watching the held keys, so that a loss is reported (OnLost) at once: one
// watch per driver, over its whole lock prefix, for every lease it holds.

package etcd

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

// lossWatchDelay is how long after a grant the driver adds it to the loss
// watch. A lease released sooner costs nothing; a loss in that time is found
// when it is added (the watch starts at the grant's revision, or the key is
// read).
const lossWatchDelay = 20 * time.Millisecond

// lossWatchLinger is how long the loss watch stays open once no lease is in
// it, so that a driver that takes and releases locks all the time does not
// open a watch for each.
const lossWatchLinger = time.Second

// lossWatch is the driver's one watch of its lock prefix, for deletions only
// (WithFilterPut): a held key deleted by anyone but the holder's Release
// (the lease expired or was revoked, someone deleted it) ends the lease. It
// runs while the driver holds leases, in one goroutine however many.
type lossWatch struct {
	mu      sync.Mutex
	held    map[string]*grant // by key, the leases being watched
	from    int64             // the watch in place reports deletions from this revision on; 0: none
	running bool              // the goroutine runs
	idle    *time.Timer       // stops the watch once nothing was held for lossWatchLinger
	stop    context.CancelFunc
}

// addToLossWatch adds g to the loss watch, starting it if needed, unless g
// was released or the driver closed meanwhile.
func (d *Driver) addToLossWatch(g *grant) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.wg.Add(1) // before Close's Wait: Close sets closed under d.mu first
	d.mu.Unlock()
	defer d.wg.Done()
	g.mu.Lock()
	released := g.released
	g.mu.Unlock()
	if released {
		return
	}
	w := &d.loss
	w.mu.Lock()
	if w.held == nil {
		w.held = map[string]*grant{}
	}
	w.held[g.key] = g
	if w.idle != nil {
		w.idle.Stop()
		w.idle = nil
	}
	// A watch in place that was reopened after g's key was created would
	// miss a deletion in between: read the key.
	check := w.running && w.from > g.rev+1
	if !w.running {
		ctx, stop := context.WithCancel(d.bg)
		w.running, w.from, w.stop = true, g.rev+1, stop
		d.wg.Add(1)
		go d.runLossWatch(ctx, g.rev+1) // owned by the driver: Close cancels d.bg and waits
	}
	w.mu.Unlock()
	if check {
		d.checkKeys(d.bg, []*grant{g})
	}
}

// removeFromLossWatch takes g out of the loss watch (its Release); the
// watch stops once nothing was held for lossWatchLinger.
func (d *Driver) removeFromLossWatch(g *grant) {
	w := &d.loss
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held[g.key] != g {
		return
	}
	delete(w.held, g.key)
	if len(w.held) == 0 && w.running && w.idle == nil {
		w.idle = time.AfterFunc(lossWatchLinger, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if len(w.held) == 0 && w.running {
				w.stop()
				w.running, w.from, w.idle = false, 0, nil
			}
		})
	}
}

// runLossWatch watches the prefix from revision from until ctx ends,
// reopening the watch after a failure: it then reads every watched key, as
// a deletion between the two watches would not reach the second.
func (d *Driver) runLossWatch(ctx context.Context, from int64) {
	defer d.wg.Done()
	prefix := d.prefix + "/"
	var bo backend.Backoff
	for ctx.Err() == nil {
		wctx := clientv3.WithRequireLeader(ctx)
		next := from
		for resp := range d.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithFilterPut()) {
			if resp.Err() != nil {
				break
			}
			bo.Reset()
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					d.lossSeen(string(ev.Kv.Key), ev.Kv.ModRevision)
				}
			}
			if resp.Header.Revision >= next {
				next = resp.Header.Revision + 1
			}
		}
		if ctx.Err() != nil {
			return
		}
		if backend.Sleep(ctx, bo.Next()) != nil {
			return
		}
		// Reopen from the current revision, after reading every held key.
		w := &d.loss
		w.mu.Lock()
		gs := make([]*grant, 0, len(w.held))
		for _, g := range w.held {
			gs = append(gs, g)
		}
		w.mu.Unlock()
		rev, ok := d.checkKeys(ctx, gs)
		if !ok {
			continue // try again after the next pause
		}
		from = max(next, rev+1)
		w.mu.Lock()
		w.from = from
		w.mu.Unlock()
	}
}

// lossSeen ends the lease whose key was deleted at revision rev, if the
// watch holds one for it created before rev.
func (d *Driver) lossSeen(key string, rev int64) {
	w := &d.loss
	w.mu.Lock()
	g := w.held[key]
	if g == nil || rev <= g.rev {
		w.mu.Unlock()
		return
	}
	delete(w.held, key)
	w.mu.Unlock()
	g.markLost(fmt.Errorf("key %s was deleted (its lease expired or was revoked, or someone deleted it)", key))
}

// checkKeys reads the keys of gs and ends the leases whose key is gone or
// was created again. It returns the revision it read at, and false if a
// read failed.
func (d *Driver) checkKeys(ctx context.Context, gs []*grant) (int64, bool) {
	var rev int64
	ok := true
	for _, g := range gs {
		rctx, cancel := d.reqCtx(ctx)
		resp, err := d.cli.Get(rctx, g.key, clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			ok = false
			continue
		}
		if rev == 0 || resp.Header.Revision < rev {
			rev = resp.Header.Revision
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != g.rev {
			d.lossSeen(g.key, g.rev+1)
		}
	}
	return rev, ok
}
