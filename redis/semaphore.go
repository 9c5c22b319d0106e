// Counted semaphores (backend.AcquireRequest.Permits, package semaphore).

package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
)

// A counted semaphore NAME of n permits is, in the spirit of Redisson's
// RPermitExpirableSemaphore (a sorted set of expiring permits, swept by
// every script), four keys with NAME's hash tag (rediscore.SemKeysFor):
//
//	<prefix>{<tag>}:permits          zset: slot → expiry, in ms on the server's clock
//	<prefix>{<tag>}:permits:holders  hash: slot → "<token> <owner>[ <label>]"
//	<prefix>{<tag>}:permits:size     n, as the holders use it
//	<prefix>{<tag>}:permits:fence    the last token (no TTL)
//
// and the channel <prefix>{<tag>}:permits:released. One script
// (rediscore.Semaphore) does each operation; it first removes the permits
// whose expiry has passed.

// semGrant is the Data of a permit's grant.
type semGrant struct {
	keys *rediscore.SemKeys
	slot string
}

// acquirePermit is Acquire for a counted request: one attempt and, if all
// permits are held and req.Wait is set, a wait woken by the semaphore's
// channel, by the first holder's expiry and at least every poll interval.
// Fair mode does not order permits: they go to whichever waiter tries
// first (package semaphore queues its waiters on a lock, which is fair).
func (d *Driver) acquirePermit(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	ms, validity, err := ttlMillis(req.TTL)
	if err != nil {
		return nil, err
	}
	req.Owner = rediscore.HolderValue(req.Owner, req.Label)
	k := rediscore.SemKeysFor(d.prefix, req.Key)
	g, pttl, err := d.attemptPermit(ctx, req, k, ms, validity)
	switch {
	case g != nil:
		return g, nil
	case err != nil && (!req.Wait || !rediscore.Transient(err) || ctx.Err() != nil):
		return nil, waitEnded(ctx, err)
	case !req.Wait:
		return nil, fmt.Errorf("%w: all %d permits are held (the first holder's expiry is in %v unless renewed)", backend.ErrHeld, req.Permits, pttl)
	}

	wake, ready := make(chan struct{}, 1), make(chan struct{}, 1)
	w, werr := d.mux.Subscribe(k.Channel, wake, ready)
	if werr != nil {
		return nil, werr
	}
	// A release wakes one waiter per process, and a message that reached
	// this waiter between its grant and its unsubscribe may free a permit
	// another waiter here could take: leaving, granted or not, the waiter
	// wakes the next one of its process, which tries once.
	defer d.mux.Unsubscribe(w, false)

	return d.waitLoop(ctx, wake, ready, d.permitWait(pttl), err, func() (*backend.Grant, time.Duration, error) {
		g, pttl, err := d.attemptPermit(ctx, req, k, ms, validity)
		return g, d.permitWait(pttl), err
	})
}

// permitWait is how long a permit's waiter waits for a release message: a
// jittered poll interval, cut short by the first holder's expiry.
func (d *Driver) permitWait(pttl time.Duration) time.Duration {
	return min(backend.Jitter(d.poll), pttl+time.Millisecond)
}

// attemptPermit runs the acquire operation once. It returns the grant, or
// the time until the first holder's expiry when all are held. It leaves nothing behind when it fails or when
// ctx ends while the grant is in flight.
func (d *Driver) attemptPermit(ctx context.Context, req backend.AcquireRequest, k *rediscore.SemKeys, ms int64, validity time.Duration) (*backend.Grant, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	start := time.Now()
	rctx, cancel := inFlight(ctx) // see attempt
	defer cancel()
	cmd, acks, werr := d.runScript(rctx, rediscore.Semaphore, k.Keys(), "acquire", req.Owner, k.Channel, ms, req.Permits)
	if err := cmd.Err(); err != nil {
		if rediscore.MayHaveRun(err) {
			// The script may have run and the reply been lost: free the
			// permit if it is ours.
			d.cleanupPermit(ctx, req.Owner, k, "", "")
		}
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, 0, fmt.Errorf("semaphore script: %w", err)
	}
	res, err := cmd.Int64Slice()
	switch {
	case err != nil:
		return nil, 0, fmt.Errorf("semaphore script: %w", err)
	case len(res) == 2 && res[0] == 0:
		return nil, time.Duration(max(res[1], 0)) * time.Millisecond, nil
	case len(res) == 2 && res[0] == -1:
		return nil, 0, fmt.Errorf("%w: the holders of semaphore %q use %d permits, this request %d", backend.ErrSizeMismatch, req.Key, res[1], req.Permits)
	case len(res) != 3 || res[0] != 1 || res[2] < 0 || res[2] >= int64(req.Permits):
		return nil, 0, fmt.Errorf("semaphore script: unexpected reply %v", res)
	}
	slot, token := strconv.FormatInt(res[2], 10), strconv.FormatInt(res[1], 10)
	if werr != nil {
		// Granted, but its WAIT failed: give it back.
		d.cleanupPermit(ctx, req.Owner, k, slot, token)
		return nil, 0, fmt.Errorf("acquire: %w", werr)
	}
	if d.tooFewAcks(acks) {
		// A grant too few replicas acknowledged may not survive a
		// failover: give it back.
		d.cleanupPermit(ctx, req.Owner, k, slot, token)
		return nil, 0, d.tooFew(acks)
	}
	if ctx.Err() != nil {
		// The grant raced the caller's cancellation: give it back.
		d.cleanupPermit(ctx, req.Owner, k, slot, token)
		return nil, 0, ctx.Err()
	}
	return &backend.Grant{
		Key:      backend.PermitKey(req.Key, int(res[2])),
		Owner:    req.Owner,
		Token:    uint64(res[1]),
		Start:    start,
		Validity: validity,
		Data:     &semGrant{keys: k, slot: slot},
	}, 0, nil
}

// cleanupPermit releases owner's permit (of slot and token; "" for any),
// on a context detached from the caller's and bounded by cleanupTimeout.
func (d *Driver) cleanupPermit(ctx context.Context, owner string, k *rediscore.SemKeys, slot, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = rediscore.Semaphore.Run(ctx, d.client, k.Keys(), "release", owner, k.Channel, slot, token).Err()
}

// refreshPermit is Refresh for a permit: it sets the permit's expiry to ttl
// from the server's now if g still holds it.
func (d *Driver) refreshPermit(ctx context.Context, g *backend.Grant, sg *semGrant, ttl time.Duration) (time.Duration, error) {
	ms, validity, err := ttlMillis(ttl)
	if err != nil {
		return 0, err
	}
	held, err := d.runHeld(ctx, "semaphore", rediscore.Semaphore, sg.keys.Keys(), "extend", g.Owner, sg.keys.Channel, sg.slot, strconv.FormatUint(g.Token, 10), ms)
	if err := notHeld(held, err); err != nil {
		return 0, err
	}
	return validity, nil
}

// releasePermit is Release for a permit: it frees the permit if g still
// holds it and tells the waiters.
func (d *Driver) releasePermit(ctx context.Context, g *backend.Grant, sg *semGrant) error {
	n, err := rediscore.Semaphore.Run(ctx, d.client, sg.keys.Keys(), "release", g.Owner, sg.keys.Channel, sg.slot, strconv.FormatUint(g.Token, 10)).Int64()
	if err != nil {
		return fmt.Errorf("semaphore script: %w", err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}

// relabelPermit is Relabel for a permit: it changes the holder's label in
// the holders hash, keeping the token and the expiry.
func (d *Driver) relabelPermit(ctx context.Context, g *backend.Grant, sg *semGrant, label string) error {
	owner, _ := rediscore.SplitHolder(g.Owner)
	value := rediscore.HolderValue(owner, label)
	held, err := d.runHeld(ctx, "semaphore", rediscore.Semaphore, sg.keys.Keys(), "relabel", g.Owner, sg.keys.Channel, sg.slot, strconv.FormatUint(g.Token, 10), value)
	if held {
		g.Owner = value // the master has it, even if WAIT failed
	}
	return notHeld(held, err)
}

// readPermits reads the live permits of the semaphore name (of slot, or of
// every slot if slot < 0) as LockInfos keyed by their slots' keys. Waiters
// is -1: permits' waiters have no queue to count.
func (d *Driver) readPermits(ctx context.Context, name string, slot int) ([]backend.LockInfo, error) {
	k := rediscore.SemKeysFor(d.prefix, name)
	arg := ""
	if slot >= 0 {
		arg = strconv.Itoa(slot)
	}
	start := time.Now()
	vals, err := rediscore.SemRead.Run(ctx, d.client, []string{k.Holders, k.Permits}, arg).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", k.Holders, err)
	}
	var infos []backend.LockInfo
	for i := 0; i+2 < len(vals); i += 3 {
		s, err1 := strconv.Atoi(vals[i])
		ms, err2 := strconv.ParseInt(vals[i+2], 10, 64)
		token, holder, ok := rediscore.ParsePermitHolder(vals[i+1])
		if err1 != nil || err2 != nil || !ok {
			return nil, fmt.Errorf("read %s: unexpected entry %q", k.Holders, vals[i:i+3])
		}
		info := backend.LockInfo{
			Key:     backend.PermitKey(name, s),
			Held:    true,
			Token:   token,
			Expires: start.Add(time.Duration(ms) * time.Millisecond),
			Waiters: -1,
		}
		info.Owner, info.Label = rediscore.SplitHolder(holder)
		infos = append(infos, info)
	}
	return infos, nil
}

// inspectPermit is Inspect for the key of slot slot of the semaphore name.
func (d *Driver) inspectPermit(ctx context.Context, name string, slot int) (backend.LockInfo, error) {
	infos, err := d.readPermits(ctx, name, slot)
	if err != nil || len(infos) == 0 {
		return backend.LockInfo{Key: backend.PermitKey(name, slot), Waiters: -1}, err
	}
	return infos[0], nil
}

// listPermits reads the permits of the semaphores whose holders hashes are
// names, and returns those whose slots' keys start with prefix.
func (d *Driver) listPermits(ctx context.Context, prefix string, names []string) ([]backend.LockInfo, error) {
	var out []backend.LockInfo
	for _, n := range names {
		name, ok := rediscore.SemKeyOf(d.prefix, n)
		if !ok {
			continue
		}
		infos, err := d.readPermits(ctx, name, -1)
		if err != nil {
			return nil, err
		}
		for _, in := range infos {
			if strings.HasPrefix(in.Key, prefix) {
				out = append(out, in)
			}
		}
	}
	return out, nil
}

// breakPermit is Break for key, the key of slot slot of the semaphore name:
// it frees the permit if it still has the holder and token it read, and
// tells the waiters. The broken holder learns it at its next renewal; the
// counter stays, so the slot's next token is higher.
func (d *Driver) breakPermit(ctx context.Context, key, name string, slot int) (backend.LockInfo, error) {
	info, err := d.inspectPermit(ctx, name, slot)
	if err != nil {
		return info, err
	}
	if !info.Held {
		return info, fmt.Errorf("key %q: %w", key, backend.ErrNotHeld)
	}
	k := rediscore.SemKeysFor(d.prefix, name)
	n, err := rediscore.Semaphore.Run(ctx, d.client, k.Keys(), "release", rediscore.HolderValue(info.Owner, info.Label),
		k.Channel, strconv.Itoa(slot), strconv.FormatUint(info.Token, 10)).Int64()
	if err != nil {
		return info, fmt.Errorf("break %s slot %d: %w", k.Holders, slot, err)
	}
	if n == 0 {
		return info, fmt.Errorf("key %q: its holder went before the break: %w", key, backend.ErrNotHeld)
	}
	return info, nil
}
