// The shared lease: one etcd lease per TTL carries the keys of every lease
// the driver holds or waits for, as a concurrency.Session carries its
// Mutexes' keys.

package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/batch"
)

// errLeaseGone means the server no longer has a shared lease: it expired or
// was revoked, and every key attached to it is gone.
var errLeaseGone = errors.New("lease expired or was revoked")

// sharedLease is the part of a lease that only a shared lease has.
type sharedLease struct {
	renew *batch.Group // one KeepAliveOnce for the renewals that come at once

	// Guarded by the driver's mu.
	names   map[string]struct{} // lock names with a key of this lease (or one being made or deleted)
	retired bool                // no new key may join it (gone, or out of date)
	gone    bool                // the server said it has no such lease
}

// renewRecent is the share of a shared lease's TTL within which a renewal
// sent for one lease counts for all: a lease refreshed less than TTL/6 after
// the shared lease was renewed is not renewed again (its validity counts from
// that renewal). With dlock renewing each lease every TTL/3, the shared lease
// is renewed about six times per TTL, however many leases it carries.
const renewRecent = 6

// takeLease returns the lease to create the key of lock name with, for a
// TTL of ttl: the driver's shared lease of that TTL, granting one if there is
// none, with name recorded in it; or, if the driver already has a key under
// name with its shared lease (the same key asked for again, which must queue
// behind it like any other client), a lease of the grant's own.
func (d *Driver) takeLease(ctx context.Context, ttl time.Duration, name string) (*lease, error) {
	ask, err := ttlSeconds(ttl)
	if err != nil {
		return nil, err
	}
	for range 3 {
		ls, err := d.sharedFor(ctx, ask)
		if err != nil {
			return nil, err
		}
		d.mu.Lock()
		switch {
		case d.closed:
			d.mu.Unlock()
			return nil, errClosed
		case ls.shared.retired:
			d.mu.Unlock()
			continue
		}
		if _, dup := ls.shared.names[name]; dup {
			d.mu.Unlock()
			return d.ownLease(ctx, ask)
		}
		ls.shared.names[name] = struct{}{}
		d.mu.Unlock()
		if ls.fresh(time.Now()) {
			return ls, nil
		}
		err = d.renewShared(ctx, ls)
		if err == nil {
			return ls, nil
		}
		d.detach(ls, name)
		if !errors.Is(err, errLeaseGone) {
			return nil, err
		}
	}
	// Three shared leases in a row were gone by the time they were renewed:
	// something revokes them; use a lease of our own.
	return d.ownLease(ctx, ask)
}

// sharedFor returns the driver's shared lease for TTL ask (seconds),
// granting one if there is none, or if the one there may have expired.
func (d *Driver) sharedFor(ctx context.Context, ask int64) (*lease, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	if ls := d.currentShared(ask); ls != nil {
		return ls, nil
	}
	// One grant at a time: acquires that come at once share it.
	select {
	case d.granting <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-d.granting }()
	if ls := d.currentShared(ask); ls != nil {
		return ls, nil
	}
	ls, err := d.grantLease(ctx, ask)
	if err != nil {
		return nil, err
	}
	ls.shared = &sharedLease{names: map[string]struct{}{}}
	ls.shared.renew = batch.New(renewGap, &d.wg, func() error { return d.keepShared(ls) })
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.revoke(ls)
		return nil, errClosed
	}
	d.shared[ask] = ls
	d.mu.Unlock()
	return ls, nil
}

// currentShared returns the shared lease for TTL ask if there is one that
// may still be alive, retiring one that was not renewed for a whole TTL (the
// server has dropped it, or is about to).
func (d *Driver) currentShared(ask int64) *lease {
	d.mu.Lock()
	defer d.mu.Unlock()
	ls := d.shared[ask]
	if ls == nil {
		return nil
	}
	if since, ttl := ls.times(); time.Since(since) >= ttl {
		d.retireLocked(ls)
		return nil
	}
	return ls
}

// retireLocked takes a shared lease out of use for new keys; d.mu must be
// held. Its keys stay until they are released; the last one's detach revokes
// it.
func (d *Driver) retireLocked(ls *lease) {
	ls.shared.retired = true
	if d.shared[ls.ask] == ls {
		delete(d.shared, ls.ask)
	}
}

// retire takes ls out of use for new keys if it is a shared lease (after a
// write of unknown outcome on it: a put that lands after its key's delete
// is then revoked with the lease once its other keys are released).
func (d *Driver) retire(ls *lease) {
	if ls.shared == nil {
		return
	}
	d.mu.Lock()
	d.retireLocked(ls)
	d.mu.Unlock()
}

// leaseGone records that the server no longer has ls, if it is a shared
// lease: no key may join it, and its renewals fail at once.
func (d *Driver) leaseGone(ls *lease) {
	if ls.shared == nil {
		return
	}
	d.mu.Lock()
	d.retireLocked(ls)
	ls.shared.gone = true
	d.mu.Unlock()
}

// detach records that ls carries no key of lock name any more, and revokes
// a retired shared lease that carries none.
func (d *Driver) detach(ls *lease, name string) {
	if ls.shared == nil {
		return
	}
	d.mu.Lock()
	delete(ls.shared.names, name)
	revoke := ls.shared.retired && !ls.shared.gone && len(ls.shared.names) == 0
	ls.shared.gone = ls.shared.gone || revoke
	d.mu.Unlock()
	if revoke {
		d.revokeLater(ls)
	}
}

// renewShared renews a shared lease, unless it was renewed less than
// TTL/renewRecent ago: one KeepAliveOnce, shared by every caller that asks
// while none is on its way. It returns errLeaseGone if the server no longer
// has the lease.
func (d *Driver) renewShared(ctx context.Context, ls *lease) error {
	d.mu.Lock()
	gone := ls.shared.gone
	d.mu.Unlock()
	if gone {
		return errLeaseGone
	}
	if since, ttl := ls.times(); time.Since(since) < ttl/renewRecent {
		return nil
	}
	_, err := ls.shared.renew.Do(ctx)
	return err
}

// renewGap is the least time between two keep-alives of a shared lease:
// renewals that ask while one is on its way share the next, which is sent
// only if the one before did not renew the lease.
const renewGap = 10 * time.Millisecond

// keepShared is the call of a shared lease's renewal group: one
// KeepAliveOnce, on the driver's context (a caller that gives up does not
// cancel it for the others), bounded by the request timeout; none if the
// call before renewed the lease less than TTL/renewRecent ago (its callers
// asked after it was sent, but the validity they get counts from it).
func (d *Driver) keepShared(ls *lease) error {
	if since, ttl := ls.times(); time.Since(since) < ttl/renewRecent {
		return nil
	}
	ctx, cancel := d.reqCtx(d.bg)
	defer cancel()
	start := time.Now()
	resp, err := d.cli.KeepAliveOnce(ctx, ls.id)
	if err != nil {
		if isLeaseNotFound(err) {
			d.leaseGone(ls)
			return fmt.Errorf("lease %x: %w", int64(ls.id), errLeaseGone)
		}
		return fmt.Errorf("renew lease %x: %w", int64(ls.id), err)
	}
	ls.renewed(start, time.Duration(resp.TTL)*time.Second)
	return nil
}

// unkey deletes the key of a grant that is not held and will not be (a
// waiter cancelled, a failed acquire): for a lease of its own, by revoking
// the lease; for the shared lease, by deleting the key if it is still the
// lease's (rev 0: whatever its create revision), and if that fails, again in
// the background until it succeeds or the driver closes.
func (d *Driver) unkey(ls *lease, name, key string, rev int64) {
	if ls.shared == nil {
		d.revoke(ls)
		return
	}
	ctx, cancel := d.reqCtx(d.bg)
	err := d.deleteKey(ctx, ls, key, rev)
	cancel()
	if err != nil {
		d.deleteLater(ls, name, key, rev)
		return
	}
	d.detach(ls, name)
}

// deleteKey deletes key if it is still attached to ls (and, if rev > 0, was
// created at rev): one transaction, which never deletes another holder's key.
func (d *Driver) deleteKey(ctx context.Context, ls *lease, key string, rev int64) error {
	cmp := clientv3.Compare(clientv3.LeaseValue(key), "=", ls.id)
	if rev > 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
	}
	_, err := d.cli.Txn(ctx).If(cmp).Then(clientv3.OpDelete(key)).Commit()
	return err
}

// deleteLater deletes a key of the shared lease in the background, retrying
// with backoff until the server answers or the driver closes (Close revokes
// the shared lease, which deletes the key; a retired one expires after its
// TTL, as nothing renews it once no held lease is on it). Until then the lock name stays
// recorded in the lease, so the driver does not make the same key again.
func (d *Driver) deleteLater(ls *lease, name, key string, rev int64) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.wg.Add(1)
	d.mu.Unlock()
	go func() { // owned by the driver: Close cancels d.bg and waits
		defer d.wg.Done()
		var bo backend.Backoff
		for {
			ctx, cancel := d.reqCtx(d.bg)
			err := d.deleteKey(ctx, ls, key, rev)
			cancel()
			if err == nil {
				d.detach(ls, name)
				return
			}
			if backend.Sleep(d.bg, bo.Next()) != nil {
				return
			}
		}
	}()
}
