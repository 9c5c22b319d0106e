// Inspecting and breaking locks (backend.Inspector, backend.Breaker).

package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
)

var (
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
)

// Inspect implements backend.Inspector in one MULTI/EXEC: no Granted, and
// Waiters -1 on Redis Cluster. A key held shared reports the holder whose
// expiry is the latest, with Token 0; a permit's slot key, NAME/permits/i,
// reports that permit's holder.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	if d.closed.Load() {
		return backend.LockInfo{}, errClosed
	}
	info, err := d.inspect(ctx, key, rediscore.KeysFor(d.prefix, key))
	if err != nil || info.Held {
		return info, err
	}
	if name, slot, ok := rediscore.SplitPermitKey(key); ok {
		return d.inspectPermit(ctx, name, slot)
	}
	return info, nil
}

func (d *Driver) inspect(ctx context.Context, key string, k *rediscore.Keys) (backend.LockInfo, error) {
	info := backend.LockInfo{Key: key, Waiters: -1}
	_, cluster := d.client.(*goredis.ClusterClient)
	var numsub *goredis.MapStringIntCmd
	var queued *goredis.IntCmd
	pipe := d.client.TxPipeline()
	get := pipe.Get(ctx, k.Lock)
	pttl := pipe.PTTL(ctx, k.Lock)
	fence := pipe.Get(ctx, k.Fence)
	readers := pipe.ZCard(ctx, k.Readers())
	last := pipe.ZRangeWithScores(ctx, k.Readers(), -1, -1)
	now := pipe.Time(ctx)
	switch {
	case d.opts.Fair:
		queued = pipe.ZCard(ctx, k.Queue())
	case !cluster:
		numsub = pipe.PubSubNumSub(ctx, k.Channel)
	}
	start := time.Now()
	_, err := pipe.Exec(ctx)
	if err != nil && !errors.Is(err, goredis.Nil) {
		return info, fmt.Errorf("read %s: %w", k.Lock, err)
	}
	switch {
	case queued != nil:
		info.Waiters = int(queued.Val())
	case numsub != nil:
		info.Waiters = int(numsub.Val()[k.Channel])
	}
	v, err := get.Result()
	if errors.Is(err, goredis.Nil) {
		if n := readers.Val(); n > 0 {
			info.Held, info.Shared = true, int(n)
			if zs := last.Val(); len(zs) == 1 {
				if m, ok := zs[0].Member.(string); ok {
					info.Owner, info.Label = rediscore.SplitHolder(m)
				}
				info.Expires = start.Add(time.Duration(int64(zs[0].Score)-now.Val().UnixMilli()) * time.Millisecond)
			}
		}
		return info, nil
	}
	info.Held = true
	info.Owner, info.Label = rediscore.SplitHolder(v)
	if ms := pttl.Val(); ms > 0 {
		info.Expires = start.Add(ms)
	}
	if f, err := fence.Result(); err == nil {
		if n, err := strconv.ParseUint(f, 10, 64); err == nil {
			info.Token = n
		}
	}
	return info, nil
}

// List implements backend.Inspector by SCAN on every master, listing the
// counted semaphores' permits under their slots' keys.
func (d *Driver) List(ctx context.Context, prefix string) ([]backend.LockInfo, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	locks, err := d.scanList(ctx, rediscore.LockPattern(d.prefix, prefix), func(ctx context.Context, names []string) ([]backend.LockInfo, error) {
		return rediscore.HeldLocks(ctx, d.prefix, prefix, names, func(ctx context.Context, key string) (backend.LockInfo, error) {
			return d.inspect(ctx, key, rediscore.KeysFor(d.prefix, key))
		})
	})
	if err != nil {
		return nil, err
	}
	// Keys held shared have no lock key: their shared holders' sets.
	shared, err := d.scanList(ctx, rediscore.LockPattern(d.prefix, prefix)+rediscore.GlobEscape(readersSuffix), func(ctx context.Context, names []string) ([]backend.LockInfo, error) {
		locks := make([]string, 0, len(names))
		for _, n := range names {
			locks = append(locks, strings.TrimSuffix(n, readersSuffix))
		}
		return rediscore.HeldLocks(ctx, d.prefix, prefix, locks, func(ctx context.Context, key string) (backend.LockInfo, error) {
			return d.inspect(ctx, key, rediscore.KeysFor(d.prefix, key))
		})
	})
	if err != nil {
		return nil, err
	}
	for _, s := range shared {
		if s.Shared > 0 { // not one taken exclusively since the first SCAN
			locks = append(locks, s)
		}
	}
	slices.SortFunc(locks, func(a, b backend.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	// A permit's key, NAME/permits/i, starts with a prefix without '/' only
	// if NAME does; otherwise NAME may be shorter than the prefix.
	pattern := rediscore.GlobEscape(d.prefix+"{") + "*" + rediscore.SemHoldersSuffix
	if !strings.Contains(prefix, "/") {
		pattern = rediscore.GlobEscape(d.prefix+"{"+rediscore.HashTag(prefix)) + "*" + rediscore.SemHoldersSuffix
	}
	permits, err := d.scanList(ctx, pattern, func(ctx context.Context, names []string) ([]backend.LockInfo, error) {
		return d.listPermits(ctx, prefix, names)
	})
	if err != nil || len(permits) == 0 {
		return locks, err
	}
	all := append(locks, permits...)
	slices.SortFunc(all, func(a, b backend.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	return all, nil
}

// scanList SCANs for the names matching pattern (on every master of a
// Cluster) and reads them with read.
func (d *Driver) scanList(ctx context.Context, pattern string, read func(ctx context.Context, names []string) ([]backend.LockInfo, error)) ([]backend.LockInfo, error) {
	var names []string
	scan := func(ctx context.Context, c goredis.UniversalClient) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			names = append(names, it.Val())
		}
		return it.Err()
	}
	var err error
	if cc, ok := d.client.(*goredis.ClusterClient); ok {
		var mu sync.Mutex
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			var local []string
			it := c.Scan(ctx, 0, pattern, 1000).Iterator()
			for it.Next(ctx) {
				local = append(local, it.Val())
			}
			mu.Lock()
			names = append(names, local...)
			mu.Unlock()
			return it.Err()
		})
	} else {
		err = scan(ctx, d.client)
	}
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", pattern, err)
	}
	return read(ctx, names)
}

// readersSuffix ends the name of a key's shared holders' set.
const readersSuffix = ":readers"

// Break implements backend.Breaker: it deletes the lock key (every shared
// holder) if it still holds the holder it read, keeps the fencing counter,
// and releases as a release does (in fair mode, to the head of the queue).
func (d *Driver) Break(ctx context.Context, key string) (backend.LockInfo, error) {
	if d.closed.Load() {
		return backend.LockInfo{}, errClosed
	}
	k := rediscore.KeysFor(d.prefix, key)
	info, err := d.inspect(ctx, key, k)
	if err != nil {
		return info, err
	}
	if name, slot, ok := rediscore.SplitPermitKey(key); ok && !info.Held {
		return d.breakPermit(ctx, key, name, slot)
	}
	if !info.Held {
		return info, fmt.Errorf("key %q: %w", key, backend.ErrNotHeld)
	}
	if info.Shared > 0 {
		// Every shared holder goes (as on the other backends), and every
		// waiter is woken; each holder learns it at its next renewal.
		n, err := d.runShared(ctx, k, "break", "", "").Int64()
		if err != nil {
			return info, fmt.Errorf("break %s: %w", k.Readers(), err)
		}
		if n == 0 {
			return info, fmt.Errorf("key %q: its shared holders went before the break: %w", key, backend.ErrNotHeld)
		}
		return info, nil
	}
	holder := rediscore.HolderValue(info.Owner, info.Label)
	var n int64
	if d.opts.Fair {
		// As a release: the lock goes to the head of the queue.
		n, err = d.fairRelease(ctx, holder, k, "0").Int64()
	} else {
		n, err = rediscore.Break.Run(ctx, d.client, []string{k.Lock}, holder, k.Channel).Int64()
	}
	if err != nil {
		return info, fmt.Errorf("break %s: %w", k.Lock, err)
	}
	if n == 0 {
		return info, fmt.Errorf("key %q: its holder went before the break: %w", key, backend.ErrNotHeld)
	}
	return info, nil
}
