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
// refuses a shared acquire before the driver sees it; this is the driver's own
// guard).
var errSharedFair = fmt.Errorf("redis driver: shared locks are not available in fair mode (Options.Fair): %w", errors.ErrUnsupported)

// sharedGrant is the Data of a shared grant: the key's names.
type sharedGrant struct{ k *rediscore.Keys }

// runShared runs one operation of the shared-lock script on k.
func (d *Driver) runShared(ctx context.Context, k *rediscore.Keys, op, holder string, arg any) *goredis.Cmd {
	return rediscore.Shared.Run(ctx, d.client, k.SharedKeys(), op, holder, arg, k.Channel)
}

// refreshShared is Refresh for a shared hold: it resets the holder's expiry
// if it is still one of the key's shared holders.
func (d *Driver) refreshShared(ctx context.Context, g *backend.Grant, sg *sharedGrant, ttl time.Duration) (time.Duration, error) {
	ms, validity, err := ttlMillis(ttl)
	if err != nil {
		return 0, err
	}
	held, err := d.runHeld(ctx, "shared", rediscore.Shared, sg.k.SharedKeys(), "extend", g.Owner, ms, sg.k.Channel)
	if err := notHeld(held, err); err != nil {
		return 0, err
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
	held, err := d.runHeld(ctx, "shared", rediscore.Shared, sg.k.SharedKeys(), "relabel", g.Owner, value, sg.k.Channel)
	if held {
		g.Owner = value // the master has it, even if WAIT failed
	}
	return notHeld(held, err)
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
