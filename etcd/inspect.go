// Inspecting and breaking locks (backend.Inspector, backend.Breaker).

package etcd

import (
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

// Inspect implements backend.Inspector: the holder is the key under the
// lock's name with the lowest create revision (its token), its label its
// value (no owner ID is stored), its expiry its lease's time to live (whole seconds); the
// other keys are the waiters. etcd records no grant time.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	info, _, err := d.inspect(ctx, key)
	return info, err
}

func (d *Driver) inspect(ctx context.Context, key string) (backend.LockInfo, *mvccpb.KeyValue, error) {
	name := LockName(d.prefix, key) + "/"
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	resp, err := d.cli.Txn(rctx).Then(
		clientv3.OpGet(name, clientv3.WithFirstCreate()...),
		clientv3.OpGet(name, clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return backend.LockInfo{Key: key}, nil, fmt.Errorf("read %s: %w", name, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return backend.LockInfo{Key: key}, nil, nil
	}
	info := d.infoOf(key, kvs[0])
	info.Waiters = int(resp.Responses[1].GetResponseRange().Count) - 1
	d.expiry(rctx, &info, kvs[0].Lease)
	return info, kvs[0], nil
}

// infoOf describes the holder whose key is kv.
func (d *Driver) infoOf(key string, kv *mvccpb.KeyValue) backend.LockInfo {
	return backend.LockInfo{Key: key, Held: true, Token: uint64(kv.CreateRevision), Label: string(kv.Value)}
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
	type lock struct {
		holder *mvccpb.KeyValue
		n      int
	}
	locks := map[string]*lock{}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		i := strings.LastIndexByte(k, '/')
		if i <= len(d.prefix) {
			continue
		}
		name := k[len(d.prefix)+1 : i]
		l := locks[name]
		if l == nil {
			l = &lock{}
			locks[name] = l
		}
		l.n++
		if l.holder == nil || kv.CreateRevision < l.holder.CreateRevision {
			l.holder = kv
		}
	}
	infos := make([]backend.LockInfo, 0, len(locks))
	for name, l := range locks {
		key, err := unescapeName(name)
		if err != nil {
			continue // not a lock of dlock's layout
		}
		info := d.infoOf(key, l.holder)
		info.Waiters = l.n - 1
		d.expiry(rctx, &info, l.holder.Lease)
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

// Break implements backend.Breaker: it deletes the holder's key, in a
// transaction conditional on the create revision it read, so a holder that
// changed meanwhile is not touched. Its lease is not revoked (it may carry
// its client's other locks). The revision only grows, so the next grant's
// token is higher; the broken holder's loss watch (a dlock holder) sees the
// deletion at once, and the first waiter's watch of its predecessor wakes
// it.
func (d *Driver) Break(ctx context.Context, key string) (backend.LockInfo, error) {
	info, kv, err := d.inspect(ctx, key)
	if err != nil {
		return info, err
	}
	if kv == nil {
		return info, fmt.Errorf("key %q: %w", key, backend.ErrNotHeld)
	}
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	k := string(kv.Key)
	resp, err := d.cli.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", kv.CreateRevision)).
		Then(clientv3.OpDelete(k)).
		Commit()
	if err != nil {
		return info, fmt.Errorf("delete %s: %w", k, err)
	}
	if !resp.Succeeded {
		return info, fmt.Errorf("key %q: its holder went before the break: %w", key, backend.ErrNotHeld)
	}
	return info, nil
}
