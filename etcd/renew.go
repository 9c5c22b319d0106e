// Refresh and Release, and the retries of transient errors they share.

package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-go/dlock/backend"
)

// Refresh implements backend.Driver: it renews the grant's lease (keeping its
// granted TTL; ttl is not used) and checks that the holder's key still
// exists, retrying transport failures until ctx is done. A lease or key that
// is gone fails with ErrNotHeld.
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

	begun := time.Now()
	var err error
	if g.ls.shared != nil {
		err = d.retry(ctx, func(ctx context.Context) error { return d.renewShared(ctx, g.ls) })
		if errors.Is(err, errLeaseGone) {
			err = rpctypes.ErrLeaseNotFound
		}
	} else {
		err = d.retry(ctx, func(ctx context.Context) error {
			start := time.Now()
			resp, err := d.cli.KeepAliveOnce(ctx, g.ls.id)
			if err == nil {
				g.ls.renewed(start, time.Duration(resp.TTL)*time.Second)
			}
			return err
		})
	}
	if err != nil {
		if isLeaseNotFound(err) {
			g.markLost(fmt.Errorf("lease %x expired or was revoked", int64(g.ls.id)))
			d.removeFromLossWatch(g)
			return 0, fmt.Errorf("lease %x expired or was revoked: %w", int64(g.ls.id), backend.ErrNotHeld)
		}
		return 0, fmt.Errorf("renew lease %x: %w", int64(g.ls.id), err)
	}
	// A shared lease's renewal may have been sent before this refresh began
	// (by another lease's, less than TTL/renewRecent ago): the validity
	// counts from when it was sent.
	since, ttl := g.ls.times()
	validity := ttl - backend.DriftAllowance(ttl)
	if since.Before(begun) {
		validity -= begun.Sub(since)
	}

	var gone bool
	err = d.retry(ctx, func(ctx context.Context) (err error) {
		gone, err = d.keyChecks.Do(ctx, keyCheck{g.key, g.rev})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("check key %s: %w", g.key, err)
	}
	if gone {
		g.markLost(fmt.Errorf("key %s was deleted", g.key))
		d.removeFromLossWatch(g)
		return 0, fmt.Errorf("key %s was deleted: %w", g.key, backend.ErrNotHeld)
	}
	return validity, nil
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
			// its context's error, which gRPC sends as Unknown (keep-alives
			// during a leader election). Retry it like a timeout.
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

// Release implements backend.Driver: one request deletes the holder's key,
// whose name no other holder has, failing with ErrNotHeld if it was gone; a
// failed delete is tried again in the background.
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
	if g.watch != nil {
		g.watch.Stop()
	}
	g.mu.Unlock()
	d.removeFromLossWatch(g)
	if g.lost.Load() {
		busy = true // the lease may be gone; never reuse it
	}

	// A plain delete, not a transaction conditional on the key's create
	// revision (which costs the server a compare, about 4% of an
	// acquire+release): the key's name ends with the lease's ID, so no other
	// client makes it, and this driver never makes it again until this
	// release has returned (the shared lease records the name until then;
	// a lease of its own is reused only after).
	rctx, cancel := d.reqCtx(ctx)
	resp, err := d.cli.Delete(rctx, g.key)
	cancel()
	if g.ls.shared != nil {
		switch {
		case err != nil:
			// Whether the delete happened is unknown: try again in the
			// background (the shared lease carries other keys; it is not
			// revoked).
			d.deleteLater(g.ls, g.name, g.key, g.rev)
			return fmt.Errorf("release %s: %w", g.key, err)
		case resp.Deleted == 0:
			d.detach(g.ls, g.name)
			return fmt.Errorf("key %s is gone (lease expired or revoked, or key deleted): %w", g.key, backend.ErrNotHeld)
		}
		d.detach(g.ls, g.name)
		return nil
	}
	switch {
	case err != nil:
		// Whether the delete happened is unknown: revoking the lease deletes
		// the key if it is still there.
		d.revoke(g.ls)
		return fmt.Errorf("release %s: %w", g.key, err)
	case resp.Deleted == 0:
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

// keyCheck asks whether the key of a grant (created at rev) still exists.
type keyCheck struct {
	key string
	rev int64
}

// keyCheckGap is the least time between two of the refreshes' shared key
// checks: however many leases renew, at most one such transaction (per
// maxTxnGets keys) per keyCheckGap.
const keyCheckGap = 10 * time.Millisecond

// maxTxnGets is how many keys one shared check reads in one transaction
// (etcd refuses transactions of more than --max-txn-ops operations, 128 by
// default).
const maxTxnGets = 100

// checkKeysBatch reads the keys of cs, maxTxnGets per transaction, and
// reports for each whether it is gone (deleted, or created again).
func (d *Driver) checkKeysBatch(cs []keyCheck) ([]bool, error) {
	gone := make([]bool, len(cs))
	for lo := 0; lo < len(cs); lo += maxTxnGets {
		part := cs[lo:min(lo+maxTxnGets, len(cs))]
		ops := make([]clientv3.Op, len(part))
		for i, c := range part {
			ops[i] = clientv3.OpGet(c.key, clientv3.WithKeysOnly())
		}
		ctx, cancel := d.reqCtx(d.bg)
		resp, err := d.cli.Txn(ctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return nil, err
		}
		for i, c := range part {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			gone[lo+i] = len(kvs) == 0 || kvs[0].CreateRevision != c.rev
		}
	}
	return gone, nil
}

// Relabel implements backend.Relabeler: it writes label as the holder's
// key's value, as concurrency.Election's Proclaim does, if the key is still
// the one this grant made.
func (d *Driver) Relabel(ctx context.Context, bg *backend.Grant, label string) error {
	g, ok := bg.Data.(*grant)
	if !ok {
		return fmt.Errorf("grant of another driver (%T)", bg.Data)
	}
	g.mu.Lock()
	released := g.released
	g.mu.Unlock()
	if released || g.lost.Load() {
		return backend.ErrNotHeld
	}
	var put bool
	err := d.retry(ctx, func(ctx context.Context) error {
		resp, err := d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(g.key), "=", g.rev)).
			Then(clientv3.OpPut(g.key, g.valuePrefix+label, clientv3.WithIgnoreLease())).
			Commit()
		if err == nil {
			put = resp.Succeeded
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("relabel %s: %w", g.key, err)
	}
	if !put {
		return fmt.Errorf("key %s is gone (lease expired or revoked, or key deleted): %w", g.key, backend.ErrNotHeld)
	}
	return nil
}
