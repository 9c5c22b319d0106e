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

// Test hooks, nil outside tests; each is called with the driver concerned.
var (
	hookLossWatchOpened    func(d *Driver, stop context.CancelFunc) // a watch stream opened; stop ends it
	hookLossWatchReopening func(d *Driver)                          // a reopen took its first snapshot of the held leases
	hookLossWatchAdding    func(d *Driver, g *grant)                // addToLossWatch is about to add g
)

// lossWatch is the driver's one watch of its lock prefix, for deletions only
// (WithFilterPut): a held key deleted by anyone but the holder's Release
// (the lease expired or was revoked, someone deleted it) ends the lease. It
// runs while the driver holds leases, in one goroutine however many.
//
// A lease joins held lossWatchDelay after its grant. A deletion of its key
// before that is either in dropped or at or below floor (forgotten, or
// before the watch started or reopened), and a lease created below floor
// has its key read as it joins (docs/etcd.md).
type lossWatch struct {
	mu        sync.Mutex
	held      map[string]*grant // by key, the leases being watched
	dropped   map[string]int64  // by key, the last deletion reported while no lease in held had the key: its revision
	drops     []keyRev          // dropped in the order reported, to forget the oldest past maxDrops
	floor     int64             // a deletion at or below this revision may be neither reported nor in dropped
	reopening bool              // the watch is being reopened: the reopen reads the key of every lease added meanwhile
	gen       uint64            // changes as the goroutine starts or is stopped: only the running one's updates the state
	running   bool              // the goroutine runs
	idle      *time.Timer       // stops the watch once nothing was held for lossWatchLinger
	stop      context.CancelFunc
}

// keyRev is a deletion the loss watch reported with no lease for it.
type keyRev struct {
	key string
	rev int64
}

// maxDrops is how many deletions reported with no lease for them the loss
// watch remembers (lossWatch.dropped).
const maxDrops = 1024

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
	if hookLossWatchAdding != nil {
		hookLossWatchAdding(d, g)
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
	// The watch may have reported a deletion of g's key before g joined, or
	// not at all (below floor): then read the key (a reopen under way reads
	// it itself).
	lost, check := false, false
	switch {
	case !w.running:
		ctx, stop := context.WithCancel(d.bg)
		w.gen++
		w.running, w.floor, w.reopening, w.stop = true, g.rev, false, stop
		w.dropped, w.drops = map[string]int64{}, nil
		d.wg.Add(1)
		go d.runLossWatch(ctx, w.gen, g.rev+1) // owned by the driver: Close cancels d.bg and waits
	case w.dropped[g.key] > g.rev:
		delete(w.held, g.key)
		lost = true
	case w.reopening:
	case g.rev < w.floor:
		check = true
	}
	w.mu.Unlock()
	switch {
	case lost:
		g.markLost(deletedError(g.key))
	case check:
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
				w.gen++
				w.running, w.floor, w.reopening, w.idle = false, 0, false, nil
				w.dropped, w.drops = nil, nil
			}
		})
	}
}

// runLossWatch, the goroutine of generation gen, watches the prefix from
// revision from until ctx ends, reopening the watch after a failure (see
// reopenLossWatch).
func (d *Driver) runLossWatch(ctx context.Context, gen uint64, from int64) {
	defer d.wg.Done()
	prefix := d.prefix + "/"
	var bo backend.Backoff
	for ctx.Err() == nil {
		wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
		next := from
		wch := d.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithFilterPut())
		if hookLossWatchOpened != nil {
			hookLossWatchOpened(d, stop)
		}
		for resp := range wch {
			if resp.Err() != nil {
				break
			}
			bo.Reset()
			next = max(next, resp.Header.Revision+1)
			d.lossEvents(gen, resp.Events)
		}
		stop()
		if ctx.Err() != nil {
			return
		}
		var ok bool
		if from, ok = d.reopenLossWatch(ctx, gen, next, &bo); !ok {
			return
		}
	}
}

// lossEvents ends the leases whose keys events deleted; the watch of
// generation gen records the deletions of keys with no lease in held.
func (d *Driver) lossEvents(gen uint64, events []*clientv3.Event) {
	w := &d.loss
	var lost []*grant
	w.mu.Lock()
	for _, ev := range events {
		if ev.Type != mvccpb.DELETE {
			continue
		}
		key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
		switch g := w.held[key]; {
		case g != nil && rev > g.rev:
			delete(w.held, key)
			lost = append(lost, g)
		case g == nil && w.gen == gen:
			w.dropped[key] = max(w.dropped[key], rev)
			w.drops = append(w.drops, keyRev{key, rev})
		}
	}
	if w.gen == gen {
		for len(w.drops) > maxDrops {
			old := w.drops[0]
			w.drops = w.drops[1:]
			w.floor = max(w.floor, old.rev)
			if w.dropped[old.key] == old.rev {
				delete(w.dropped, old.key)
			}
		}
	}
	w.mu.Unlock()
	for _, g := range lost {
		g.markLost(deletedError(g.key))
	}
}

// reopenLossWatch, after the watch of generation gen ended having reported
// every deletion before revision next, pauses and then reads the key of
// every held lease, again and again until no lease was added since its
// last reads (a lease added meanwhile is not read by addToLossWatch), and
// after a pause all over if a read fails. It returns the revision to reopen
// the watch from, at most one past every read's, or false once ctx ends.
func (d *Driver) reopenLossWatch(ctx context.Context, gen uint64, next int64, bo *backend.Backoff) (int64, bool) {
	w := &d.loss
	w.mu.Lock()
	if w.gen == gen {
		w.reopening = true
	}
	w.mu.Unlock()
	first := true
	for {
		if backend.Sleep(ctx, bo.Next()) != nil {
			return 0, false
		}
		read := map[*grant]bool{}
		var rev int64 // the least revision read at; 0: none
		for {
			w.mu.Lock()
			var gs []*grant
			for _, g := range w.held {
				if !read[g] {
					gs = append(gs, g)
				}
			}
			if len(gs) == 0 {
				from := max(next, rev+1)
				if w.gen == gen {
					w.floor, w.reopening = max(w.floor, from-1), false
				}
				w.mu.Unlock()
				return from, true
			}
			w.mu.Unlock()
			if first && hookLossWatchReopening != nil {
				hookLossWatchReopening(d)
			}
			first = false
			r, ok := d.checkKeys(ctx, gs)
			if !ok {
				break // pause, then read them all again
			}
			if rev == 0 || r < rev {
				rev = r
			}
			for _, g := range gs {
				read[g] = true
			}
		}
	}
}

// deletedError is the loss of a lease whose key was deleted.
func deletedError(key string) error {
	return fmt.Errorf("key %s was deleted (its lease expired or was revoked, or someone deleted it)", key)
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
	g.markLost(deletedError(key))
}

// checkKeys reads the keys of gs, maxTxnGets per transaction, and ends the
// leases whose key is gone or was created again. It returns the least
// revision it read at, and false if a read failed.
func (d *Driver) checkKeys(ctx context.Context, gs []*grant) (int64, bool) {
	var rev int64
	ok := true
	for lo := 0; lo < len(gs); lo += maxTxnGets {
		part := gs[lo:min(lo+maxTxnGets, len(gs))]
		ops := make([]clientv3.Op, len(part))
		for i, g := range part {
			ops[i] = clientv3.OpGet(g.key, clientv3.WithKeysOnly())
		}
		rctx, cancel := d.reqCtx(ctx)
		resp, err := d.cli.Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			ok = false
			continue
		}
		if rev == 0 || resp.Header.Revision < rev {
			rev = resp.Header.Revision
		}
		for i, g := range part {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) == 0 || kvs[0].CreateRevision != g.rev {
				d.lossSeen(g.key, g.rev+1)
			}
		}
	}
	return rev, ok
}
