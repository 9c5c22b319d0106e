package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/dlock-go/dlock/backend"
)

// Values of Driver.watchGen.
const (
	watchUnknown   = iota
	watchDetecting // asking the members for their versions
	watchLegacy    // some member runs etcd < 3.5, or did not answer: waiters open a second watch
	watchModern    // every member runs etcd 3.5 or later
)

const (
	// lossWatchDelay is how long after a grant the driver starts watching the
	// holder's key for a loss. A lease released sooner costs no watch; a loss
	// in that time is found when the watch starts (it checks the key).
	lossWatchDelay = 20 * time.Millisecond

	// maxIdleLeases caps the released leases kept for reuse per TTL.
	maxIdleLeases = 16
)

// errWaiterGone means a waiting Acquire's own key vanished: its lease expired
// or was revoked while it waited, or someone deleted the key.
var errWaiterGone = errors.New("the waiting request's key is gone (its lease expired or was revoked)")

// lease is an etcd lease the driver owns. One grant uses it at a time; once
// released cleanly it goes back to the driver's idle list for the next grant
// with the same TTL, which saves a grant and a revoke per lock.
type lease struct {
	id    clientv3.LeaseID
	ask   int64         // the TTL asked for, in whole seconds (the idle list's key)
	ttl   time.Duration // the TTL the server granted (≥ ask: the server has a minimum)
	since time.Time     // when the request that last granted or renewed it was sent
}

// fresh reports whether the lease has at least two thirds of its TTL left, so
// that a grant that uses it is not due for renewal at once.
func (ls *lease) fresh(now time.Time) bool { return now.Sub(ls.since) < ls.ttl/3 }

// grant is the driver-private state of a backend.Grant (its Data).
type grant struct {
	key  string // the holder's etcd key: LockName + "/" + lease ID in hex
	name string // LockName + "/": the queue's prefix
	rev  int64  // the key's create revision: the token
	ls   *lease

	lost     chan struct{}
	lostOnce sync.Once
	watch    *time.Timer // starts the loss watcher lossWatchDelay after the grant

	mu         sync.Mutex // guards ls.since and the fields below
	released   bool
	refreshing int                // Refresh calls in flight
	stopWatch  context.CancelFunc // ends the loss watcher, once started
}

// markLost closes lost, unless the grant was released meanwhile.
func (g *grant) markLost() {
	g.mu.Lock()
	released := g.released
	g.mu.Unlock()
	if !released {
		g.lostOnce.Do(func() { close(g.lost) })
	}
}

// reqCtx bounds one request by the driver's request timeout.
func (d *Driver) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.timeout)
}

// ttlSeconds rounds ttl up to whole seconds, as etcd leases count.
func ttlSeconds(ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("ttl must be > 0, got %v", ttl)
	}
	return int64((ttl + time.Second - 1) / time.Second), nil
}

// takeLease returns an idle lease with the TTL asked for that still has most
// of its TTL, or grants a new one.
func (d *Driver) takeLease(ctx context.Context, ttl time.Duration) (*lease, error) {
	ask, err := ttlSeconds(ttl)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, errClosed
	}
	var stale []*lease
	var got *lease
	for ls := d.idle[ask]; len(ls) > 0 && got == nil; ls = d.idle[ask] {
		last := ls[len(ls)-1]
		d.idle[ask] = ls[:len(ls)-1]
		if last.fresh(now) {
			got = last
		} else {
			stale = append(stale, last)
		}
	}
	d.mu.Unlock()
	for _, ls := range stale {
		d.revokeLater(ls)
	}
	if got != nil {
		return got, nil
	}
	return d.grantLease(ctx, ask)
}

func (d *Driver) grantLease(ctx context.Context, ask int64) (*lease, error) {
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := d.cli.Grant(rctx, ask)
	if err != nil {
		return nil, fmt.Errorf("grant lease of %ds: %w", ask, err)
	}
	if resp.TTL <= 0 {
		return nil, fmt.Errorf("grant lease of %ds: server granted %ds", ask, resp.TTL)
	}
	return &lease{id: resp.ID, ask: ask, ttl: time.Duration(resp.TTL) * time.Second, since: start}, nil
}

// putLease keeps a lease no key is attached to any more for reuse, or revokes it.
func (d *Driver) putLease(ls *lease) {
	d.mu.Lock()
	if !d.closed && ls.fresh(time.Now()) && len(d.idle[ls.ask]) < maxIdleLeases {
		d.idle[ls.ask] = append(d.idle[ls.ask], ls)
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	d.revokeLater(ls)
}

// revoke revokes a lease now, on a context detached from the caller's and
// bounded by the request timeout. Revoking deletes every key attached to the
// lease: only ever the driver's own key. If it fails, the lease expires after
// its TTL (nobody renews it).
func (d *Driver) revoke(ls *lease) {
	ctx, cancel := d.reqCtx(context.Background())
	defer cancel()
	_, _ = d.cli.Revoke(ctx, ls.id)
}

// revokeLater revokes a lease in the background, for leases no key is
// attached to any more (or whose key is already gone).
func (d *Driver) revokeLater(ls *lease) {
	d.mu.Lock()
	if d.closed {
		// Close may be waiting for the driver's goroutines already.
		d.mu.Unlock()
		d.revoke(ls)
		return
	}
	d.wg.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.wg.Done()
		d.revoke(ls)
	}()
}

// isLeaseNotFound reports whether err says the lease does not exist.
func isLeaseNotFound(err error) bool {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound) {
		return true
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.NotFound
}

// Acquire implements backend.Driver.
//
// TryAcquire (req.Wait false) is one transaction that creates the holder's
// key only if no key exists under the lock's name: a held lock leaves nothing
// behind. Acquire creates the key unconditionally (joining the queue) and, if
// an older key exists, watches the next older one until it is deleted, renewing
// its own lease meanwhile. If ctx ends, or anything fails after the key may
// have been created, the key's lease is revoked, which deletes the key.
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	ls, err := d.takeLease(ctx, req.TTL)
	if err != nil {
		return nil, err
	}
	g, err := d.enqueue(ctx, req, ls)
	if err != nil && isLeaseNotFound(err) {
		// An idle lease expired or was revoked behind our back: it has no key.
		// Try once more with a new one.
		if ls, err = d.grantLease(ctx, ls.ask); err != nil {
			return nil, err
		}
		g, err = d.enqueue(ctx, req, ls)
	}
	for req.Wait && errors.Is(err, errWaiterGone) && ctx.Err() == nil {
		// The waiting key's lease was revoked or expired behind its back
		// (an old leader resuming from a pause revokes leases it saw
		// expire: etcd issue 15247). A waiter holds nothing: queue again,
		// at the back, with a new lease, and keep waiting until ctx ends.
		if ls, err = d.grantLease(ctx, ls.ask); err != nil {
			return nil, err
		}
		g, err = d.enqueue(ctx, req, ls)
	}
	return g, err
}

// enqueue makes one attempt with ls, and waits if req.Wait.
func (d *Driver) enqueue(ctx context.Context, req backend.AcquireRequest, ls *lease) (*backend.Grant, error) {
	name := LockName(d.prefix, req.Key) + "/"
	key := name + strconv.FormatInt(int64(ls.id), 16)
	put := clientv3.OpPut(key, req.Owner, clientv3.WithLease(ls.id))
	rctx, cancel := d.reqCtx(ctx)
	var resp *clientv3.TxnResponse
	var err error
	if !req.Wait {
		resp, err = d.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(name), "=", 0).WithPrefix()).
			Then(put).
			Commit()
	} else {
		// The put runs first, so the newest two keys are ours and our
		// predecessor's (if any).
		resp, err = d.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(put, clientv3.OpGet(name, clientv3.WithPrefix(),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2))).
			Commit()
	}
	cancel()
	if err != nil {
		if isLeaseNotFound(err) {
			return nil, err // nothing was written
		}
		// The key may have been created: revoking the lease deletes it.
		d.revoke(ls)
		return nil, fmt.Errorf("acquire %s: %w", name, err)
	}
	if !resp.Succeeded {
		if !req.Wait {
			d.putLease(ls)
			return nil, backend.ErrHeld
		}
		d.revoke(ls)
		return nil, fmt.Errorf("acquire %s: key %s already exists", name, key)
	}
	g := &grant{key: key, name: name, rev: resp.Header.Revision, ls: ls, lost: make(chan struct{})}
	if req.Wait {
		kvs := resp.Responses[1].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != g.rev {
			d.revoke(ls)
			return nil, fmt.Errorf("acquire %s: our key is not the newest in the queue", name)
		}
		if len(kvs) == 2 {
			pred := kvs[1]
			if err := d.waitTurn(ctx, g, string(pred.Key), pred.CreateRevision, resp.Header.Revision); err != nil {
				// Leave no key behind, whether queued or granted meanwhile.
				d.revoke(ls)
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
		d.revoke(g.ls)
		return nil, errClosed
	}
	// A timer, not a goroutine: a lease released within lossWatchDelay costs
	// neither a goroutine nor a watch.
	g.watch = time.AfterFunc(lossWatchDelay, func() { d.startLossWatch(g) })

	g.mu.Lock()
	since, ttl := g.ls.since, g.ls.ttl
	g.mu.Unlock()
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    uint64(g.rev),
		Start:    since,
		Validity: ttl - backend.DriftAllowance(ttl),
		Lost:     g.lost,
		Data:     g,
	}, nil
}

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

// waitTurn waits until g's key is the oldest under its lock name, starting
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
		resp, err := d.cli.Txn(rctx).Then(
			clientv3.OpGet(g.name, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(g.rev-1))...),
			clientv3.OpGet(g.key, clientv3.WithKeysOnly()),
		).Commit()
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
		if mine := resp.Responses[1].GetResponseRange().Kvs; len(mine) == 0 || mine[0].CreateRevision != g.rev {
			return errWaiterGone
		}
		older := resp.Responses[0].GetResponseRange().Kvs
		if len(older) == 0 {
			return nil
		}
		pred, predRev, seen = string(older[0].Key), older[0].CreateRevision, resp.Header.Revision
		bo.Reset()
	}
}

// awaitDelete returns nil once key (create revision rev), which existed at
// revision seen, is deleted. While it waits it renews renew's lease, if renew
// is not nil. An empty key returns nil at once.
//
// The watch starts at the server's current revision, so that etcd serves it
// from its synced watcher group (a watch from a past revision waits for a
// catch-up loop that runs every 100ms). If the server's revision has moved
// past seen by the time the watch is in place, the key is read again: a
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
func (d *Driver) awaitDelete(ctx context.Context, renew *grant, key string, rev, seen int64) error {
	if key == "" {
		return nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if renew != nil {
		// Waiters' watches: ask the member to cancel them when it loses the
		// leader, so a partitioned member cannot stall a waiter silently. (It
		// also keeps them on a gRPC stream apart from loss watches.)
		wctx = clientv3.WithRequireLeader(wctx)
	}
	opts := []clientv3.OpOption{clientv3.WithCreatedNotify(), clientv3.WithFilterPut()}
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
				gone, err := d.deleted(ctx, key, rev)
				if err != nil || gone {
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

// legacyWatch reports whether a member of the cluster may run etcd before
// 3.5 (see awaitDelete). The first call starts asking every endpoint in the
// background; until every one has answered 3.5 or later, the answer is yes.
func (d *Driver) legacyWatch() bool {
	switch d.watchGen.Load() {
	case watchModern:
		return false
	case watchUnknown:
		if d.watchGen.CompareAndSwap(watchUnknown, watchDetecting) {
			d.mu.Lock()
			if d.closed {
				d.mu.Unlock()
				return true
			}
			d.wg.Add(1)
			d.mu.Unlock()
			go d.detectVersion()
		}
	}
	return true
}

// detectVersion sets watchGen from the versions the endpoints report.
func (d *Driver) detectVersion() {
	defer d.wg.Done()
	eps := d.cli.Endpoints()
	old := make([]bool, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			ctx, cancel := d.reqCtx(d.bg)
			defer cancel()
			st, err := d.cli.Status(ctx, ep)
			old[i] = err != nil || versionBefore(st.Version, 3, 5)
		})
	}
	wg.Wait()
	if slices.Contains(old, true) {
		d.watchGen.Store(watchLegacy)
	} else {
		d.watchGen.Store(watchModern)
	}
}

// versionBefore reports whether the version v ("3.4.23") is before
// major.minor, or does not parse.
func versionBefore(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return true
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return true
	}
	return ma < major || ma == major && mi < minor
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

// renewIn is the time until g's lease is due for renewal: a third of its TTL
// after the last renewal was sent.
func (d *Driver) renewIn(g *grant) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return time.Until(g.ls.since.Add(g.ls.ttl / 3))
}

// renewWaiting renews a waiting request's lease.
func (d *Driver) renewWaiting(ctx context.Context, g *grant) error {
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := d.cli.KeepAliveOnce(rctx, g.ls.id)
	if err != nil {
		if isLeaseNotFound(err) {
			return errWaiterGone
		}
		return fmt.Errorf("renew lease %x: %w", int64(g.ls.id), err)
	}
	g.mu.Lock()
	g.ls.since, g.ls.ttl = start, time.Duration(resp.TTL)*time.Second
	g.mu.Unlock()
	return nil
}

// watchLoss closes g.lost when g's key is deleted by anyone but g's Release.
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
			g.markLost()
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
			g.markLost()
			return
		}
		seen = resp.Header.Revision
	}
}

// Refresh implements backend.Driver: it renews the grant's lease with one
// keep-alive request and then checks that the holder's key still exists with
// its create revision. The lease keeps the TTL it was granted with; ttl is not
// used. Transport failures and timeouts (a member down, a leader election) are
// retried, on whichever member answers, until ctx is done; dlock bounds ctx by
// the lease's deadline. A lease or key that is gone returns ErrNotHeld.
func (d *Driver) Refresh(ctx context.Context, bg *backend.Grant, _ time.Duration) (time.Duration, error) {
	g, ok := bg.Data.(*grant)
	if !ok {
		return 0, fmt.Errorf("grant of another driver (%T)", bg.Data)
	}
	g.mu.Lock()
	if g.released {
		g.mu.Unlock()
		return 0, backend.ErrNotHeld
	}
	g.refreshing++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.refreshing--
		g.mu.Unlock()
	}()

	var start time.Time
	var resp *clientv3.LeaseKeepAliveResponse
	err := d.retry(ctx, func(ctx context.Context) (err error) {
		start = time.Now()
		resp, err = d.cli.KeepAliveOnce(ctx, g.ls.id)
		return err
	})
	if err != nil {
		if isLeaseNotFound(err) {
			g.markLost()
			return 0, fmt.Errorf("lease %x expired or was revoked: %w", int64(g.ls.id), backend.ErrNotHeld)
		}
		return 0, fmt.Errorf("renew lease %x: %w", int64(g.ls.id), err)
	}
	ttl := time.Duration(resp.TTL) * time.Second
	g.mu.Lock()
	g.ls.since, g.ls.ttl = start, ttl
	g.mu.Unlock()

	var gone bool
	err = d.retry(ctx, func(ctx context.Context) (err error) {
		gone, err = d.deleted(ctx, g.key, g.rev)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("check key %s: %w", g.key, err)
	}
	if gone {
		g.markLost()
		return 0, fmt.Errorf("key %s was deleted: %w", g.key, backend.ErrNotHeld)
	}
	return ttl - backend.DriftAllowance(ttl), nil
}

// retry calls f until it succeeds, fails with an error that is not a
// transport failure, or ctx is done. Each attempt is bounded by a share of
// the time ctx has left (at most the request timeout), so an attempt stuck on
// a paused or partitioned member leaves time for another.
func (d *Driver) retry(ctx context.Context, f func(context.Context) error) error {
	var bo backend.Backoff
	for {
		limit := d.timeout
		if dl, ok := ctx.Deadline(); ok {
			limit = min(limit, max(time.Until(dl)/3, 200*time.Millisecond))
		}
		actx, cancel := context.WithTimeout(ctx, limit)
		err := f(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !transient(err) {
			if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
				err = fmt.Errorf("%w (%w)", ctx.Err(), err)
			}
			return err
		}
		if err := backend.Sleep(ctx, bo.Next()); err != nil {
			return err
		}
	}
}

// transient reports whether err is worth another attempt: a timeout of the
// attempt, or a member that is unreachable or has no leader.
func transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Internal:
			return true
		case codes.Unknown:
			// A member that cannot finish a request in time answers with
			// its context's error, which gRPC sends as Unknown: seen on
			// keep-alives during a leader election. Retry it like a timeout.
			return s.Message() == context.DeadlineExceeded.Error()
		}
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		switch ee.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return true
		}
	}
	return false
}

// Release implements backend.Driver: one transaction deletes the holder's
// key if its create revision is still the grant's, so it can never delete a
// newer holder's key; otherwise it returns ErrNotHeld. The lease is then kept
// for reuse, or revoked if the release failed or the key was gone.
func (d *Driver) Release(ctx context.Context, bg *backend.Grant) error {
	g, ok := bg.Data.(*grant)
	if !ok {
		return fmt.Errorf("grant of another driver (%T)", bg.Data)
	}
	g.mu.Lock()
	if g.released {
		g.mu.Unlock()
		return backend.ErrNotHeld
	}
	g.released = true
	busy := g.refreshing > 0
	stopWatch := g.stopWatch
	g.mu.Unlock()
	g.watch.Stop()
	if stopWatch != nil {
		stopWatch()
	}
	select {
	case <-g.lost:
		busy = true // the lease may be gone; never reuse it
	default:
	}

	rctx, cancel := d.reqCtx(ctx)
	resp, err := d.cli.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(g.key), "=", g.rev)).
		Then(clientv3.OpDelete(g.key)).
		Commit()
	cancel()
	switch {
	case err != nil:
		// Whether the delete happened is unknown: revoking the lease deletes
		// the key if it is still there.
		d.revoke(g.ls)
		return fmt.Errorf("release %s: %w", g.key, err)
	case !resp.Succeeded:
		d.revokeLater(g.ls)
		return fmt.Errorf("key %s is gone (lease expired or revoked, or key deleted): %w", g.key, backend.ErrNotHeld)
	case busy:
		// A refresh in flight could renew the lease after another grant took it.
		d.revokeLater(g.ls)
	default:
		d.putLease(g.ls)
	}
	return nil
}
