// Shared locks (backend.AcquireRequest.Shared) in the driver's own layout.

package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
)

// errSharedFair refuses a shared acquire in fair mode, whose queue orders
// exclusive waiters only (Capabilities().Shared is false there, so dlock
// refuses WithShared before the driver sees it; this is the driver's own
// guard).
var errSharedFair = fmt.Errorf("redis driver: shared locks are not available in fair mode (Options.Fair): %w", errors.ErrUnsupported)

// sharedGrant is the Data of a shared grant: the key's names.
type sharedGrant struct{ k *rediscore.Keys }

// runShared runs one operation of the shared-lock script (shared.lua) on k.
func (d *Driver) runShared(ctx context.Context, k *rediscore.Keys, op, holder string, arg any) *goredis.Cmd {
	return rediscore.Shared.Run(ctx, d.client, []string{k.Lock, k.Fence, k.Readers(), k.Writers()}, op, holder, arg, k.Channel)
}

// runSharedWait is runShared followed by WAIT when MinReplicas > 0; it
// returns the script's reply and the replicas that acknowledged it (0
// without MinReplicas).
func (d *Driver) runSharedWait(ctx context.Context, k *rediscore.Keys, op, holder string, arg any) (int64, int64, error) {
	if d.opts.MinReplicas == 0 {
		n, err := d.runShared(ctx, k, op, holder, arg).Int64()
		return n, 0, err
	}
	cmd, acks, err := d.runWait(ctx, rediscore.Shared, []string{k.Lock, k.Fence, k.Readers(), k.Writers()}, op, holder, arg, k.Channel)
	if cmd != nil && cmd.Err() == nil {
		n, cerr := cmd.Int64()
		if cerr != nil {
			return 0, 0, cerr
		}
		return n, acks, err
	}
	return 0, 0, err
}

// refreshShared is Refresh for a shared hold: it resets the holder's expiry
// if it is still one of the key's shared holders.
func (d *Driver) refreshShared(ctx context.Context, g *backend.Grant, sg *sharedGrant, ttl time.Duration) (time.Duration, error) {
	ms, validity, err := ttlMillis(ttl)
	if err != nil {
		return 0, err
	}
	n, acks, err := d.runSharedWait(ctx, sg.k, "extend", g.Owner, ms)
	if err == nil && n == 0 {
		return 0, backend.ErrNotHeld
	}
	if err != nil {
		return 0, fmt.Errorf("shared script: %w", err)
	}
	if d.opts.MinReplicas > 0 && acks < int64(d.opts.MinReplicas) {
		return 0, d.tooFew(acks)
	}
	return validity, nil
}

// releaseShared is Release for a shared hold; the last holder's release
// wakes every waiter (a waiting writer first of all).
func (d *Driver) releaseShared(ctx context.Context, g *backend.Grant, sg *sharedGrant) error {
	n, err := d.runShared(ctx, sg.k, "release", g.Owner, "").Int64()
	if err != nil {
		return fmt.Errorf("shared script: %w", err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}

// relabelShared is Relabel for a shared hold: the holder's entry is renamed
// to the new value, keeping its expiry.
func (d *Driver) relabelShared(ctx context.Context, g *backend.Grant, sg *sharedGrant, label string) error {
	owner, _ := rediscore.SplitHolder(g.Owner)
	value := rediscore.HolderValue(owner, label)
	n, acks, err := d.runSharedWait(ctx, sg.k, "relabel", g.Owner, value)
	if err != nil {
		return fmt.Errorf("shared script: %w", err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	g.Owner = value
	if d.opts.MinReplicas > 0 && acks < int64(d.opts.MinReplicas) {
		return d.tooFew(acks)
	}
	return nil
}

// leaveWriters takes a waiting writer that gives up out of the waiting
// writers' marks (and wakes the shared waiters), on a context detached from
// the caller's and bounded by cleanupTimeout. If it fails, the mark expires
// after the writer's TTL.
func (d *Driver) leaveWriters(ctx context.Context, owner string, k *rediscore.Keys) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = d.runShared(ctx, k, "leave", owner, "").Err()
}
