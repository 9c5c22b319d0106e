// Acquire: the queue of keys under a lock name, and waiting for one's turn.

package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/dlock-go/dlock/backend"
)

// cancelGrace is how long an acquire request that may create a key is given
// to answer after the caller's ctx ends (see enqueue).
const cancelGrace = time.Second

// errWaiterGone means a waiting Acquire's own key vanished: its lease expired
// or was revoked while it waited, or someone deleted the key.
var errWaiterGone = errors.New("the waiting request's key is gone (its lease expired or was revoked)")

// grant is the driver-private state of a backend.Grant (its Data).
type grant struct {
	key    string // the holder's etcd key: LockName + "/write/" or "/read/" + lease ID in hex
	name   string // LockName + "/": the queue's prefix
	rev    int64  // the key's create revision: the token
	ls     *lease
	shared bool // a shared hold: its key is under name + "read/"

	// valuePrefix goes before the label in the key's value: a permit's
	// "permits=<n> " (semaphore.go), empty for a lock.
	valuePrefix string

	lost   atomic.Bool       // the grant is known lost
	onLost func(cause error) // dlock's AcquireRequest.OnLost

	mu         sync.Mutex  // guards the fields below
	watch      *time.Timer // adds the grant to the loss watch lossWatchDelay after it; nil once it fired
	released   bool
	refreshing int // Refresh calls in flight
}

// markLost records the loss and tells dlock (OnLost, which never blocks),
// once, unless the grant was released meanwhile.
func (g *grant) markLost(cause error) {
	g.mu.Lock()
	released := g.released
	g.mu.Unlock()
	if !released && g.lost.CompareAndSwap(false, true) && g.onLost != nil {
		g.onLost(cause)
	}
}

// reqCtx bounds one request by the driver's request timeout, on the
// client: the request ends when the bound does, but carries no deadline to
// etcd. gRPC sends a context's deadline along (grpc-timeout), and a
// deadline on every request cost 3–5% of an uncontended acquire+release on
// one etcd, where a cancel-only context cost nothing (docs/etcd.md); the
// client's bound ends the request all the same (gRPC resets the stream,
// which cancels the server's handling of it). A ctx that can never end
// shares its bound with other requests (d.bound: the timeout, at most an
// eighth more) instead of arming a timer of its own, and a ctx that ends
// within that anyway (the Locker's release context) is used as it is.
func (d *Driver) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	var rctx context.Context
	var cancel context.CancelFunc
	switch dl, ok := ctx.Deadline(); {
	case ctx.Done() == nil:
		rctx, cancel = d.bound.Context(ctx)
	case ok && time.Until(dl) <= d.timeout+d.timeout/8:
		rctx, cancel = ctx, func() {}
	default:
		rctx, cancel = context.WithTimeout(ctx, d.timeout)
	}
	return noDeadline{rctx}, cancel
}

// noDeadline is its Context without the deadline: it ends when its Context
// does, and reports no deadline (see reqCtx). Its Value, the Context's, lets
// package context find the cancellation a child context must follow, so a
// child of it needs no goroutine to watch it.
type noDeadline struct{ context.Context }

func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// graceCtx bounds a request that may write on behalf of ctx's acquire. It
// is not cancelled the moment ctx ends: its answer tells whether there is a
// key to delete (a put cancelled in flight may still be applied after the
// delete that follows). It is cancelled cancelGrace after ctx ends if it
// has not answered by then, and otherwise bounded as reqCtx bounds a
// request. Call done once the request has returned.
func (d *Driver) graceCtx(ctx context.Context) (rctx context.Context, done func()) {
	if ctx.Done() == nil { // nothing to outlive: the shared bound will do
		return d.reqCtx(ctx)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.timeout)
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(cancelGrace, cancel) })
	return noDeadline{rctx}, func() {
		stop()
		cancel()
	}
}

// Acquire implements backend.Driver: one try is one transaction that creates
// the key only if the lock is free; a waiting Acquire queues its key and
// watches the newest older key it must wait for, riding out members that go
// away until ctx ends. A key left by a failed or cancelled Acquire is deleted.
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	var bo backend.Backoff
	for {
		g, err := d.acquireOnce(ctx, req)
		if err == nil || !req.Wait || ctx.Err() != nil || !transient(err) {
			return g, err
		}
		if err := backend.Sleep(ctx, bo.Next()); err != nil {
			return nil, err
		}
	}
}

// acquireOnce is one attempt of Acquire.
func (d *Driver) acquireOnce(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	name := LockName(d.prefix, req.Key) + "/"
	enqueue := d.enqueue
	if req.Permits > 0 {
		// A permit's keys are named after the acquire (semaphore.go): the
		// shared lease records a name of its own for each.
		enqueue = d.enqueuePermit
		name = fmt.Sprintf("%s#%d", d.semKeys(req.Key, req.Permits).room(), d.permitSeq.Add(1))
	}
	ls, err := d.takeLease(ctx, req.TTL, name)
	if err != nil {
		return nil, err
	}
	g, err := enqueue(ctx, req, name, ls)
	for notFound := 0; err != nil && ctx.Err() == nil; {
		switch {
		case isLeaseNotFound(err) && notFound < 3:
			// The lease expired or was revoked behind our back (an idle one
			// of our own, or the shared lease whose renewals failed): nothing
			// was written. Try again with another.
			notFound++
			d.leaseGone(ls)
		case req.Wait && errors.Is(err, errWaiterGone):
			// The waiting key vanished: its lease expired or was revoked
			// (an old leader resuming from a pause revokes leases it saw
			// expire: etcd issue 15247), or someone deleted it. A waiter
			// holds nothing: queue again, at the back, and keep waiting
			// until ctx ends.
		default:
			return g, err
		}
		if ls, err = d.takeLease(ctx, req.TTL, name); err != nil {
			return nil, err
		}
		g, err = enqueue(ctx, req, name, ls)
	}
	return g, err
}

// enqueue makes one attempt with ls, and waits if req.Wait. Whatever it
// returns other than a grant, it leaves no key behind and ls carries no key
// of name.
func (d *Driver) enqueue(ctx context.Context, req backend.AcquireRequest, name string, ls *lease) (*backend.Grant, error) {
	key := holdKey(name, req.Shared, ls.id)
	put := clientv3.OpPut(key, holderValue(req.Owner, req.Label), clientv3.WithLease(ls.id))
	// The request that may create the key outlives ctx by up to cancelGrace
	// (graceCtx).
	rctx, done := d.graceCtx(ctx)
	var resp *clientv3.TxnResponse
	var err error
	switch {
	case !req.Wait:
		resp, err = d.cli.Txn(rctx).If(freeFor(name, req.Shared)...).Then(put).Commit()
	case req.Shared:
		// The put runs first, so the newest key of each range that a shared
		// request waits for is older than ours.
		ops := append([]clientv3.Op{put}, blockers(name, req.Shared, 0)...)
		resp, err = d.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(ops...).
			Commit()
	default:
		// The put runs first, so the newest two keys are ours and our
		// predecessor's (if any).
		resp, err = d.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(put, clientv3.OpGet(name, clientv3.WithPrefix(),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2))).
			Commit()
	}
	done()
	if err != nil {
		if isLeaseNotFound(err) {
			d.detach(ls, name)
			return nil, err // nothing was written
		}
		// The key may have been created, or may yet be: delete it (revoke a
		// lease of its own). A shared lease takes no new key from now on,
		// and is revoked once its other keys are released, in case the put
		// lands after the delete.
		d.retire(ls)
		d.unkey(ls, name, key, 0)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("acquire %s: %w", name, err)
	}
	if ctx.Err() != nil {
		// The caller gave up while the request was on its way: give back
		// what it took.
		if resp.Succeeded {
			d.unkey(ls, name, key, resp.Header.Revision)
		} else {
			if ls.shared == nil {
				d.putLease(ls)
			}
			d.detach(ls, name)
		}
		return nil, ctx.Err()
	}
	if !resp.Succeeded {
		if !req.Wait {
			if ls.shared == nil {
				d.putLease(ls)
			}
			d.detach(ls, name)
			return nil, backend.ErrHeld
		}
		if ls.shared == nil {
			d.revoke(ls)
		}
		// A key of the shared lease under name, which the driver did not
		// record: leave it to its owner.
		d.detach(ls, name)
		return nil, fmt.Errorf("acquire %s: key %s already exists", name, key)
	}
	g := &grant{key: key, name: name, rev: resp.Header.Revision, ls: ls, shared: req.Shared}
	if req.Wait {
		var pred *mvccpb.KeyValue // the newest key g waits for
		if req.Shared {
			pred = newest(resp.Responses[1:])
		} else {
			kvs := resp.Responses[1].GetResponseRange().Kvs
			if len(kvs) == 0 || kvs[0].CreateRevision != g.rev {
				d.unkey(ls, name, key, g.rev)
				return nil, fmt.Errorf("acquire %s: our key is not the newest in the queue", name)
			}
			if len(kvs) == 2 {
				pred = kvs[1]
			}
		}
		if pred != nil {
			if err := d.waitTurn(ctx, g, string(pred.Key), pred.CreateRevision, resp.Header.Revision); err != nil {
				// Leave no key behind, whether queued or granted meanwhile.
				d.unkey(ls, name, key, g.rev)
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, fmt.Errorf("acquire %s: %w", name, err)
			}
		}
	}
	return d.granted(req, g)
}

// granted schedules the loss watcher of g and returns the backend grant.
func (d *Driver) granted(req backend.AcquireRequest, g *grant) (*backend.Grant, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		d.unkey(g.ls, g.name, g.key, g.rev)
		return nil, errClosed
	}
	// Start is now: a waiter became the holder when its predecessor's key
	// was deleted, after its lease's last renewal, and the lease's start is
	// not when the lock became this owner's. The validity is what is left of
	// the lease's, so the deadline is the lease's all the same.
	since, ttl := g.ls.times()
	now := time.Now()
	validity := ttl - backend.DriftAllowance(ttl) - now.Sub(since)
	if validity <= 0 {
		d.unkey(g.ls, g.name, g.key, g.rev)
		return nil, fmt.Errorf("acquire %s: the request's lease (renewed %v ago, TTL %v) ran out while it waited", g.name, now.Sub(since).Round(time.Millisecond), ttl)
	}
	// A timer, not a goroutine: a lease released within lossWatchDelay is
	// never watched.
	g.onLost = req.OnLost
	g.mu.Lock()
	g.watch = time.AfterFunc(lossWatchDelay, func() {
		g.mu.Lock()
		g.watch = nil // a held lease keeps no timer
		g.mu.Unlock()
		d.addToLossWatch(g)
	})
	g.mu.Unlock()
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    uint64(g.rev),
		Start:    now,
		Validity: validity,
		Data:     g,
	}, nil
}

// waitTurn waits until no key that g must wait for is left under its lock
// name (every older key; for a shared g, every older key not under read/),
// starting
// with pred (create revision predRev), which existed at revision seen.
func (d *Driver) waitTurn(ctx context.Context, g *grant, pred string, predRev, seen int64) error {
	var bo backend.Backoff
	for {
		if pred != "" {
			err := d.awaitDelete(ctx, g, pred, predRev, seen)
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case errors.Is(err, errWaiterGone):
				return err
			case err != nil:
				// A watch cancelled (no leader, compaction) or a failed
				// renewal: look again after a pause.
				if err := backend.Sleep(ctx, bo.Next()); err != nil {
					return err
				}
			}
		}
		if d.renewIn(g) <= 0 {
			if err := d.renewWaiting(ctx, g); errors.Is(err, errWaiterGone) {
				return err
			}
		}
		rctx, cancel := d.reqCtx(ctx)
		ops := append([]clientv3.Op{clientv3.OpGet(g.key, clientv3.WithKeysOnly())}, blockers(g.name, g.shared, g.rev)...)
		resp, err := d.cli.Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			pred = ""
			if err := backend.Sleep(ctx, bo.Next()); err != nil {
				return err
			}
			continue
		}
		if mine := resp.Responses[0].GetResponseRange().Kvs; len(mine) == 0 || mine[0].CreateRevision != g.rev {
			return errWaiterGone
		}
		older := newest(resp.Responses[1:])
		if older == nil {
			return nil
		}
		pred, predRev, seen = string(older.Key), older.CreateRevision, resp.Header.Revision
		bo.Reset()
	}
}

// awaitDelete returns nil once key (create revision rev), which existed at
// revision seen, is deleted. While it waits it renews renew's lease, if renew
// is not nil. An empty key returns nil at once.
func (d *Driver) awaitDelete(ctx context.Context, renew *grant, key string, rev, seen int64) error {
	if key == "" {
		return nil
	}
	return d.awaitDeletion(ctx, renew, key, "", seen, func(ctx context.Context) (bool, error) {
		return d.deleted(ctx, key, rev)
	})
}

// awaitDeletion returns nil once a key is deleted from key (or from the
// range [key, end) if end is not empty), whose keys the caller read at
// revision seen. While it waits it renews renew's lease, if renew is not nil.
// gone reads the keys again and reports whether one the caller saw is gone.
//
// The watch starts at the server's current revision, so that etcd serves it
// from its synced watcher group (a watch from a past revision waits for a
// catch-up loop that runs every 100ms). If the server's revision has moved
// past seen by the time the watch is in place, gone reads the keys again: a
// deletion in between would not reach the watch.
//
// On etcd servers before 3.5, a waiter (renew != nil) also opens a second
// watch, on its own gRPC stream, once the first is in place. Those servers
// turn "from the current revision" into "from the revision before the
// request" and register the watch a moment later; when a write lands in
// between, which under heavy write load happens to about 2% of watches, the
// watch is served by the 100ms catch-up loop after all. The second watch,
// registered a round trip later, makes a hand-off that waits for that loop a
// rare event (both must be hit). The first watch alone guarantees that no
// deletion is missed.
func (d *Driver) awaitDeletion(ctx context.Context, renew *grant, key, end string, seen int64, gone func(context.Context) (bool, error)) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if renew != nil {
		// Waiters' watches: ask the member to cancel them when it loses the
		// leader, so a partitioned member cannot stall a waiter silently. (It
		// also keeps them on a gRPC stream apart from loss watches.)
		wctx = clientv3.WithRequireLeader(wctx)
	}
	opts := []clientv3.OpOption{clientv3.WithCreatedNotify(), clientv3.WithFilterPut()}
	if end != "" {
		opts = append(opts, clientv3.WithRange(end))
	}
	wch := d.cli.Watch(wctx, key, opts...)
	var second clientv3.WatchChan // nil until the first watch is in place

	var timer *time.Timer
	var timerC <-chan time.Time
	if renew != nil {
		timer = time.NewTimer(d.renewIn(renew))
		defer timer.Stop()
		timerC = timer.C
	}
	for {
		var wr clientv3.WatchResponse
		var ok, first bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timerC:
			if err := d.renewWaiting(ctx, renew); err != nil {
				return err
			}
			timer.Reset(d.renewIn(renew))
			continue
		case wr, ok = <-wch:
			first = true
		case wr, ok = <-second:
		}
		if !ok {
			if !first {
				second = nil // the first watch still stands
				continue
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errors.New("watch closed")
		}
		if err := wr.Err(); err != nil || wr.Canceled {
			if !first {
				second = nil
				continue
			}
			if err == nil {
				err = errors.New("cancelled by the server")
			}
			return fmt.Errorf("watch %s: %w", key, err)
		}
		if wr.Created {
			if !first {
				continue
			}
			if wr.Header.Revision > seen {
				if g, err := gone(ctx); err != nil || g {
					return err
				}
			}
			if renew != nil && d.legacyWatch() {
				second = d.cli.Watch(metadata.AppendToOutgoingContext(wctx, "dlock-watch", "second"), key, opts...)
			}
			continue
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
}

// deleted reads key and reports whether its incarnation of create revision
// rev is gone.
func (d *Driver) deleted(ctx context.Context, key string, rev int64) (bool, error) {
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	resp, err := d.cli.Get(rctx, key, clientv3.WithKeysOnly())
	if err != nil {
		return false, err
	}
	return len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev, nil
}
