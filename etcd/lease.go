// The etcd leases the driver grants, reuses, renews and revokes.

package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxIdleLeases caps the released leases kept for reuse per TTL.
const maxIdleLeases = 16

// lease is an etcd lease the driver owns.
//
// A shared lease (shared != nil) carries the keys of every lease the driver
// holds or waits for with one TTL, as a concurrency.Session carries its
// Mutexes' keys: its renewal keeps them all, and a release deletes only the
// holder's key. A lease of its own (shared == nil) serves one grant at a
// time, for the rare acquire of a key the driver already has a key for under
// its shared lease (the same key asked for twice, which must wait like any
// other client); once released cleanly it goes back to the driver's idle
// list for the next such grant.
type lease struct {
	id     clientv3.LeaseID
	ask    int64        // the TTL asked for, in whole seconds
	shared *sharedLease // nil: the lease serves one grant

	mu    sync.Mutex
	ttl   time.Duration // the TTL the server granted (≥ ask: the server has a minimum)
	since time.Time     // when the request that last granted or renewed it was sent
}

// times returns when the lease was last granted or renewed, and its TTL.
func (ls *lease) times() (since time.Time, ttl time.Duration) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.since, ls.ttl
}

// renewed records a grant or renewal sent at start that gave ttl.
func (ls *lease) renewed(start time.Time, ttl time.Duration) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if start.After(ls.since) {
		ls.since, ls.ttl = start, ttl
	}
}

// fresh reports whether the lease has at least two thirds of its TTL left, so
// that a grant that uses it is not due for renewal at once.
func (ls *lease) fresh(now time.Time) bool {
	since, ttl := ls.times()
	return now.Sub(since) < ttl/3
}

// ttlSeconds rounds ttl up to whole seconds, as etcd leases count.
func ttlSeconds(ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("ttl must be > 0, got %v", ttl)
	}
	return int64((ttl + time.Second - 1) / time.Second), nil
}

// ownLease returns an idle lease of its own with the TTL asked for that still
// has most of its TTL, or grants a new one.
func (d *Driver) ownLease(ctx context.Context, ask int64) (*lease, error) {
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

// renewIn is the time until g's lease is due for renewal: a third of its TTL
// after the last renewal was sent.
func (d *Driver) renewIn(g *grant) time.Duration {
	since, ttl := g.ls.times()
	return time.Until(since.Add(ttl / 3))
}

// renewWaiting renews a waiting request's lease.
func (d *Driver) renewWaiting(ctx context.Context, g *grant) error {
	if g.ls.shared != nil {
		err := d.renewShared(ctx, g.ls)
		if errors.Is(err, errLeaseGone) {
			return errWaiterGone
		}
		return err
	}
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
	g.ls.renewed(start, time.Duration(resp.TTL)*time.Second)
	return nil
}
