package redlock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
)

// grantData is the driver-private part of a Grant.
type grantData struct {
	keys *rediscore.Keys
	// pending counts the grant's acquire requests still running when the
	// quorum was reached. Release waits for them, so that a late acquire
	// cannot set the lock on a node after the release has passed it.
	pending *sync.WaitGroup
	// ttl is the lock keys' TTL: a key set by this grant is gone from every
	// node by ttl after its last extension.
	ttl time.Duration
}

func (d *Driver) grantData(g *backend.Grant) *grantData {
	if gd, ok := g.Data.(*grantData); ok {
		return gd
	}
	return &grantData{keys: rediscore.KeysFor(d.prefix, g.Key)}
}

// attemptKind classifies a failed attempt.
type attemptKind int

const (
	attemptHeld      attemptKind = iota // enough nodes answered; another owner holds the lock on some
	attemptNoQuorum                     // fewer than a quorum of nodes answered
	attemptSlow                         // a quorum granted the lock, but too late
	attemptCancelled                    // ctx ended
)

// attemptResult is the outcome of one round of the algorithm.
type attemptResult struct {
	grant *backend.Grant
	err   error
	kind  attemptKind
	// split is set for attemptHeld when no other owner holds the lock on a
	// quorum of nodes: the vote was split between contenders (or a holder's
	// lock is partly gone).
	split bool
	// first is set for a split vote that this attempt won by plurality: it
	// may try again at once while the other contenders wait.
	first bool
	// expiry is, for attemptHeld, how long until enough holders' TTLs run
	// out for a quorum to be free; -1 if unknown.
	expiry time.Duration
}

// Acquire implements backend.Driver, one round of the algorithm per attempt.
// A waiting Acquire tries again after release messages, holders' TTLs,
// RetryDelay or PollInterval, riding out transient node failures until ctx is
// done; a round whose node errors are all permanent (wrong password) fails
// with ErrNoQuorum.
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	ms, validity, nodeTimeout, err := d.ttlMillis(req.TTL)
	if err != nil {
		return nil, err
	}
	k := rediscore.KeysFor(d.prefix, req.Key)
	a := d.attempt(ctx, req, 0, k, ms, validity, nodeTimeout)
	if a.grant != nil || a.kind == attemptCancelled || !req.Wait {
		return a.grant, a.err
	}
	return d.wait(ctx, req, k, ms, validity, nodeTimeout, a)
}

func (d *Driver) wait(ctx context.Context, req backend.AcquireRequest, k *rediscore.Keys, ms int64, validity, nodeTimeout time.Duration, a attemptResult) (*backend.Grant, error) {
	var w *waiting // subscribed at the first sight of a single holder
	won := false
	defer func() { w.leave(won) }()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	backoff := backend.Backoff{Min: d.retryDelay, Max: d.poll}
	splits := 0 // split votes in a row
	for n := 1; ; n++ {
		var wake <-chan struct{}
		var delay time.Duration
		switch {
		case a.kind == attemptHeld && !a.split && w == nil:
			// Subscribe, and try again as soon as a quorum of subscriptions
			// is confirmed: the holder's release reaches at least a quorum
			// of nodes, which overlaps ours, so a release between the
			// attempt and the subscriptions cannot go unnoticed. Never wait
			// for the confirmations longer than a poll.
			var err error
			if w, err = d.subscribe(k.Channel); err != nil {
				return nil, err
			}
			if err := w.confirmed(ctx, timer, backend.Jitter(d.poll)); err != nil {
				return nil, err
			}
		case a.kind == attemptHeld && !a.split:
			// One holder: wait for its release, or its TTL.
			splits = 0
			backoff.Reset()
			wake = w.wake
			delay = backend.Jitter(d.poll)
			if a.expiry >= 0 {
				delay = min(delay, a.expiry+time.Millisecond)
			}
		case a.kind == attemptHeld:
			// A split vote: fall out of step with the other contenders,
			// deaf to the release messages their give-backs send. The
			// plurality winner of the first split in a row goes at once.
			splits++
			if !a.first || splits > 1 {
				delay = backoff.Next()
			}
		default:
			// Too few nodes answered. Nodes down or restarting come back:
			// keep waiting, as Acquire promises, until ctx ends.
			// (A quorum that granted too late is a matter of timing: try again.)
			splits = 0
			if a.kind == attemptNoQuorum && !transientRound(ctx, a.err) {
				return nil, a.err
			}
			delay = backoff.Next()
		}
		if delay > 0 {
			timer.Reset(delay)
			select {
			case <-wake:
			case <-timer.C:
			case <-ctx.Done():
				if a.kind == attemptNoQuorum || a.kind == attemptSlow {
					return nil, fmt.Errorf("%w (while too few nodes answered: %w)", ctx.Err(), a.err)
				}
				return nil, ctx.Err()
			case <-d.quit:
				return nil, errClosed
			}
		}
		a = d.attempt(ctx, req, n, k, ms, validity, nodeTimeout)
		if a.grant != nil {
			won = true
			return a.grant, nil
		}
		if a.kind == attemptCancelled {
			return nil, a.err
		}
	}
}

// transientRound reports whether a round that reached too few nodes is worth
// another: whether some node's failure is transient (see
// rediscore.Transient), a request that ran out of its own node timeout
// counting as transient while ctx is live.
func transientRound(ctx context.Context, err error) bool {
	var nodes *multierror.Error
	if !errors.As(err, &nodes) {
		return rediscore.Transient(err)
	}
	for _, e := range nodes.Errors {
		if rediscore.Transient(e) || ctx.Err() == nil && errors.Is(e, context.DeadlineExceeded) {
			return true
		}
	}
	return false
}

// attempt runs round number round (0, 1, …) of the algorithm: the acquire script on
// every node in parallel; a grant if a quorum granted the lock with
// validity left; otherwise a release on every node that may hold it for
// this round's owner. It leaves nothing behind when it fails or when ctx
// ends while the grant is in flight.
//
// Each round takes the lock under an owner of its own (req.Owner, then
// req.Owner.1, .2, …): a failed round's release that a slow node runs after
// the client stopped waiting for it (a command already sent is still
// executed) must not delete the lock a later round of the same Acquire won
// there.
func (d *Driver) attempt(ctx context.Context, req backend.AcquireRequest, round int, k *rediscore.Keys, ms int64, validity, nodeTimeout time.Duration) attemptResult {
	if err := ctx.Err(); err != nil {
		return attemptResult{err: err, kind: attemptCancelled}
	}
	// The lock's value names the holder: its owner ID, and its label after a
	// space (see Inspect). Every script compares the whole value.
	if round > 0 {
		req.Owner += "." + strconv.Itoa(round)
	}
	req.Owner = rediscore.HolderValue(req.Owner, req.Label)
	if done, ok := d.releasing.Load(k.Lock); ok {
		// This driver's release of the key has not reached every node yet:
		// let it, or it could refuse this grant there. A slow node gets
		// until the release's deadline, so do not wait past ctx for it.
		select {
		case <-done.(chan struct{}):
		case <-ctx.Done():
			return attemptResult{err: ctx.Err(), kind: attemptCancelled}
		}
	}
	start := time.Now()
	g := d.fanout(ctx, d.nodes, nodeTimeout, func(ctx context.Context, n *node) reply {
		res, err := rediscore.Acquire.Run(ctx, n.client, []string{k.Lock, k.Fence}, req.Owner, ms, "holder", k.Channel).Slice()
		if err != nil {
			return failure(fmt.Errorf("acquire script: %w", err))
		}
		var r reply
		ok := len(res) >= 2
		if ok {
			var won int64
			won, ok = res[0].(int64)
			r.val, _ = res[1].(int64)
			switch {
			case ok && won == 1 && len(res) == 2:
				r.out = granted
			case ok && won == 0 && len(res) == 3:
				r.out = refused
				r.holder, ok = res[2].(string)
			default:
				ok = false
			}
		}
		if !ok {
			return reply{out: failed, maybe: true, err: fmt.Errorf("acquire script: unexpected reply %v", res)}
		}
		return r
	}, nil)
	t := g.collect(func(t *tally) bool { return t.granted >= d.quorum })
	elapsed := time.Since(start)
	if t.granted >= d.quorum && elapsed < validity && ctx.Err() == nil {
		var token int64
		for _, r := range t.replies {
			if r.out == granted {
				token = max(token, r.val)
			}
		}
		return attemptResult{grant: &backend.Grant{
			Key:      req.Key,
			Owner:    req.Owner,
			Token:    uint64(token),
			Start:    start,
			Validity: validity,
			Data:     &grantData{keys: k, pending: g.pending, ttl: req.TTL},
		}}
	}

	// Failed: hear from every node, then give the lock back wherever it may
	// be this owner's, including the nodes that did not answer.
	t = g.collect(nil)
	d.giveBack(ctx, req.Owner, k, t, nodeTimeout, req.TTL)

	n := len(d.nodes)
	switch {
	case ctx.Err() != nil:
		return attemptResult{err: ctx.Err(), kind: attemptCancelled}
	case t.granted >= d.quorum:
		return attemptResult{kind: attemptSlow, err: fmt.Errorf(
			"%w in time: %d of %d nodes granted the lock, but only after %v, past its validity of %v (TTL %v less the drift allowance %v); released it",
			ErrNoQuorum, t.granted, n, elapsed.Round(time.Microsecond), validity, time.Duration(ms)*time.Millisecond, d.drift(req.TTL))}
	case t.granted+t.refused < d.quorum:
		return attemptResult{kind: attemptNoQuorum, err: d.noQuorum("granted", t, errNodeHeld)}
	}
	// One holder with a quorum explains the failure: wait for its release or
	// its expiry. Otherwise the vote was split between contenders (or a
	// holder is partly gone): retry after a random delay.
	a := attemptResult{kind: attemptHeld, expiry: -1, split: true}
	held := map[string]int{}
	for _, r := range t.replies {
		if r.out == refused {
			held[r.holder]++
			if held[r.holder] >= d.quorum {
				a.split = false
			}
		}
	}
	if a.split && t.granted > 0 {
		// Every contender sees the same split (each node granted one of
		// them), so they agree on its plurality winner: the one with the
		// most nodes, ties going to the lowest owner id.
		a.first = true
		for holder, n := range held {
			if n > t.granted || n == t.granted && holder < req.Owner {
				a.first = false
			}
		}
	}
	// The lock can be free once enough of the holders' keys expire for a
	// quorum of nodes not to hold it.
	var pttls []time.Duration
	for _, r := range t.replies {
		if r.out == refused {
			p := time.Duration(math.MaxInt64)
			if r.val >= 0 {
				p = time.Duration(r.val) * time.Millisecond
			} else if r.val == -2 { // expired since
				p = 0
			}
			pttls = append(pttls, p)
		}
	}
	slices.Sort(pttls)
	if need := d.quorum - (n - t.refused); need > 0 && pttls[need-1] != math.MaxInt64 {
		a.expiry = pttls[need-1]
	}
	msg := fmt.Sprintf(" on %d of %d nodes", t.refused, n)
	switch {
	case a.split:
		msg += ", but by no one owner on a quorum (contended)"
	case a.expiry >= 0:
		msg += fmt.Sprintf(" (free on a quorum in %v unless renewed)", a.expiry)
	}
	if t.failed > 0 {
		a.err = fmt.Errorf("%w%s; %d failed: %w", backend.ErrHeld, msg, t.failed, d.causes(t, nil))
	} else {
		a.err = fmt.Errorf("%w%s", backend.ErrHeld, msg)
	}
	return a
}

// giveBack releases owner's lock on every node where an attempt may have set
// it: those that granted it and those whose request failed after it may have
// reached them. Like every fanout it ignores ctx's cancellation (a cancelled
// caller must not leave a lock behind); the attempt waits for one try on each
// node, bounded by the node timeout, and the nodes where that failed are
// retried in the background until they answer, ttl has passed or the driver
// closes (see finishRelease). A node that failed the acquire by answering
// late (stalled, loaded) may run it after the client gave up, and fail the
// give-back the same way: without the retries the lock would stay there for
// its TTL, after Close too. The give-back starts once every acquire request has returned, and go-redis
// closes the connection of one that timed out, so the node has received the
// acquire, if it was sent at all, before any try of the give-back.
func (d *Driver) giveBack(ctx context.Context, owner string, k *rediscore.Keys, t *tally, nodeTimeout, ttl time.Duration) {
	var nodes []*node
	for _, r := range t.replies {
		if r.out == granted || r.out == failed && r.maybe {
			nodes = append(nodes, r.node)
		}
	}
	if len(nodes) == 0 {
		return
	}
	op := func(ctx context.Context, n *node) reply {
		if err := rediscore.Release.Run(ctx, n.client, []string{k.Lock}, owner, k.Channel).Err(); err != nil {
			return failure(err)
		}
		return reply{out: granted}
	}
	gt := d.fanout(ctx, nodes, nodeTimeout, op, nil)
	gt.collect(nil)
	d.finishRelease(gt, op, ttl)
}

// Refresh implements backend.Driver: it succeeds if a quorum extended the
// lock within the validity counted from its send time. It fails with
// backend.ErrNotHeld if too few nodes still hold it for a quorum, else with
// ErrNoQuorum if too few answered.
func (d *Driver) Refresh(ctx context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	if d.closed.Load() {
		return 0, errClosed
	}
	ms, validity, nodeTimeout, err := d.ttlMillis(ttl)
	if err != nil {
		return 0, err
	}
	k := d.grantData(g).keys
	token := strconv.FormatUint(g.Token, 10)
	start := time.Now()
	t := d.fanout(ctx, d.nodes, nodeTimeout, func(ctx context.Context, n *node) reply {
		v, err := rediscore.Extend.Run(ctx, n.client, []string{k.Lock, k.Fence}, g.Owner, ms, token).Int64()
		switch {
		case err != nil:
			return failure(fmt.Errorf("extend script: %w", err))
		case v == 1:
			return reply{out: granted}
		}
		return reply{out: refused}
	}, nil).collect(func(t *tally) bool { return t.granted >= d.quorum })
	elapsed := time.Since(start)
	switch {
	case t.granted >= d.quorum && elapsed < validity:
		return validity, nil
	case t.granted >= d.quorum:
		return 0, fmt.Errorf("%w in time: the lock was extended on a quorum, but only after %v, past its validity of %v",
			ErrNoQuorum, elapsed.Round(time.Microsecond), validity)
	case t.refused >= len(d.nodes)-d.quorum+1:
		return 0, fmt.Errorf("%w on %d of %d nodes: %w", backend.ErrNotHeld, t.refused, len(d.nodes), d.causes(t, errNodeNotHeld))
	}
	return 0, d.noQuorum("extended", t, errNodeNotHeld)
}

// Relabel implements backend.Relabeler: it succeeds if a quorum of nodes
// took the new value; else it sets those that did back and fails with
// backend.ErrNotHeld if too few still hold the lock, or ErrNoQuorum.
func (d *Driver) Relabel(ctx context.Context, g *backend.Grant, label string) error {
	if d.closed.Load() {
		return errClosed
	}
	gd := d.grantData(g)
	k := gd.keys
	owner, _ := rediscore.SplitHolder(g.Owner)
	from, to := g.Owner, rediscore.HolderValue(owner, label)
	nodeTimeout := max(d.nodeTimeout, time.Until(deadlineOr(ctx)))
	relabel := func(from, to string) func(context.Context, *node) reply {
		return func(ctx context.Context, n *node) reply {
			v, err := rediscore.Relabel.Run(ctx, n.client, []string{k.Lock}, from, to, k.Channel).Int64()
			switch {
			case err != nil:
				return failure(fmt.Errorf("relabel script: %w", err))
			case v == 1:
				return reply{out: granted}
			}
			return reply{out: refused}
		}
	}
	t := d.fanout(ctx, d.nodes, nodeTimeout, relabel(from, to), nil).collect(nil)
	if t.granted >= d.quorum {
		g.Owner = to
		return nil
	}
	var changed []*node
	for _, r := range t.replies {
		if r.out == granted || r.maybe {
			changed = append(changed, r.node)
		}
	}
	if len(changed) > 0 {
		d.fanout(ctx, changed, d.nodeTimeout, relabel(to, from), nil).collect(nil)
	}
	if t.refused >= len(d.nodes)-d.quorum+1 {
		return fmt.Errorf("%w on %d of %d nodes: %w", backend.ErrNotHeld, t.refused, len(d.nodes), d.causes(t, errNodeNotHeld))
	}
	return d.noQuorum("relabelled", t, errNodeNotHeld)
}

// deadlineOr is ctx's deadline, or now if it has none.
func deadlineOr(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now()
}

// Release implements backend.Driver: it returns nil once a quorum deleted
// the lock, and retries the failed nodes in the background until the key's
// TTL has passed. It fails with backend.ErrNotHeld if too few nodes held it
// for a quorum, else with ErrNoQuorum.
func (d *Driver) Release(ctx context.Context, g *backend.Grant) error {
	if d.closed.Load() {
		return errClosed
	}
	gd := d.grantData(g)
	if gd.pending != nil {
		gd.pending.Wait()
	}
	k := gd.keys
	token := strconv.FormatUint(g.Token, 10)
	// Return once a quorum has deleted the lock; until the other nodes have
	// answered too, this driver's next attempt on the key waits for them.
	finished := make(chan struct{})
	d.releasing.Store(k.Lock, finished)
	// A release is not racing a validity, so a slow node gets as long as
	// ctx allows (dlock bounds it by WithReleaseTimeout, 5s by default), not
	// just the node timeout: a release that fails leaves the key locked for
	// the rest of its TTL.
	timeout := d.nodeTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) > timeout {
		timeout = time.Until(dl)
	}
	op := releaseOp(g.Owner, k, token)
	gt := d.fanout(ctx, d.nodes, timeout, op, func() {
		close(finished)
		d.releasing.CompareAndDelete(k.Lock, finished)
	})
	// A copy: finishRelease goes on collecting into gt's tally.
	res := *gt.collect(func(t *tally) bool { return t.granted >= d.quorum })
	res.replies = slices.Clone(res.replies)
	t := &res
	d.finishRelease(gt, op, gd.ttl)
	switch {
	case t.granted >= d.quorum:
		return nil
	case t.refused >= len(d.nodes)-d.quorum+1:
		return fmt.Errorf("%w on %d of %d nodes: %w", backend.ErrNotHeld, t.refused, len(d.nodes), d.causes(t, errNodeNotHeld))
	}
	return d.noQuorum("released", t, errNodeNotHeld)
}

// releaseOp is the release script for one node: owner-checked DEL, the
// release announcement, the fence counter raised to token.
func releaseOp(owner string, k *rediscore.Keys, token string) func(context.Context, *node) reply {
	return func(ctx context.Context, n *node) reply {
		v, err := rediscore.Release.Run(ctx, n.client, []string{k.Lock, k.Fence}, owner, k.Channel, token).Int64()
		switch {
		case err != nil:
			return failure(fmt.Errorf("release script: %w", err))
		case v == 1:
			return reply{out: granted}
		}
		return reply{out: refused}
	}
}

// closeGrace bounds the last try Close lets a background release make.
const closeGrace = 2 * time.Second

// finishRelease completes a release (or a give-back) on the nodes where it
// failed: a node that was down, restarting or stalled may still hold the key
// (or get it back from its append-only file, or run the acquire it had not
// answered), and would keep every other client out until the key's TTL. It
// retries those nodes with backoff until each has answered, or ttl has
// passed (the key has expired there by then, unless the node stalled all that
// time and runs a late acquire when it resumes), or the driver closes (then
// it makes a last try, bounded by closeGrace). It runs in the background only
// where a node's request was still running or failed; a release every node
// answered costs nothing more.
func (d *Driver) finishRelease(gt *gather, op func(context.Context, *node) reply, ttl time.Duration) {
	if gt.left == 0 && gt.tally.failed == 0 {
		return
	}
	d.finishMu.Lock()
	if d.noFinish { // Close is waiting for the others; this one is too late
		d.finishMu.Unlock()
		return
	}
	d.finishing.Add(1)
	d.finishMu.Unlock()
	go func() {
		defer d.finishing.Done()
		until := time.Now().Add(ttl)
		retry := failedNodes(gt.collect(nil))
		b := backend.Backoff{Min: d.retryDelay, Max: d.poll}
		timer := time.NewTimer(0)
		defer timer.Stop()
		<-timer.C
		for len(retry) > 0 && time.Now().Before(until) {
			timeout := d.nodeTimeout
			timer.Reset(b.Next())
			select {
			case <-timer.C:
			case <-d.quit:
				timeout = closeGrace
				until = time.Now() // this pass is the last
			}
			retry = failedNodes(d.fanout(context.Background(), retry, max(timeout, time.Second), op, nil).collect(nil))
		}
	}()
}

// failedNodes lists the nodes whose reply in t failed.
func failedNodes(t *tally) []*node {
	var ns []*node
	for _, r := range t.replies {
		if r.out == failed {
			ns = append(ns, r.node)
		}
	}
	return ns
}

// waiting is one waiting Acquire's subscriptions to a key's release channel,
// one per node, sharing one wake channel.
type waiting struct {
	d     *Driver
	wake  chan struct{} // buffered(1): some node announced a release
	ready chan struct{} // buffered(N): one send per confirmed subscription
	subs  []*rediscore.Waiter
}

func (d *Driver) subscribe(channel string) (*waiting, error) {
	w := &waiting{d: d, wake: make(chan struct{}, 1), ready: make(chan struct{}, len(d.nodes))}
	for _, n := range d.nodes {
		s, err := n.mux.Subscribe(channel, w.wake, w.ready)
		if err != nil {
			w.leave(false)
			return nil, err
		}
		w.subs = append(w.subs, s)
	}
	return w, nil
}

// confirmed waits until a quorum of the subscriptions is confirmed, or for
// at most bound.
func (w *waiting) confirmed(ctx context.Context, timer *time.Timer, bound time.Duration) error {
	timer.Reset(bound)
	for n := 0; n < w.d.quorum; n++ {
		select {
		case <-w.ready:
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-w.d.quit:
			return errClosed
		}
	}
	timer.Stop()
	return nil
}

// leave unsubscribes from every node. w may be nil.
func (w *waiting) leave(won bool) {
	if w == nil {
		return
	}
	for i, s := range w.subs {
		w.d.nodes[i].mux.Unsubscribe(s, won)
	}
}
