// Inspecting and breaking locks (backend.Inspector, backend.Breaker).

package redlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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

// nodeView is what one node says of a lock.
type nodeView struct {
	value   string // "" if the lock key is absent
	expires time.Time
	err     error
}

// views reads k on every node at once, each bounded by the node timeout.
func (d *Driver) views(ctx context.Context, k *rediscore.Keys) []nodeView {
	out := make([]nodeView, len(d.nodes))
	var wg sync.WaitGroup
	for i, n := range d.nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, d.nodeTimeout)
			defer cancel()
			pipe := n.client.Pipeline()
			get := pipe.Get(nctx, k.Lock)
			pttl := pipe.PTTL(nctx, k.Lock)
			start := time.Now()
			if _, err := pipe.Exec(nctx); err != nil && !errors.Is(err, goredis.Nil) {
				out[i].err = d.redact(err)
				return
			}
			out[i].value = get.Val()
			if ms := pttl.Val(); ms > 0 {
				out[i].expires = start.Add(ms)
			}
		})
	}
	wg.Wait()
	return out
}

// Inspect implements backend.Inspector: the lock is held if one holder's
// value is on a quorum of nodes, until Expires, when fewer will hold it.
// Token is 0 and Waiters -1; it fails with ErrNoQuorum if fewer than a quorum
// answer.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	if d.closed.Load() {
		return backend.LockInfo{}, errClosed
	}
	info, _, err := d.inspect(ctx, key)
	return info, err
}

func (d *Driver) inspect(ctx context.Context, key string) (backend.LockInfo, *rediscore.Keys, error) {
	k := rediscore.KeysFor(d.prefix, key)
	info := backend.LockInfo{Key: key, Waiters: -1}
	vs := d.views(ctx, k)
	answered := 0
	// Votes by owner, not by value: a holder's label is part of the value,
	// and a Relabel (election's Proclaim) changes it node by node, so a
	// read in between finds the old label on some nodes and the new one on
	// others. The owner holds the lock on all of them.
	type vote struct {
		label   string
		expires time.Time
	}
	votes := map[string][]vote{}
	var errs []error
	for _, v := range vs {
		if v.err != nil {
			errs = append(errs, v.err)
			continue
		}
		answered++
		if v.value != "" {
			owner, label := rediscore.SplitHolder(v.value)
			votes[owner] = append(votes[owner], vote{label, v.expires})
		}
	}
	if answered < d.quorum {
		return info, k, fmt.Errorf("%d of %d nodes answered, need %d: %w", answered, len(d.nodes), d.quorum, errors.Join(errs...))
	}
	for owner, vs := range votes {
		if len(vs) < d.quorum {
			continue
		}
		info.Held = true
		info.Owner = owner
		// The label most of its nodes have (the new one once a Relabel
		// has reached most of them; ties go to the greater, for a stable
		// answer).
		count := map[string]int{}
		for _, v := range vs {
			count[v.label]++
		}
		for label, n := range count {
			if best := count[info.Label]; n > best || n == best && label > info.Label {
				info.Label = label
			}
		}
		exp := make([]time.Time, len(vs))
		for i, v := range vs {
			exp[i] = v.expires
		}
		slices.SortFunc(exp, func(a, b time.Time) int { return b.Compare(a) })
		info.Expires = exp[d.quorum-1]
		return info, k, nil
	}
	return info, k, nil
}

// List implements backend.Inspector: SCAN every node for lock keys under the
// driver's prefix whose keys start with prefix, then Inspect each.
func (d *Driver) List(ctx context.Context, prefix string) ([]backend.LockInfo, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	pattern := rediscore.LockPattern(d.prefix, prefix)
	seen := map[string]bool{}
	answered := 0
	for _, n := range d.nodes {
		nctx, cancel := context.WithTimeout(ctx, 10*d.nodeTimeout)
		it := n.client.Scan(nctx, 0, pattern, 1000).Iterator()
		for it.Next(nctx) {
			seen[it.Val()] = true
		}
		err := it.Err()
		cancel()
		if err == nil {
			answered++
		}
	}
	if answered < d.quorum {
		return nil, fmt.Errorf("%d of %d nodes could be scanned, need %d", answered, len(d.nodes), d.quorum)
	}
	return rediscore.HeldLocks(ctx, d.prefix, prefix, slices.Collect(maps.Keys(seen)), func(ctx context.Context, key string) (backend.LockInfo, error) {
		info, _, err := d.inspect(ctx, key)
		return info, err
	})
}

// Break implements backend.Breaker: it deletes the holder's key on every
// node that has it, keeping the fencing counters, and succeeds once fewer
// than a quorum still hold it.
func (d *Driver) Break(ctx context.Context, key string) (backend.LockInfo, error) {
	if d.closed.Load() {
		return backend.LockInfo{}, errClosed
	}
	info, k, err := d.inspect(ctx, key)
	if err != nil {
		return info, err
	}
	if !info.Held {
		return info, fmt.Errorf("key %q: %w", key, backend.ErrNotHeld)
	}
	value := rediscore.HolderValue(info.Owner, info.Label)
	left := make([]bool, len(d.nodes)) // the holder may still be on node i
	var wg sync.WaitGroup
	for i, n := range d.nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, d.nodeTimeout)
			defer cancel()
			_, err := rediscore.Break.Run(nctx, n.client, []string{k.Lock}, value, k.Channel).Int64()
			left[i] = err != nil
		})
	}
	wg.Wait()
	if still := len(slices.DeleteFunc(left, func(b bool) bool { return !b })); still >= d.quorum {
		return info, fmt.Errorf("break %q: %d nodes could not be reached; the holder may still have a quorum", key, still)
	}
	return info, nil
}
