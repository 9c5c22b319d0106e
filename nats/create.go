package nats

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dlock-go/dlock/backend"
)

// createValue returns the value of h's create.
func (h *hold) createValue() []byte {
	b, _ := json.Marshal(value{Owner: h.owner, Label: h.label, TTLms: h.ttl.Milliseconds()})
	return b
}

// create makes the create-only write of h's key (TTL h.ttl): the revision
// that grants it, 0 and nil if the key is another owner's, or an error.
// After a create of h whose answer was lost (h.unsure), the write is sent
// again: a refusal because the key exists then reads the key, and h's value
// there is the grant of the earlier create.
func (d *Driver) create(ctx context.Context, h *hold) (uint64, error) {
	sent := time.Now()
	rev, err := d.kv.Create(ctx, h.name, h.createValue(), jetstream.KeyTTL(h.ttl))
	switch {
	case err == nil:
		return rev, nil
	case errors.Is(err, jetstream.ErrKeyExists), wrongLastSequence(err):
		// Refused by the create-only check; a clustered stream says so
		// without the sequence (10164), which nats.go does not map.
		if h.unsure.IsZero() {
			return 0, nil
		}
		// This write was refused after the earlier one reached the stream
		// (one connection's publishes to one subject are stored in order),
		// so a read from the stream's leader now sees what that one did. It
		// gets a timeout of its own: a lost answer is mostly a timeout that
		// used up ctx's.
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.timeout)
		defer cancel()
		e, gerr := d.readKey(gctx, h.name)
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound):
		case gerr != nil:
			return 0, gerr
		case e.op == jetstream.KeyValuePut:
			if v, ok := decode(e.value); ok && v.Owner == h.owner {
				return e.rev, nil // attempt settles h.unsure
			}
		}
		h.unsure = time.Time{} // settled: no create of h holds the key
		return 0, nil
	case !definite(err):
		// The write may have been applied with its answer lost.
		if h.unsure.IsZero() {
			h.unsure = sent
		}
	}
	return 0, err
}

// settle tries again, for up to the request timeout and while ctx lasts, a
// create of a non-waiting Acquire whose answer was lost (err), so that the
// caller learns whether it holds the lock rather than leaving one behind.
func (d *Driver) settle(ctx context.Context, req backend.AcquireRequest, h *hold, valid time.Duration, err error) (*backend.Grant, error) {
	end := time.Now().Add(d.timeout)
	var bo backend.Backoff
	for transient(err) && ctx.Err() == nil && time.Now().Before(end) {
		if backend.Sleep(ctx, bo.Next()) != nil {
			break
		}
		var g *backend.Grant
		if g, err = d.attempt(ctx, req, h, valid); g != nil || err == nil {
			return g, err
		}
	}
	return nil, err
}

// giveBack runs after an Acquire that ends without a grant although a create
// of h may have been applied with its answer lost: in the background, it
// sends the create again until the server answers, and purges the key if it
// is h's, so that no lock is left held until its TTL runs out. Close ends it.
func (d *Driver) giveBack(h *hold) {
	d.spawn(func() {
		var bo backend.Backoff
		for {
			ctx, cancel := context.WithTimeout(d.bg, d.timeout)
			rev, err := d.create(ctx, h)
			cancel()
			switch {
			case err == nil && rev != 0:
				h.rev.Store(rev)
				d.purge(h)
				return
			case err == nil, !transient(err), d.bg.Err() != nil:
				return
			}
			if backend.Sleep(d.bg, bo.Next()) != nil {
				return
			}
		}
	})
}
