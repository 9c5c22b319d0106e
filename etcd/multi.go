// Taking several locks in one transaction (backend.MultiAcquirer).

package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.MultiAcquirer = (*Driver)(nil)

// maxTxnKeys is the most keys TryAcquireAll creates in one transaction: each
// key is a compare and a put, and etcd refuses a transaction of more than
// --max-txn-ops compares or operations (128 by default).
const maxTxnKeys = 64

// TryAcquireAll implements backend.MultiAcquirer: one transaction per 64
// keys creates every holder's key if no key exists under any of the lock
// names; if one finds a key held or fails, the keys the others created are
// deleted before it returns.
func (d *Driver) TryAcquireAll(ctx context.Context, reqs []backend.AcquireRequest) ([]*backend.Grant, error) {
	parts := make([]*multiPart, 0, (len(reqs)+maxTxnKeys-1)/maxTxnKeys)
	for lo := 0; lo < len(reqs); lo += maxTxnKeys {
		p, err := d.createAll(ctx, reqs[lo:min(lo+maxTxnKeys, len(reqs))], len(reqs))
		if err != nil {
			for _, q := range parts {
				d.dropPart(q)
			}
			return nil, err
		}
		parts = append(parts, p)
	}
	gs := make([]*backend.Grant, 0, len(reqs))
	for pi, p := range parts {
		for i, r := range p.reqs {
			g := &grant{key: p.keys[i], name: p.names[i], rev: p.rev, ls: p.lss[i]}
			bg, err := d.granted(r, g) // unkeys g if it fails
			if err != nil {
				for j := i + 1; j < len(p.reqs); j++ {
					d.unkey(p.lss[j], p.names[j], p.keys[j], p.rev)
				}
				for _, q := range parts[pi+1:] {
					d.dropPart(q)
				}
				for _, prev := range gs {
					_ = d.Release(context.Background(), prev)
				}
				return nil, err
			}
			gs = append(gs, bg)
		}
	}
	return gs, nil
}

// multiPart is what one transaction of TryAcquireAll created: a key for each
// of reqs, at revision rev.
type multiPart struct {
	reqs  []backend.AcquireRequest
	names []string // each request's lock name + "/"
	keys  []string // each request's holder key
	lss   []*lease // each key's lease
	rev   int64    // the transaction's revision: every key's create revision
}

// createAll creates the holder keys of reqs (at most maxTxnKeys) in one
// transaction, only if none of their locks is held: all of them, or none and
// an error (wrapping backend.ErrHeld if a lock is held, ctx.Err() if ctx
// ended). total is the number of keys the caller takes, for its errors.
func (d *Driver) createAll(ctx context.Context, reqs []backend.AcquireRequest, total int) (*multiPart, error) {
	p := &multiPart{
		reqs:  reqs,
		names: make([]string, len(reqs)),
		keys:  make([]string, len(reqs)),
		lss:   make([]*lease, len(reqs)),
	}
	undo := func() { // nothing was created: give the leases back
		for i, ls := range p.lss {
			if ls == nil {
				continue
			}
			if ls.shared == nil {
				d.putLease(ls)
			}
			d.detach(ls, p.names[i])
		}
	}
	cmps := make([]clientv3.Cmp, 0, len(reqs))
	puts := make([]clientv3.Op, len(reqs))
	for i, r := range reqs {
		p.names[i] = LockName(d.prefix, r.Key) + "/"
		ls, err := d.takeLease(ctx, r.TTL, p.names[i])
		if err != nil {
			undo()
			return nil, err
		}
		p.lss[i] = ls
		p.keys[i] = holdKey(p.names[i], false, ls.id)
		cmps = append(cmps, freeFor(p.names[i], false)...)
		puts[i] = clientv3.OpPut(p.keys[i], holderValue(r.Owner, r.Label), clientv3.WithLease(ls.id))
	}
	// As in enqueue: the request that may create keys outlives ctx by up to
	// cancelGrace (graceCtx), so that its answer says whether there are keys
	// to delete.
	rctx, done := d.graceCtx(ctx)
	resp, err := d.cli.Txn(rctx).If(cmps...).Then(puts...).Commit()
	done()
	switch {
	case err != nil:
		if isLeaseNotFound(err) {
			for _, ls := range p.lss {
				d.leaseGone(ls)
			}
			undo()
			return nil, fmt.Errorf("acquire %d keys: %w", total, err)
		}
		for _, ls := range p.lss {
			d.retire(ls)
		}
		for i, ls := range p.lss {
			d.unkey(ls, p.names[i], p.keys[i], 0)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("acquire %d keys: %w", total, err)
	case !resp.Succeeded:
		undo()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("one of %d keys is held: %w", total, backend.ErrHeld)
	}
	p.rev = resp.Header.Revision
	if ctx.Err() != nil {
		d.dropPart(p)
		return nil, ctx.Err()
	}
	return p, nil
}

// dropPart deletes the keys p created, none of them granted: in one
// transaction of plain deletes (as Release, a key's name ends with its
// lease's ID: nobody else makes it), or, if that fails, one at a time by
// unkey, which retries in the background.
func (d *Driver) dropPart(p *multiPart) {
	dels := make([]clientv3.Op, len(p.keys))
	for i, k := range p.keys {
		dels[i] = clientv3.OpDelete(k)
	}
	ctx, cancel := d.reqCtx(d.bg)
	_, err := d.cli.Txn(ctx).Then(dels...).Commit()
	cancel()
	for i, ls := range p.lss {
		switch {
		case err != nil:
			d.unkey(ls, p.names[i], p.keys[i], p.rev) // detaches once the key is gone
		case ls.shared == nil:
			d.putLease(ls)
		default:
			d.detach(ls, p.names[i])
		}
	}
}
