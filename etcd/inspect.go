// Inspecting and breaking locks (backend.Inspector, backend.Breaker).

package etcd

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

var (
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
)

// holderValue is the value of a holder's or waiter's key: its label, as a
// concurrency.Election candidate's key holds its value (so that an election
// on dlock is read by concurrency.Election.Leader and Observe, and `etcdctl
// elect --listen`). concurrency.Mutex and etcdctl lock read no values;
// `etcdctl get --prefix` shows who holds what. The owner ID is not stored:
// the key's name (its lease) identifies the holder.
func holderValue(_, label string) string { return label }

// Inspect implements backend.Inspector with one read of the keys under the
// lock's name: no Owner and no Granted, Expires in whole seconds, and for a
// lock held shared the newest shared holder.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	info, _, err := d.inspect(ctx, key)
	return info, err
}

func (d *Driver) inspect(ctx context.Context, key string) (backend.LockInfo, []*mvccpb.KeyValue, error) {
	name := LockName(d.prefix, key) + "/"
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	resp, err := d.cli.Get(rctx, name, clientv3.WithPrefix())
	if err != nil {
		return backend.LockInfo{Key: key}, nil, fmt.Errorf("read %s: %w", name, err)
	}
	info, holders := describe(key, name, resp.Kvs)
	if len(holders) > 0 {
		d.expiry(rctx, &info, holders[len(holders)-1].Lease)
	}
	return info, holders, nil
}

// describe tells who holds lock name (of dlock key) from the keys under it,
// kvs: the oldest key, if it is not a read key; otherwise every read key
// older than the oldest other key, in create order. info describes the last
// holder (the one granted last) and counts the other keys as waiters.
func describe(key, name string, kvs []*mvccpb.KeyValue) (backend.LockInfo, []*mvccpb.KeyValue) {
	var first *mvccpb.KeyValue // the oldest key not under read/
	for _, kv := range kvs {
		if !isRead(name, string(kv.Key)) && (first == nil || kv.CreateRevision < first.CreateRevision) {
			first = kv
		}
	}
	var holders []*mvccpb.KeyValue
	for _, kv := range kvs {
		if isRead(name, string(kv.Key)) && (first == nil || kv.CreateRevision < first.CreateRevision) {
			holders = append(holders, kv)
		}
	}
	if isWaitingRoom(key, name, kvs) {
		return backend.LockInfo{Key: key, Waiters: len(kvs)}, nil
	}
	shared := len(holders)
	switch {
	case shared == 0 && first == nil:
		return backend.LockInfo{Key: key}, nil
	case shared == 0:
		holders = append(holders, first)
	}
	slices.SortFunc(holders, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
	last := holders[len(holders)-1]
	label := string(last.Value)
	if _, l, ok := parsePermitValue(last.Value); ok && isPermitKey(name, string(last.Key)) {
		label = l // a permit's: "permits=<n> <label>"
	}
	info := backend.LockInfo{Key: key, Held: true, Shared: shared, Token: uint64(last.CreateRevision), Label: label}
	info.Waiters = len(kvs) - len(holders)
	return info, holders
}

// expiry sets info.Expires from the time to live of lease id, if the server
// answers.
func (d *Driver) expiry(ctx context.Context, info *backend.LockInfo, id int64) {
	if id == 0 {
		return
	}
	start := time.Now()
	ttl, err := d.cli.TimeToLive(ctx, clientv3.LeaseID(id))
	if err == nil && ttl.TTL >= 0 {
		info.Expires = start.Add(time.Duration(ttl.TTL) * time.Second)
	}
}

// List implements backend.Inspector: one read of every key under the
// driver's prefix whose lock name starts with prefix (escaped as LockName
// escapes keys), grouped by lock name.
func (d *Driver) List(ctx context.Context, prefix string) ([]backend.LockInfo, error) {
	from := LockName(d.prefix, prefix)
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	resp, err := d.cli.Get(rctx, from, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", from, err)
	}
	locks := map[string][]*mvccpb.KeyValue{}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if len(k) <= len(d.prefix)+1 {
			continue
		}
		rest := k[len(d.prefix)+1:]
		i := strings.IndexByte(rest, '/')
		if i <= 0 {
			continue // not a key under a lock name
		}
		locks[rest[:i]] = append(locks[rest[:i]], kv)
	}
	infos := make([]backend.LockInfo, 0, len(locks))
	for name, kvs := range locks {
		key, err := unescapeName(name)
		if err != nil {
			continue // not a lock of dlock's layout
		}
		info, holders := describe(key, d.prefix+"/"+name+"/", kvs)
		if len(holders) == 0 {
			continue
		}
		d.expiry(rctx, &info, holders[len(holders)-1].Lease)
		infos = append(infos, info)
	}
	slices.SortFunc(infos, func(a, b backend.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	return infos, nil
}

// unescapeName inverts the escaping of LockName (percent-encoding).
func unescapeName(name string) (string, error) {
	if strings.Contains(name, "/") {
		return "", fmt.Errorf("%q has an unescaped '/'", name)
	}
	return url.PathUnescape(name)
}

// maxBreakKeys is the most holders' keys Break deletes in one transaction
// (etcd refuses transactions of more than --max-txn-ops operations, 128 by
// default).
const maxBreakKeys = 64

// Break implements backend.Breaker: it deletes the holder's key (every shared
// holder's), conditional on the create revision it read, without revoking
// its lease; a dlock holder learns of it at once.
func (d *Driver) Break(ctx context.Context, key string) (backend.LockInfo, error) {
	info, holders, err := d.inspect(ctx, key)
	if err != nil {
		return info, err
	}
	if len(holders) == 0 {
		return info, fmt.Errorf("key %q: %w", key, backend.ErrNotHeld)
	}
	deleted := 0
	for chunk := range slices.Chunk(holders, maxBreakKeys) {
		ops := make([]clientv3.Op, len(chunk))
		for i, kv := range chunk {
			k := string(kv.Key)
			ops[i] = clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", kv.CreateRevision)},
				[]clientv3.Op{clientv3.OpDelete(k)}, nil)
		}
		rctx, cancel := d.reqCtx(ctx)
		resp, err := d.cli.Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return info, fmt.Errorf("delete the holders of %q: %w", key, err)
		}
		for _, r := range resp.Responses {
			if r.GetResponseTxn().GetSucceeded() {
				deleted++
			}
		}
	}
	if deleted == 0 {
		return info, fmt.Errorf("key %q: its holder went before the break: %w", key, backend.ErrNotHeld)
	}
	return info, nil
}
