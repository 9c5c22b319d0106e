// Package redis is dlock's driver for a single Redis server, or a Redis Cluster
// or Sentinel deployment through a go-redis UniversalClient. Importing it
// registers the DSN schemes "redis" and "rediss" (TLS) with dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/redis"
//
//	locker, err := dlock.Open(ctx, "redis://user:secret@127.0.0.1:6379/0?ttl=10s&prefix=myapp:")
//
// To use a client built in code (Cluster, Sentinel, custom TLS), call [New] or
// [NewDriver].
//
// # What is guaranteed
//
// A lock is the key [LockKey], set with SET NX PX to the lease's random owner
// id; refresh and release are Lua scripts that act only if the key still holds
// that owner id, so a stale client can never extend or delete someone else's
// lock. The Redis server expires the key on its own clock.
//
// Fencing tokens are strict ([backend.FencingStrict]): every grant increments
// a per-key counter ([FenceKey]) in the same script that sets the lock, and the
// token is that counter floored at the server's clock (TIME, in microseconds).
// Tokens therefore strictly increase per key across every grant, release,
// expiry and restart, under this one assumption: if the counter is lost or set
// back — a restart without persistence or from an older RDB snapshot, a
// FLUSHALL, eviction of the counter under an allkeys-* maxmemory policy — the
// server's wall clock must not have stepped back below the last token issued.
// A token is never far above the clock it was issued at (the counter rises by
// one per grant, the clock by one per µs), so in practice: the clock must not
// step back across the loss. With persistence (appendonly yes, appendfsync
// always) the counter survives a restart and no clock assumption is needed.
// The same floor covers a failover to a replica whose copy of the counter lags,
// provided the new master's clock is not behind the old master's by more than
// the failover took.
//
// Mutual exclusion holds as long as the one Redis server keeps its data. A
// single Redis is not fault tolerant: a restart without persistence, or a
// failover to a replica that had not yet received the SET (replication is
// asynchronous; a later version will add WAIT), forgets the lock, and another
// client can then take it while the first still believes it holds it. Tokens
// still increase across that (the new grant's token is higher), so a resource
// that checks tokens (package fencing) rejects the stale holder's writes.
//
// Waiting is push-based: a waiter subscribes to the key's release channel
// ([ReleaseChannel]) on one pub/sub connection the driver shares among all its
// waiters, and tries again when a release is announced. A lock that expires is
// not announced, and a message can be lost on a reconnect; so a waiter also
// tries again when the holder's remaining TTL runs out, and at the latest after
// a jittered poll interval ([Options.PollInterval]). Waiters are not granted in
// arrival order (FIFO is false).
//
// # Key layout
//
// Every name the driver uses for a dlock key is built from the configured
// prefix (default "dlock:") and the key's hash tag: the key with '%', '{' and
// '}' percent-encoded as "%25", "%7B" and "%7D" (see [HashTag]). For the key
// "jobs/nightly":
//
//	dlock:{jobs/nightly}            the lock: owner id, with the lease's TTL
//	dlock:{jobs/nightly}:fence      the fencing counter, no TTL
//	dlock:{jobs/nightly}:released   the pub/sub channel announcing releases
//
// The braces make the escaped key the Redis Cluster hash tag, so the lock and
// its counter always live in one slot (no CROSSSLOT error, one script), and the
// encoding keeps the mapping injective: two different keys never share a lock.
// A prefix must not contain '{' or '}'.
//
// Fencing counters are never deleted: one small string per key ever locked.
//
// # DSN
//
//	redis://[user:password@]host[:port][/db][?param=value&...]
//	rediss://...   the same over TLS
//
// Parameters read by the driver: "prefix" (default "dlock:") and "poll", the
// longest a waiter goes between attempts (default 1s). Parameters read by
// dlock for every backend: "ttl" and "autorenew". Every other parameter goes
// to go-redis's ParseURL (dial_timeout, read_timeout, pool_size, …), which
// rejects those it does not know. Errors never contain the password. A client
// opened from a DSN bounds every command by its ctx's deadline (go-redis's
// ContextTimeoutEnabled), as well as by read_timeout and write_timeout.
package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
)

// Defaults for Options and the DSN parameters.
const (
	// DefaultPrefix is prepended to every Redis key and channel the driver
	// uses. DSN parameter "prefix".
	DefaultPrefix = "dlock:"

	// DefaultPollInterval is the longest a waiting Acquire goes between two
	// attempts when no release message arrives: each wait is drawn from
	// [PollInterval/2, PollInterval]. DSN parameter "poll".
	DefaultPollInterval = time.Second
)

// cleanupTimeout bounds the release the driver sends after an acquire attempt
// whose outcome it does not know (an error after the request may have reached
// the server), or whose grant raced the caller's cancellation.
const cleanupTimeout = 2 * time.Second

var errClosed = errors.New("redis driver closed")

func init() {
	backend.Register("redis", open)
	backend.Register("rediss", open)
}

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Prefix is prepended to every Redis key and channel the driver uses (see
	// the package doc's Key layout). It must not contain '{' or '}'. Empty means
	// DefaultPrefix ("dlock:"). DSN parameter "prefix".
	Prefix string

	// PollInterval is the longest a waiting Acquire goes between two attempts
	// when no release message arrives (a lock that expires is not announced;
	// a message can be lost on a reconnect). Each wait is drawn uniformly from
	// [PollInterval/2, PollInterval], and is cut short when the holder's TTL
	// runs out. Zero means DefaultPollInterval (1s); negative is an error.
	// DSN parameter "poll".
	PollInterval time.Duration
}

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Prefix == "" {
		r.Prefix = DefaultPrefix
	}
	if err := rediscore.CheckPrefix(r.Prefix); err != nil {
		return r, err
	}
	switch {
	case r.PollInterval == 0:
		r.PollInterval = DefaultPollInterval
	case r.PollInterval < 0:
		return r, fmt.Errorf("poll interval must be > 0, got %v", r.PollInterval)
	}
	return r, nil
}

// Driver is the Redis implementation of backend.Driver. Its methods are safe
// for concurrent use. Most programs use it through dlock.Open or New; build
// one with NewDriver to pass to dlock.New with your own options.
type Driver struct {
	client goredis.UniversalClient
	owned  bool // Close closes client
	prefix string
	poll   time.Duration
	mux    *rediscore.Mux
	closed atomic.Bool
}

var (
	_ backend.Driver = (*Driver)(nil)
	_ backend.Named  = (*Driver)(nil)
)

// NewDriver returns a driver that locks through client: a *goredis.Client, a
// *goredis.ClusterClient, a Sentinel failover client, or anything else
// implementing goredis.UniversalClient (a Ring is not suitable: it offers no
// single source of truth for a key across its shards' failures). opts may be
// nil for the defaults.
//
// The caller keeps ownership of client: the driver's Close does not close it.
// The driver opens one extra pub/sub connection through client when a call
// first has to wait, and closes it on Close. Set ContextTimeoutEnabled in the
// client's options so that ctx deadlines bound each call's network I/O, as
// Open does; otherwise go-redis bounds it by its read and write timeouts only.
func NewDriver(client goredis.UniversalClient, opts *Options) (*Driver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil redis client", dlock.ErrInvalidOption)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	return &Driver{
		client: client,
		prefix: o.Prefix,
		poll:   o.PollInterval,
		mux:    rediscore.NewMux(client, errClosed),
	}, nil
}

// New returns a dlock.Locker over client: dlock.New(NewDriver(client, opts),
// lockerOpts...). opts may be nil for the defaults. Closing the Locker does not
// close client.
func New(client goredis.UniversalClient, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(client, opts)
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "redis", Err: err}
	}
	l, err := dlock.New(d, lockerOpts...)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return l, nil
}

// open is the OpenFunc for the schemes "redis" and "rediss".
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	p := backend.NewParams(u)
	o := Options{
		Prefix:       p.String("prefix", DefaultPrefix),
		PollInterval: p.Duration("poll", DefaultPollInterval),
	}
	rest := p.Rest()
	if err := p.Done(); err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	if o.Prefix == "" {
		return nil, fmt.Errorf("%w: parameter prefix is empty (omit it for the default %q)", dlock.ErrInvalidOption, DefaultPrefix)
	}
	if _, err := o.withDefaults(); err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}

	cu := *u
	cu.RawQuery = rest.Encode()
	opt, err := goredis.ParseURL(cu.String())
	if err != nil {
		msg := strings.TrimPrefix(rediscore.Redact(err, u).Error(), "redis: ")
		if strings.HasPrefix(msg, "unexpected option") {
			msg += " (the driver reads prefix and poll; dlock reads ttl and autorenew; go-redis reads the rest)"
		}
		return nil, fmt.Errorf("%w: DSN: %s", dlock.ErrInvalidOption, msg)
	}
	// Every call's ctx deadline bounds its network I/O (the keepalive's
	// refresh must not outlive the lease's deadline).
	opt.ContextTimeoutEnabled = true
	client := goredis.NewClient(opt)
	if err := rediscore.Ping(ctx, client); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("ping %s: %w", opt.Addr, rediscore.Redact(err, u))
	}
	d, err := NewDriver(client, &o)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	d.owned = true
	return d, nil
}

// Name returns "redis".
func (d *Driver) Name() string { return "redis" }

// Prefix returns the prefix of the driver's keys (see LockKey).
func (d *Driver) Prefix() string { return d.prefix }

// Capabilities reports strict fencing, server-side expiry and push-based
// waiting; no FIFO order, no fault tolerance and no immediate loss
// notification (a lost lock is noticed at the next refresh). See the package
// doc for the assumptions behind each.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:       backend.FencingStrict,
		FIFO:          false,
		FaultTolerant: false,
		TimeAuthority: backend.TimeServer,
		PushWait:      true,
		LossNotify:    false,
	}
}

// Close stops the driver's pub/sub connection and its goroutines, and closes
// the Redis client if the driver was opened from a DSN (a client passed to
// NewDriver or New stays open). Waiting Acquire calls return an error. A
// second Close returns an error.
func (d *Driver) Close() error {
	if d.closed.Swap(true) {
		return errClosed
	}
	d.mux.Close()
	if d.owned {
		return d.client.Close()
	}
	return nil
}

// ttlMillis converts ttl to the whole milliseconds sent as PX, and the
// validity a grant or refresh of that TTL gets.
func ttlMillis(ttl time.Duration) (ms int64, validity time.Duration, err error) {
	ms = ttl.Milliseconds()
	validity = time.Duration(ms)*time.Millisecond - backend.DriftAllowance(ttl)
	if validity <= 0 {
		return 0, 0, fmt.Errorf("%w: ttl %v is too short for Redis (it must leave time after the drift allowance of %v)",
			dlock.ErrInvalidOption, ttl, backend.DriftAllowance(ttl))
	}
	return ms, validity, nil
}

func (d *Driver) keys(g *backend.Grant) *rediscore.Keys {
	if k, ok := g.Data.(*rediscore.Keys); ok {
		return k
	}
	return rediscore.KeysFor(d.prefix, g.Key)
}

// Acquire implements backend.Driver. It makes one attempt; if the lock is
// held and req.Wait is set, it subscribes to the key's release channel, waits
// for the subscription to be confirmed, and tries again after every release
// message, when the holder's TTL runs out, and at least every poll interval,
// until granted or ctx is done.
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	ms, validity, err := ttlMillis(req.TTL)
	if err != nil {
		return nil, err
	}
	k := rediscore.KeysFor(d.prefix, req.Key)
	g, pttl, err := d.attempt(ctx, req, k, ms, validity)
	if err != nil || g != nil {
		return g, err
	}
	if !req.Wait {
		return nil, heldError(pttl)
	}
	return d.wait(ctx, req, k, ms, validity, pttl)
}

// heldError is ErrHeld, with the holder's remaining TTL when known.
func heldError(pttl time.Duration) error {
	if pttl < 0 {
		return backend.ErrHeld
	}
	return fmt.Errorf("%w (its TTL ends in %v unless renewed)", backend.ErrHeld, pttl)
}

func (d *Driver) wait(ctx context.Context, req backend.AcquireRequest, k *rediscore.Keys, ms int64, validity, pttl time.Duration) (*backend.Grant, error) {
	wake, ready := make(chan struct{}, 1), make(chan struct{}, 1)
	w, err := d.mux.Subscribe(k.Channel, wake, ready)
	if err != nil {
		return nil, err
	}
	granted := false
	defer func() { d.mux.Unsubscribe(w, granted) }()

	// Try again only once the subscription is active, so a release between
	// the attempt and the subscription cannot go unnoticed; but never wait
	// for the confirmation longer than a poll.
	timer := time.NewTimer(d.nextWait(pttl))
	defer timer.Stop()
	select {
	case <-ready:
	case <-timer.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-d.mux.Done():
		return nil, errClosed
	}
	for {
		var g *backend.Grant
		g, pttl, err = d.attempt(ctx, req, k, ms, validity)
		if err != nil {
			return nil, err
		}
		if g != nil {
			granted = true
			return g, nil
		}
		timer.Reset(d.nextWait(pttl))
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-d.mux.Done():
			return nil, errClosed
		}
	}
}

// nextWait is how long a waiter waits for a release message before trying
// again: a jittered poll interval, cut short by the holder's TTL (pttl < 0:
// unknown).
func (d *Driver) nextWait(pttl time.Duration) time.Duration {
	wait := backend.Jitter(d.poll)
	if pttl >= 0 {
		wait = min(wait, pttl+time.Millisecond)
	}
	return wait
}

// attempt runs the acquire script once. It returns the grant, or the holder's
// remaining TTL (-1 if unknown) when the lock is held. It leaves nothing
// behind when it fails or when ctx ends while the grant is in flight.
func (d *Driver) attempt(ctx context.Context, req backend.AcquireRequest, k *rediscore.Keys, ms int64, validity time.Duration) (*backend.Grant, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	start := time.Now()
	res, err := rediscore.Acquire.Run(ctx, d.client, []string{k.Lock, k.Fence}, req.Owner, ms).Int64Slice()
	if err != nil {
		if rediscore.MayHaveRun(err) {
			// The script may have run and the reply been lost: free the
			// lock if it is ours.
			d.cleanup(ctx, req.Owner, k)
		}
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, 0, fmt.Errorf("acquire script: %w", err)
	}
	if len(res) != 2 {
		return nil, 0, fmt.Errorf("acquire script: unexpected reply %v", res)
	}
	if res[0] == 0 {
		pttl := time.Duration(-1)
		if res[1] >= 0 {
			pttl = time.Duration(res[1]) * time.Millisecond
		}
		return nil, pttl, nil
	}
	if ctx.Err() != nil {
		// The grant raced the caller's cancellation: give it back.
		d.cleanup(ctx, req.Owner, k)
		return nil, 0, ctx.Err()
	}
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    uint64(res[1]),
		Start:    start,
		Validity: validity,
		Data:     k,
	}, 0, nil
}

// cleanup releases owner's lock, if it holds it, on a context detached from
// the caller's and bounded by cleanupTimeout.
func (d *Driver) cleanup(ctx context.Context, owner string, k *rediscore.Keys) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = rediscore.Release.Run(ctx, d.client, []string{k.Lock}, owner, k.Channel).Err()
}

// Refresh implements backend.Driver: it resets the lock's TTL to ttl if g's
// owner still holds it, and returns ttl (in whole milliseconds) less the drift
// allowance.
func (d *Driver) Refresh(ctx context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	if d.closed.Load() {
		return 0, errClosed
	}
	ms, validity, err := ttlMillis(ttl)
	if err != nil {
		return 0, err
	}
	n, err := rediscore.Extend.Run(ctx, d.client, []string{d.keys(g).Lock}, g.Owner, ms).Int64()
	if err != nil {
		return 0, fmt.Errorf("extend script: %w", err)
	}
	if n == 0 {
		return 0, backend.ErrNotHeld
	}
	return validity, nil
}

// Release implements backend.Driver: it deletes the lock if g's owner still
// holds it and announces the release to waiters.
func (d *Driver) Release(ctx context.Context, g *backend.Grant) error {
	if d.closed.Load() {
		return errClosed
	}
	k := d.keys(g)
	n, err := rediscore.Release.Run(ctx, d.client, []string{k.Lock}, g.Owner, k.Channel).Int64()
	if err != nil {
		return fmt.Errorf("release script: %w", err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}
