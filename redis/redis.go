package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
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
	// attempts without a release message. DSN parameter "poll".
	DefaultPollInterval = time.Second

	// DefaultWaitTimeout bounds the WAIT for replicas when
	// Options.MinReplicas > 0. DSN parameter "wait_timeout".
	DefaultWaitTimeout = 100 * time.Millisecond
)

// cleanupTimeout bounds the release the driver sends after an acquire attempt
// whose outcome it does not know (an error after the request may have reached
// the server), or whose grant raced the caller's cancellation.
const cleanupTimeout = 2 * time.Second

// cancelGrace is how long an acquire attempt (a request that may take the
// lock or make the caller a waiter) is given to answer after the caller's
// ctx ends. Its answer says what to give back, by a request sent after it.
// Given back blind, with the answer lost, the cleanup goes out on another
// connection, which the server may read first: the attempt then runs after
// it, and what it took stays until it expires.
const cancelGrace = time.Second

// inFlight returns the context of an acquire attempt: ctx's values, and an
// end cancelGrace after ctx's (go-redis bounds a command by its context's
// deadline; it does not notice a cancellation while it waits for a reply).
func inFlight(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Done() == nil { // it never ends: nothing to stretch
		return ctx, func() {}
	}
	detached := context.WithoutCancel(ctx)
	var rctx context.Context
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok {
		rctx, cancel = context.WithDeadline(detached, dl.Add(cancelGrace))
	} else {
		rctx, cancel = context.WithCancel(detached)
	}
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(cancelGrace, cancel) })
	return rctx, func() { stop(); cancel() }
}

var errClosed = fmt.Errorf("redis driver: %w", backend.ErrClosed)

func init() {
	for _, scheme := range []string{"redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster"} {
		backend.Register(scheme, open)
	}
}

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Prefix is prepended to every Redis key and channel the driver uses;
	// it must not contain '{' or '}'. Empty means DefaultPrefix ("dlock:").
	// DSN parameter "prefix".
	Prefix string

	// PollInterval is the longest a waiting Acquire goes between two
	// attempts without a release message (jittered, cut short when the
	// holder's TTL runs out). Zero means DefaultPollInterval (1s); negative is
	// an error. DSN parameter "poll".
	PollInterval time.Duration

	// MinReplicas, when > 0, makes every acquire and refresh WAIT up to
	// WaitTimeout for this many replicas to acknowledge the write, else fail
	// with ErrTooFewReplicas (an acquire releasing its lock). Zero, the
	// default, sends no WAIT; negative is an error. DSN parameter
	// "min_replicas"; docs/redis.md, Replication, says what it guarantees.
	MinReplicas int

	// WaitTimeout bounds each WAIT when MinReplicas > 0, and must be shorter
	// than the client's read timeout. Zero means DefaultWaitTimeout (100ms);
	// below 1ms is an error. DSN parameter "wait_timeout".
	WaitTimeout time.Duration

	// Checks says what Open, OpenUniversal, New and NewDriver do when the server's
	// configuration can break locks or tokens ([Driver.CheckServer]):
	// CheckWarn (the default) logs to Logger, CheckError fails, CheckOff
	// skips the check. DSN parameter "checks" ("warn", "error" or "off").
	Checks CheckMode

	// Logger receives the startup check's warnings and notes. nil means
	// slog.Default(). Not settable from a DSN.
	Logger *slog.Logger

	// Fair grants waiting Acquires in the order they began waiting: they
	// queue in Redis and a release hands the lock to the head. Every client
	// of a key must use the same mode; shared locks are refused. Default
	// false (a release wakes every waiter). DSN parameter "fair";
	// docs/redis.md, Fair mode, has the details.
	Fair bool
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
	if r.MinReplicas < 0 {
		return r, fmt.Errorf("min_replicas must be >= 0, got %d", r.MinReplicas)
	}
	switch {
	case r.WaitTimeout == 0:
		r.WaitTimeout = DefaultWaitTimeout
	case r.WaitTimeout < time.Millisecond:
		// WAIT takes whole milliseconds, and 0 would block forever.
		return r, fmt.Errorf("wait timeout must be >= 1ms, got %v", r.WaitTimeout)
	}
	switch r.Checks {
	case "":
		r.Checks = CheckWarn
	case CheckWarn, CheckError, CheckOff:
	default:
		return r, fmt.Errorf("checks must be %q, %q or %q, got %q", CheckWarn, CheckError, CheckOff, r.Checks)
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	return r, nil
}

// Driver is the Redis implementation of backend.Driver, safe for concurrent
// use; most programs use it through dlock.Open or New.
type Driver struct {
	client goredis.UniversalClient
	owned  bool // Close closes client
	prefix string
	poll   time.Duration
	opts   Options
	mux    *rediscore.Mux
	closed atomic.Bool

	// wakeChannel is the driver's own pub/sub channel in fair mode: a
	// release hands the lock to one of its waiters, or names it, there, so
	// no other client hears of it (see Options.Fair).
	wakeChannel string

	watches sync.WaitGroup // Watch's goroutines
}

var (
	_ backend.Driver = (*Driver)(nil)
	_ backend.Named  = (*Driver)(nil)
)

// NewDriver returns a driver that locks through client (a single-node,
// Sentinel failover or Cluster client; not a Ring), with opts nil for the
// defaults. The caller keeps client (Close does not close it), and should set
// ContextTimeoutEnabled so that ctx deadlines bound each call, as Open does.
// Bounded by ctx, it pings the deployment and runs the startup check
// (Options.Checks), as Open does.
func NewDriver(ctx context.Context, client goredis.UniversalClient, opts *Options) (*Driver, error) {
	d, err := newDriver(client, opts)
	if err != nil {
		return nil, err
	}
	if err := rediscore.Ping(ctx, client); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("ping: %w", err)
	}
	if err := d.startupCheck(ctx); err != nil {
		_ = d.Close()
		return nil, err
	}
	return d, nil
}

// newDriver is NewDriver without the I/O: it checks its arguments and builds
// the driver.
func newDriver(client goredis.UniversalClient, opts *Options) (*Driver, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil redis client", dlock.ErrInvalidOption)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	return &Driver{
		client:      client,
		prefix:      o.Prefix,
		poll:        o.PollInterval,
		opts:        o,
		mux:         rediscore.NewMux(client, errClosed),
		wakeChannel: rediscore.WaiterChannel(o.Prefix, backend.NewOwnerID()),
	}, nil
}

// New returns a dlock.Locker over client: dlock.New(NewDriver(ctx, client,
// opts), lockerOpts...). ctx bounds NewDriver's check of the deployment only.
// opts may be nil for the defaults. Closing the Locker does not close client.
func New(ctx context.Context, client goredis.UniversalClient, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(ctx, client, opts)
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "redis", Err: err}
	}
	return dlock.New(d, lockerOpts...) // closes d if it fails
}

// open is the OpenFunc for every scheme the package registers.
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	p := backend.NewParams(u)
	o := Options{
		Prefix:       p.String("prefix", DefaultPrefix),
		PollInterval: p.Duration("poll", DefaultPollInterval),
		MinReplicas:  p.Int("min_replicas", 0, 0, 1000),
		WaitTimeout:  p.Duration("wait_timeout", DefaultWaitTimeout),
		Checks:       CheckMode(p.String("checks", string(CheckWarn))),
		Fair:         p.Bool("fair", false),
	}
	rest := p.Rest()
	if err := p.Done(); err != nil {
		return nil, err
	}
	if o.Prefix == "" {
		return nil, fmt.Errorf("%w: parameter prefix is empty (omit it for the default %q)", dlock.ErrInvalidOption, DefaultPrefix)
	}
	if _, err := o.withDefaults(); err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	client, where, err := newClient(u, rest)
	if err != nil {
		msg := strings.TrimPrefix(backend.RedactError(err, u).Error(), "redis: ")
		if strings.HasPrefix(msg, "unexpected option") {
			msg += " (the driver reads prefix, poll, min_replicas, wait_timeout, checks and fair; dlock reads ttl, autorenew, label and reentrant; go-redis reads the rest)"
		}
		return nil, fmt.Errorf("%w: DSN: %s", dlock.ErrInvalidOption, msg)
	}
	d, err := startOwned(ctx, client, &o, where)
	if err != nil {
		return nil, backend.RedactError(err, u)
	}
	return d, nil
}

// startOwned pings client (where names it in the error), builds a driver that
// owns it and runs the startup check; it closes client on failure.
func startOwned(ctx context.Context, client goredis.UniversalClient, o *Options, where string) (*Driver, error) {
	if err := rediscore.Ping(ctx, client); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("ping %s: %w", where, err)
	}
	d, err := newDriver(client, o)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	d.owned = true
	if err := d.startupCheck(ctx); err != nil {
		_ = d.Close()
		return nil, err
	}
	return d, nil
}

// Name returns "redis".
func (d *Driver) Name() string { return "redis" }

// Prefix returns the prefix of the driver's keys (see LockKey).
func (d *Driver) Prefix() string { return d.prefix }

// Capabilities reports strict fencing, server-side expiry, push-based
// waiting and counted semaphores; FIFO only with Options.Fair, shared locks
// only without it; no fault tolerance and no loss notification.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:         backend.FencingStrict,
		FIFO:            d.opts.Fair,
		FaultTolerant:   false,
		TimeAuthority:   backend.TimeServer,
		PushWait:        true,
		LossNotify:      false,
		NativeSemaphore: true,
		Shared:          !d.opts.Fair,
	}
}

// Close stops the driver's pub/sub connection and goroutines, and closes the
// client if it was opened from a DSN. Waiting Acquires and a second Close
// fail with ErrClosed.
func (d *Driver) Close() error {
	if d.closed.Swap(true) {
		return errClosed
	}
	d.mux.Close()
	d.watches.Wait()
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

// Acquire implements backend.Driver. A waiting Acquire tries again after
// every release message, when the holder's TTL runs out and at least every
// poll interval, riding out transient errors (the server down, loading,
// failing over) until ctx is done.
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	if req.Permits > 0 {
		return d.acquirePermit(ctx, req) // semaphore.go
	}
	if req.Shared && d.opts.Fair {
		return nil, errSharedFair
	}
	ms, validity, err := ttlMillis(req.TTL)
	if err != nil {
		return nil, err
	}
	// The lock's value names the holder: its owner ID, and its label after a
	// space (see Inspect). Every script compares the whole value.
	req.Owner = rediscore.HolderValue(req.Owner, req.Label)
	k := rediscore.KeysFor(d.prefix, req.Key)
	g, ref, err := d.attempt(ctx, req, k, ms, validity, false)
	switch {
	case g != nil:
		return g, nil
	case err != nil && (!req.Wait || !rediscore.Transient(err) || ctx.Err() != nil):
		if req.Wait && rediscore.MayHaveRun(err) {
			// The attempt may have made the caller a waiter (its writer's
			// mark, its place in the fair queue) before its reply was lost:
			// nobody waits now.
			d.leaveWait(ctx, req, k)
		}
		return nil, waitEnded(ctx, err)
	case !req.Wait:
		return nil, heldError(ref.pttl)
	}
	return d.wait(ctx, req, k, ms, validity, ref, err)
}

// leaveWait takes what a waiting Acquire that gives up left on the server as
// a waiter away: in fair mode its place in the queue (and the lock, if it
// was handed to it meanwhile), in the default mode an exclusive waiter's
// mark as a waiting writer. A shared waiter leaves nothing.
func (d *Driver) leaveWait(ctx context.Context, req backend.AcquireRequest, k *rediscore.Keys) {
	switch {
	case d.opts.Fair:
		d.leaveQueue(ctx, req.Owner, k)
	case !req.Shared:
		// A waiting writer's mark keeps shared acquires out: take it away
		// (else it expires after the writer's TTL).
		d.leaveWriters(ctx, req.Owner, k)
	}
}

// refusal is what an attempt that was not granted learnt.
type refusal struct {
	pttl time.Duration // the holder's remaining TTL; -1 if unknown
	rank int64         // the caller's place in the fair queue (0: next, or not fair)
	// In fair mode, when the attempt was sent (local time) and when the
	// server ran it (its clock, µs): a lock handed to the caller later was
	// handed over after this attempt ran if its hand-off time is not
	// earlier, and then its TTL counts from after sent.
	sent     time.Time
	serverUS int64
}

// heldError is ErrHeld, with the holder's remaining TTL when known.
func heldError(pttl time.Duration) error {
	if pttl < 0 {
		return backend.ErrHeld
	}
	return fmt.Errorf("%w (its TTL ends in %v unless renewed)", backend.ErrHeld, pttl)
}

// wait is Acquire's waiting loop; ref is the first attempt's refusal, and
// lastErr its error, if it was transient.
func (d *Driver) wait(ctx context.Context, req backend.AcquireRequest, k *rediscore.Keys, ms int64, validity time.Duration, ref refusal, lastErr error) (*backend.Grant, error) {
	wake, ready := make(chan struct{}, 1), make(chan struct{}, 1)
	channel, id := k.Channel, ""
	if d.opts.Fair {
		// The driver's own channel: a release tells the waiter it hands the
		// lock to, by name, and nobody else.
		channel, id = d.wakeChannel, req.Owner
	}
	var w *rediscore.Waiter
	var err error
	if req.Shared {
		w, err = d.mux.SubscribeShared(channel, wake, ready)
	} else {
		w, err = d.mux.SubscribeAs(channel, id, wake, ready)
	}
	if err != nil {
		return nil, err
	}
	granted := false
	defer func() {
		if !granted {
			d.leaveWait(ctx, req, k)
		}
		// A shared grant passes the wake-up on: the next waiter of this
		// process may be granted beside it.
		d.mux.Unsubscribe(w, granted && !req.Shared)
	}()

	// before is the last refusal that the server ran: a hand-off counts from
	// it (see handedOver).
	before := ref
	g, err := d.waitLoop(ctx, wake, ready, d.nextWaitAt(ref.pttl, ref.rank, req), lastErr,
		func() (*backend.Grant, time.Duration, error) {
			if g := d.handedOver(ctx, w, req, k, validity, before); g != nil {
				return g, 0, nil
			}
			g, ref, err := d.attempt(ctx, req, k, ms, validity, true)
			if g != nil || err != nil {
				return g, 0, err
			}
			before = ref
			return nil, d.nextWaitAt(ref.pttl, ref.rank, req), nil
		})
	granted = g != nil
	return g, err
}

// waitLoop is the loop of every waiting Acquire (a lock's, a permit's), once
// it has subscribed to its wake-ups: it calls try once the subscription is
// confirmed (or after next, if that comes first), then after every wake-up
// and whenever the wait try asked for runs out, until try grants, fails for
// good, or ctx ends. next is the wait after the first, refused attempt;
// lastErr is that attempt's error, if it was transient. Transient errors
// (the server down, restarting, failing over) are ridden out with a backoff
// of at most a poll interval, since a release message may be missed
// meanwhile.
func (d *Driver) waitLoop(ctx context.Context, wake, ready <-chan struct{}, next time.Duration, lastErr error,
	try func() (*backend.Grant, time.Duration, error)) (*backend.Grant, error) {
	backoff := backend.Backoff{Min: 10 * time.Millisecond, Max: d.poll}
	if lastErr != nil {
		next = backoff.Next()
	}
	timer := time.NewTimer(next)
	defer timer.Stop()
	// Try again only once the subscription is active, so a release between
	// the attempt and the subscription cannot go unnoticed; but never wait
	// for the confirmation longer than next.
	select {
	case <-ready:
	case <-timer.C:
	case <-ctx.Done():
		return nil, waitEnded(ctx, lastErr)
	case <-d.mux.Done():
		return nil, errClosed
	}
	for {
		g, wait, err := try()
		switch {
		case g != nil:
			return g, nil
		case err == nil:
			lastErr = nil
			backoff.Reset()
			next = wait
		case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
			// ctx is ending (the attempt saw its deadline a moment before
			// ctx.Err does): report that, with the outage if there was one.
			<-ctx.Done()
			return nil, waitEnded(ctx, lastErr)
		case rediscore.Transient(err):
			lastErr = err
			next = backoff.Next()
		default:
			return nil, waitEnded(ctx, err)
		}
		timer.Reset(next)
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			return nil, waitEnded(ctx, lastErr)
		case <-d.mux.Done():
			return nil, errClosed
		}
	}
}

// handedOver returns the grant a fair-mode release handed to the waiter w,
// if one did and the waiter may count on it; else nil, and the waiter
// makes an attempt (which finds the lock its own if it was handed over, and
// is granted again).
//
// The lock's TTL was set when the server handed it over. The grant counts
// its validity from before: the last attempt of the waiter that the server
// refused. That attempt ran before the hand-off — after it, the lock is the
// waiter's and an attempt is granted — so the lease ends no later than the
// lock, provided the hand-off is not older than that attempt: one that is
// (its message arrived late, and the lock it handed over was lost before
// the attempt ran) is ignored. With MinReplicas the waiter always makes its
// own attempt, whose WAIT the grant needs.
func (d *Driver) handedOver(ctx context.Context, w *rediscore.Waiter, req backend.AcquireRequest, k *rediscore.Keys, validity time.Duration, before refusal) *backend.Grant {
	h, ok := w.TakeHandoff()
	if !ok || d.opts.MinReplicas > 0 || before.sent.IsZero() || h.ServerUS < before.serverUS || ctx.Err() != nil {
		// On ctx's end the wait's cleanup passes a handed lock on.
		return nil
	}
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    h.Token,
		Start:    before.sent,
		Validity: validity,
		Data:     k,
	}
}

// waitEnded is the error of a wait that ends with ctx done (or with err, if
// ctx is not done): ctx's error, naming the transient error the waiter was
// riding out, if any.
func waitEnded(ctx context.Context, err error) error {
	switch cerr := ctx.Err(); {
	case cerr == nil:
		return err
	case err == nil || errors.Is(err, cerr):
		return cerr
	default:
		return fmt.Errorf("%w (while the server was unreachable: %w)", cerr, err)
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

// nextWaitAt is nextWait for a waiter at place rank in the fair queue (0:
// next, or not in fair mode): a waiter behind another has no reason to try
// when the holder's TTL runs out, only to renew its place, within its own
// TTL; the head is woken by name. In fair mode no wait is longer than a
// third of the waiter's TTL, nor is an exclusive waiter's in the default mode
// (it renews its mark as a waiting writer, see shared.go).
func (d *Driver) nextWaitAt(pttl time.Duration, rank int64, req backend.AcquireRequest) time.Duration {
	renew := backend.Jitter(req.TTL / 3)
	if !d.opts.Fair {
		if req.Shared {
			return d.nextWait(pttl)
		}
		return min(d.nextWait(pttl), renew)
	}
	if rank > 0 {
		return renew
	}
	return min(d.nextWait(pttl), renew)
}

// leaveQueue takes a fair-mode waiter that gives up out of the queue (and
// hands the lock to the next waiter if it is free, or was handed to this
// one meanwhile), on a context detached from the caller's and bounded by
// cleanupTimeout. If it fails, the entry expires after the waiter's TTL (and
// a lock handed to it, after its lease TTL).
func (d *Driver) leaveQueue(ctx context.Context, owner string, k *rediscore.Keys) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = d.fairRelease(ctx, owner, k, "1").Err()
}

// fairRelease runs the fair mode's release script: leave "1" takes a waiter
// out of the queue, "0" releases a held lock. Either hands the lock to the
// head of the queue, unless grants must wait for replicas (MinReplicas),
// which only the head's own acquire can do: then it names the head.
func (d *Driver) fairRelease(ctx context.Context, owner string, k *rediscore.Keys, leave string) *goredis.Cmd {
	handOff := "1"
	if d.opts.MinReplicas > 0 {
		handOff = "0"
	}
	return rediscore.FairRelease.Run(ctx, d.client, k.FairReleaseKeys(), owner, k.Channel, leave, handOff)
}

// attempt runs the acquire script once. It returns the grant, or what the
// refusal said when the lock is held (in fair mode, a waiting Acquire joins
// the queue, and the refusal says where it stands). It leaves nothing behind
// when it fails or when ctx ends while the grant is in flight: it reads the
// answer up to cancelGrace after ctx's end, and gives back what that says
// it took. A refused
// exclusive attempt of a waiting Acquire marks the caller as a waiting
// writer; marked says an earlier attempt may have, so a grant removes the
// mark.
func (d *Driver) attempt(ctx context.Context, req backend.AcquireRequest, k *rediscore.Keys, ms int64, validity time.Duration, marked bool) (*backend.Grant, refusal, error) {
	if err := ctx.Err(); err != nil {
		return nil, refusal{}, err
	}
	start := time.Now()
	// The grant is announced on the release channel for followers (Watch).
	var (
		script *goredis.Script
		keys   []string
		args   []any
	)
	switch {
	case req.Shared:
		script = rediscore.Shared
		keys = k.SharedKeys()
		args = []any{"acquire", req.Owner, ms, k.Channel}
	case !d.opts.Fair:
		mark, again := "", "0"
		if req.Wait {
			mark = strconv.FormatInt(req.TTL.Milliseconds(), 10)
		}
		if marked {
			again = "1"
		}
		script = rediscore.Acquire
		keys = k.SharedKeys()
		args = []any{req.Owner, ms, "-", k.Channel, mark, again}
	default:
		join := "0"
		if req.Wait {
			join = "1"
		}
		script = rediscore.FairAcquire
		keys = k.FairAcquireKeys()
		args = []any{req.Owner, ms, join, req.TTL.Milliseconds(), k.Channel, d.wakeChannel}
	}
	rctx, cancel := inFlight(ctx)
	defer cancel()
	cmd, acks, werr := d.runScript(rctx, script, keys, args...)
	res, err := cmd.Int64Slice()
	if err == nil && len(res) == 2 && res[0] == 1 {
		// A grant too few replicas acknowledged (or whose WAIT failed) may
		// not survive a failover: give it back.
		if werr != nil {
			d.cleanup(ctx, req, k)
			return nil, refusal{}, fmt.Errorf("acquire: %w", werr)
		}
		if d.tooFewAcks(acks) {
			d.cleanup(ctx, req, k)
			return nil, refusal{}, d.tooFew(acks)
		}
	}
	if err != nil {
		if rediscore.MayHaveRun(err) {
			// The script may have run and the reply been lost: free the
			// lock if it is ours.
			d.cleanup(ctx, req, k)
		}
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, refusal{}, fmt.Errorf("acquire script: %w", err)
	}
	refusedLen := 2
	if d.opts.Fair {
		refusedLen = 4 // with the caller's place in the queue and the server's time
	}
	if !(len(res) == 2 && res[0] == 1) && !(len(res) == refusedLen && res[0] == 0) {
		return nil, refusal{}, fmt.Errorf("acquire script: unexpected reply %v", res)
	}
	if res[0] == 0 {
		ref := refusal{pttl: -1}
		if res[1] >= 0 {
			ref.pttl = time.Duration(res[1]) * time.Millisecond
		}
		if len(res) == 4 {
			ref.rank, ref.sent, ref.serverUS = res[2], start, res[3]
		}
		return nil, ref, nil
	}
	if ctx.Err() != nil {
		// The grant raced the caller's cancellation: give it back.
		d.cleanup(ctx, req, k)
		return nil, refusal{}, ctx.Err()
	}
	var data any = k
	if req.Shared {
		data = &sharedGrant{k: k}
	}
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    uint64(res[1]),
		Start:    start,
		Validity: validity,
		Data:     data,
	}, refusal{}, nil
}

// cleanup releases req.Owner's lock (or shared hold, for a shared req), if
// it holds it, on a context detached from the caller's and bounded by
// cleanupTimeout.
func (d *Driver) cleanup(ctx context.Context, req backend.AcquireRequest, k *rediscore.Keys) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if req.Shared {
		_ = d.runShared(ctx, k, "release", req.Owner, "").Err()
		return
	}
	_ = d.release(ctx, req.Owner, k).Err()
}

// release runs the release script for owner's lock: in fair mode, the one
// that hands it to the next waiter.
func (d *Driver) release(ctx context.Context, owner string, k *rediscore.Keys) *goredis.Cmd {
	if d.opts.Fair {
		return d.fairRelease(ctx, owner, k, "0")
	}
	return rediscore.Release.Run(ctx, d.client, []string{k.Lock}, owner, k.Channel)
}

// Refresh implements backend.Driver: it resets the lock's TTL to ttl if g's
// owner still holds it, and returns ttl (in whole milliseconds) less the drift
// allowance.
func (d *Driver) Refresh(ctx context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	if d.closed.Load() {
		return 0, errClosed
	}
	if sg, ok := g.Data.(*semGrant); ok {
		return d.refreshPermit(ctx, g, sg, ttl) // semaphore.go
	}
	if sg, ok := g.Data.(*sharedGrant); ok {
		return d.refreshShared(ctx, g, sg, ttl) // shared.go
	}
	ms, validity, err := ttlMillis(ttl)
	if err != nil {
		return 0, err
	}
	held, err := d.runHeld(ctx, "extend", rediscore.Extend, []string{d.keys(g).Lock}, g.Owner, ms)
	if err := notHeld(held, err); err != nil {
		return 0, err
	}
	return validity, nil
}

// Relabel implements backend.Relabeler: it stores g's owner ID and label as
// the lock's value, keeping its TTL, announces the change to Watch, and with
// MinReplicas waits for the replicas as a grant does.
func (d *Driver) Relabel(ctx context.Context, g *backend.Grant, label string) error {
	if d.closed.Load() {
		return errClosed
	}
	if sg, ok := g.Data.(*semGrant); ok {
		return d.relabelPermit(ctx, g, sg, label) // semaphore.go
	}
	if sg, ok := g.Data.(*sharedGrant); ok {
		return d.relabelShared(ctx, g, sg, label) // shared.go
	}
	owner, _ := rediscore.SplitHolder(g.Owner)
	value := rediscore.HolderValue(owner, label)
	k := d.keys(g)
	held, err := d.runHeld(ctx, "relabel", rediscore.Relabel, []string{k.Lock}, g.Owner, value, k.Channel)
	if held {
		g.Owner = value // the master has it, even if WAIT failed: the next renewal must name it
	}
	return notHeld(held, err)
}

// Release implements backend.Driver: it deletes the lock if g's owner still
// holds it and announces the release to waiters.
func (d *Driver) Release(ctx context.Context, g *backend.Grant) error {
	if d.closed.Load() {
		return errClosed
	}
	if sg, ok := g.Data.(*semGrant); ok {
		return d.releasePermit(ctx, g, sg) // semaphore.go
	}
	if sg, ok := g.Data.(*sharedGrant); ok {
		return d.releaseShared(ctx, g, sg) // shared.go
	}
	k := d.keys(g)
	n, err := d.release(ctx, g.Owner, k).Int64()
	if err != nil {
		return fmt.Errorf("release script: %w", err)
	}
	if n == 0 {
		return backend.ErrNotHeld
	}
	return nil
}
