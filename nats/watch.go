package nats

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dlock-go/dlock/backend"
)

// watchLoss watches h's key from its current state on, until h is released
// or the driver closed, and reports the lock lost (hold.markLost) at the
// first state that is not the holder's: a delete, a purge, an expiry's
// marker, another owner's write.
func (d *Driver) watchLoss(h *hold) {
	ctx, stop := context.WithCancel(d.bg)
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		stop()
		return
	}
	h.stop = stop
	h.mu.Unlock()
	d.spawn(func() {
		defer stop()
		var bo backend.Backoff
		for ctx.Err() == nil {
			w, err := d.kv.Watch(ctx, h.name)
			if err != nil {
				_ = backend.Sleep(ctx, bo.Next())
				continue
			}
			bo.Reset()
			if lost := d.follow(ctx, h, w); lost != nil {
				_ = w.Stop()
				h.markLost(lost)
				return
			}
			_ = w.Stop()
		}
	})
}

// follow reads w until ctx ends or w does (nil), or a state that is not h's
// (the cause of the loss).
func (d *Driver) follow(ctx context.Context, h *hold, w jetstream.KeyWatcher) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return nil
			case e == nil: // the initial state is delivered
				continue
			case e.Operation() != jetstream.KeyValuePut:
				return fmt.Errorf("key %s %s at revision %d: %w", h.name, opName(e.Operation()), e.Revision(), backend.ErrNotHeld)
			}
			if v, ok := decode(e.Value()); !ok || v.Owner != h.owner {
				return fmt.Errorf("key %s written by another owner at revision %d: %w", h.name, e.Revision(), backend.ErrNotHeld)
			}
			if e.Revision() == h.token {
				h.granted.Store(e.Created().UnixNano())
			}
		}
	}
}

func opName(op jetstream.KeyValueOp) string {
	if op == jetstream.KeyValueDelete {
		return "deleted"
	}
	return "purged or expired"
}
