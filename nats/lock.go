package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dlock-go/dlock/backend"
)

// value is a lock key's value, JSON: who holds it, the TTL of the write
// and, in the writes after the create, the grant's token (the create's
// revision) and its time by the server's clock (Unix nanoseconds; 0 when
// unknown).
type value struct {
	Owner   string `json:"owner"`
	Label   string `json:"label,omitempty"`
	TTLms   int64  `json:"ttl_ms,omitempty"`
	Token   uint64 `json:"token,omitempty"`
	Granted int64  `json:"granted,omitempty"`
}

func decode(b []byte) (value, bool) {
	var v value
	if err := json.Unmarshal(b, &v); err != nil || v.Owner == "" {
		return value{}, false
	}
	return v, true
}

// hold is a granted lock's state, the Grant's Data.
type hold struct {
	name   string // the bucket key (KeyName)
	owner  string
	label  string
	token  uint64        // the create's revision
	rev    atomic.Uint64 // the revision of the holder's last write
	onLost func(cause error)

	granted atomic.Int64  // the create's time, Unix nanoseconds by the server's clock; 0 until the loss watch reads it
	ttl     time.Duration // the TTL of the last write (whole seconds)
	unsure  time.Time     // when the first create whose answer was lost was sent; zero if none was

	mu       sync.Mutex
	released bool
	lost     bool
	stop     func() // ends the loss watch

	sub *sub // the registration on the driver's watch, made by Acquire
}

// value returns the value of a write after the create.
func (h *hold) value(label string, ttl time.Duration) []byte {
	b, _ := json.Marshal(value{Owner: h.owner, Label: label, TTLms: ttl.Milliseconds(), Token: h.token, Granted: h.granted.Load()})
	return b
}

// markLost tells dlock, once, that the lock is gone, unless it was released.
func (h *hold) markLost(cause error) {
	h.mu.Lock()
	report := !h.released && !h.lost
	h.lost = true
	h.mu.Unlock()
	if report && h.onLost != nil {
		h.onLost(cause)
	}
}

// ttlSeconds rounds ttl up to whole seconds: nats-server counts a message's
// TTL in whole seconds, at least one, and drops the fraction.
func ttlSeconds(ttl time.Duration) time.Duration {
	s := (ttl + time.Second - 1) / time.Second
	return max(s, 1) * time.Second
}

// validity is what a write of ttl gives: the server keeps the key at least
// ttlSeconds(ttl) ≥ ttl after it stored it, which is after the write was sent.
func validity(ttl time.Duration) (time.Duration, error) {
	v := ttl - backend.DriftAllowance(ttl)
	if v <= 0 {
		return 0, fmt.Errorf("%w: ttl %v is too short", backend.ErrInvalidOption, ttl)
	}
	return v, nil
}

// reqCtx returns the context of one write: ctx's values, the driver's request
// timeout, and an end cancelGrace after ctx's, so that the answer of a write
// racing ctx's end says what it did.
func (d *Driver) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.timeout)
	if ctx.Done() == nil {
		return rctx, cancel
	}
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(cancelGrace, cancel) })
	return rctx, func() { stop(); cancel() }
}

// definite reports whether err is the server's answer (the write was refused),
// as opposed to a lost or missing answer, after which the write may have
// been applied.
func definite(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) || errors.Is(err, natsgo.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrInvalidKey) || errors.Is(err, natsgo.ErrConnectionClosed)
}

// wrongLastSequence reports whether err is the server refusing a write
// whose expected last sequence did not match, in either of its forms.
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// revisionMismatch reports whether a write conditional on a revision was
// refused because the key has another, in any of the forms nats.go and the
// server give it.
func revisionMismatch(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) || wrongLastSequence(err)
}

// transient reports whether err may go away by itself: a timeout, a
// reconnection, a stream without a leader.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503 || apiErr.Code == 408
	}
	if err != nil && strings.Contains(err.Error(), "temporarily unavailable") {
		return true // the server's 503 (10008) after a leader change, as text only
	}
	return errors.Is(err, natsgo.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, natsgo.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, natsgo.ErrConnectionReconnecting) || errors.Is(err, natsgo.ErrDisconnected)
}

// Acquire implements backend.Driver. A waiting Acquire watches the key and
// tries again each time it is deleted or expires (and at least every poll
// interval), riding out transient errors until ctx is done.
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	if req.Shared || req.Permits > 0 {
		return nil, errors.ErrUnsupported
	}
	valid, err := validity(req.TTL)
	if err != nil {
		return nil, err
	}
	h := &hold{name: KeyName(req.Key), owner: req.Owner, label: req.Label, onLost: req.OnLost}
	// Registered before the first write, so that the watch sees what
	// follows it; a grant keeps it as its loss watch (watchLoss).
	h.sub = d.watch.add(h)
	var g *backend.Grant
	defer func() {
		if g == nil {
			d.watch.remove(h.sub)
			if !h.unsure.IsZero() {
				d.giveBack(h)
			}
		}
	}()
	if !req.Wait {
		g, err = d.attempt(ctx, req, h, valid)
		if g == nil && err != nil && !h.unsure.IsZero() {
			g, err = d.settle(ctx, req, h, valid, err)
		}
		switch {
		case g != nil:
			return g, nil
		case err == nil:
			return nil, backend.ErrHeld
		}
		return nil, waitEnded(ctx, err)
	}
	g, err = d.wait(ctx, req, h, valid)
	return g, err
}

// attempt makes one create-only write of the lock's key: the grant, nil and
// nil if the key exists, or an error. A grant racing ctx's end is given back,
// and ctx's error returned.
func (d *Driver) attempt(ctx context.Context, req backend.AcquireRequest, h *hold, valid time.Duration) (*backend.Grant, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h.ttl = ttlSeconds(req.TTL)
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	rev, err := d.create(rctx, h)
	switch {
	case err != nil:
		return nil, err
	case rev == 0:
		return nil, nil
	}
	if !h.unsure.IsZero() {
		start = h.unsure // the grant may be an earlier create's
		h.unsure = time.Time{}
	}
	h.token = rev
	h.rev.Store(rev)
	if ctx.Err() != nil {
		d.purge(h)
		return nil, ctx.Err()
	}
	d.watchLoss(h)
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    rev,
		Start:    start,
		Validity: valid,
		Data:     h,
	}, nil
}

// wait is Acquire's waiting loop: it makes an attempt at once, then
// whenever the driver's watch reports the key deleted, purged or expired
// (h.sub.wake), and at least every poll interval.
func (d *Driver) wait(ctx context.Context, req backend.AcquireRequest, h *hold, valid time.Duration) (*backend.Grant, error) {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(d.bg, stop)() // Close ends the wait
	var bo backend.Backoff
	var lastErr error
	try := true // attempt now
	for {
		if d.closed.Load() {
			return nil, errClosed
		}
		if try {
			g, err := d.attempt(ctx, req, h, valid)
			switch {
			case g != nil:
				return g, nil
			case err != nil && (!transient(err) || ctx.Err() != nil):
				if d.closed.Load() {
					return nil, errClosed
				}
				return nil, waitEnded(ctx, err)
			case err != nil:
				lastErr = err
			default:
				lastErr = nil
				bo.Reset()
			}
		}
		next := backend.Jitter(d.poll)
		if lastErr != nil {
			next = min(next, bo.Next())
		}
		try = false
		timer := time.NewTimer(next)
		select {
		case <-wctx.Done():
			timer.Stop()
			if d.closed.Load() {
				return nil, errClosed
			}
			return nil, waitEnded(ctx, lastErr)
		case <-timer.C:
			try = true
		case <-h.sub.wake:
			timer.Stop()
			try = true
		}
	}
}

// waitEnded returns ctx's error once ctx is done, keeping err (the last
// transient error) beside it.
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

// Refresh implements backend.Driver: a write of the key conditional on the
// holder's last revision, with a new TTL. When that revision is stale
// because an earlier refresh was applied with its answer lost, it reads the
// key, and carries on if the key is still the holder's.
func (d *Driver) Refresh(ctx context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	h, ok := g.Data.(*hold)
	if !ok {
		return 0, fmt.Errorf("nats driver: grant of another driver")
	}
	valid, err := validity(ttl)
	if err != nil {
		return 0, err
	}
	b := h.value(h.label, ttlSeconds(ttl))
	var bo backend.Backoff
	for {
		rctx, cancel := context.WithTimeout(ctx, d.timeout)
		rev := h.rev.Load()
		pa, err := d.js.PublishMsg(rctx, &natsgo.Msg{Subject: d.subject + h.name, Data: b},
			jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttlSeconds(ttl)))
		if err == nil {
			cancel()
			h.rev.Store(pa.Sequence)
			h.ttl = ttlSeconds(ttl)
			return valid, nil
		}
		if wrongLastSequence(err) {
			e, gerr := d.readKey(rctx, h.name)
			cancel()
			switch {
			case errors.Is(gerr, jetstream.ErrKeyNotFound), gerr == nil && e.op != jetstream.KeyValuePut:
				return 0, fmt.Errorf("key %s deleted: %w", h.name, backend.ErrNotHeld)
			case gerr != nil:
				err = gerr
			default:
				if v, ok := decode(e.value); !ok || v.Owner != h.owner || e.rev == rev {
					return 0, fmt.Errorf("key %s taken: %w", h.name, backend.ErrNotHeld)
				}
				h.rev.Store(e.rev) // an earlier refresh was applied
				continue
			}
		} else {
			cancel()
		}
		if !transient(err) || ctx.Err() != nil {
			return 0, waitEnded(ctx, err)
		}
		if err := backend.Sleep(ctx, bo.Next()); err != nil {
			return 0, waitEnded(ctx, err)
		}
	}
}

// Release implements backend.Driver: a purge of the key conditional on the
// holder's last revision, leaving a marker that expires.
func (d *Driver) Release(ctx context.Context, g *backend.Grant) error {
	h, ok := g.Data.(*hold)
	if !ok {
		return fmt.Errorf("nats driver: grant of another driver")
	}
	h.mu.Lock()
	h.released = true
	stop := h.stop
	h.mu.Unlock()
	if stop != nil {
		stop()
	}
	rctx, cancel := d.reqCtx(ctx)
	defer cancel()
	for {
		rev := h.rev.Load()
		err := d.kv.Purge(rctx, h.name, jetstream.LastRevision(rev), jetstream.PurgeTTL(d.markerTTL))
		if err == nil {
			return nil
		}
		if !revisionMismatch(err) {
			return err
		}
		e, gerr := d.readKey(rctx, h.name)
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound), gerr == nil && e.op != jetstream.KeyValuePut:
			return fmt.Errorf("key %s deleted: %w", h.name, backend.ErrNotHeld)
		case gerr != nil:
			return gerr
		}
		if v, ok := decode(e.value); !ok || v.Owner != h.owner || e.rev == rev {
			return fmt.Errorf("key %s taken: %w", h.name, backend.ErrNotHeld)
		}
		h.rev.Store(e.rev) // a refresh was applied with its answer lost
	}
}

// purge gives back a grant that raced its caller's end.
func (d *Driver) purge(h *hold) {
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	h.mu.Lock()
	h.released = true
	h.mu.Unlock()
	_ = d.kv.Purge(ctx, h.name, jetstream.LastRevision(h.rev.Load()), jetstream.PurgeTTL(d.markerTTL))
}
