// Taking several locks in one transaction (backend.MultiAcquirer).

package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.MultiAcquirer = (*Driver)(nil)

// maxMultiKeys is the most keys TryAcquireAll takes in one transaction
// (etcd refuses transactions of more than --max-txn-ops operations, 128 by
// default); dlock takes larger sets one key at a time.
const maxMultiKeys = 64

// TryAcquireAll implements backend.MultiAcquirer: one transaction creates
// every holder's key, only if no key exists under any of the lock names.
// Every key's token is the transaction's revision (each key's create
// revision): tokens still strictly increase per key.
func (d *Driver) TryAcquireAll(ctx context.Context, reqs []backend.AcquireRequest) ([]*backend.Grant, error) {
	if len(reqs) > maxMultiKeys {
		return nil, fmt.Errorf("%d keys in one transaction, at most %d: %w", len(reqs), maxMultiKeys, backend.ErrHeld)
	}
	names := make([]string, len(reqs))
	keys := make([]string, len(reqs))
	lss := make([]*lease, len(reqs))
	undo := func(created bool, rev int64) {
		for i, ls := range lss {
			if ls == nil {
				continue
			}
			switch {
			case created:
				d.unkey(ls, names[i], keys[i], rev) // detaches once the key is gone
				continue
			case ls.shared == nil:
				d.putLease(ls)
			}
			d.detach(ls, names[i])
		}
	}
	cmps := make([]clientv3.Cmp, 0, len(reqs))
	puts := make([]clientv3.Op, len(reqs))
	for i, r := range reqs {
		names[i] = LockName(d.prefix, r.Key) + "/"
		ls, err := d.takeLease(ctx, r.TTL, names[i])
		if err != nil {
			undo(false, 0)
			return nil, err
		}
		lss[i] = ls
		keys[i] = holdKey(names[i], false, ls.id)
		cmps = append(cmps, freeFor(names[i], false)...)
		puts[i] = clientv3.OpPut(keys[i], holderValue(r.Owner, r.Label), clientv3.WithLease(ls.id))
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
			for _, ls := range lss {
				d.leaseGone(ls)
			}
			undo(false, 0)
			return nil, fmt.Errorf("acquire %d keys: %w", len(reqs), err)
		}
		for _, ls := range lss {
			d.retire(ls)
		}
		for i, ls := range lss {
			d.unkey(ls, names[i], keys[i], 0)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("acquire %d keys: %w", len(reqs), err)
	case ctx.Err() != nil:
		undo(resp.Succeeded, resp.Header.Revision)
		return nil, ctx.Err()
	case !resp.Succeeded:
		undo(false, 0)
		return nil, fmt.Errorf("one of %d keys is held: %w", len(reqs), backend.ErrHeld)
	}
	gs := make([]*backend.Grant, len(reqs))
	for i, r := range reqs {
		g := &grant{key: keys[i], name: names[i], rev: resp.Header.Revision, ls: lss[i]}
		bg, err := d.granted(r, g)
		if err != nil {
			for j := i + 1; j < len(reqs); j++ {
				d.unkey(lss[j], names[j], keys[j], resp.Header.Revision)
			}
			for _, prev := range gs[:i] {
				_ = d.Release(context.Background(), prev)
			}
			return nil, err
		}
		gs[i] = bg
	}
	return gs, nil
}
