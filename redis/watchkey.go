package redis

import (
	"context"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
)

var _ backend.Watcher = (*Driver)(nil)

// Watch implements backend.Watcher through the key's release channel:
// grants, releases, breaks and reconnects are reported; expiries are not, nor
// the grants of clients that do not publish them (Redlock).
func (d *Driver) Watch(ctx context.Context, key string, changed func()) error {
	if d.closed.Load() {
		return errClosed
	}
	k := rediscore.KeysFor(d.prefix, key)
	wake, ready := make(chan struct{}, 1), make(chan struct{}, 1)
	w, err := d.mux.Observe(k.Channel, wake, ready)
	if err != nil {
		return err
	}
	select {
	case <-ready:
	case <-ctx.Done():
		d.mux.Unsubscribe(w, true)
		return ctx.Err()
	case <-d.mux.Done():
		d.mux.Unsubscribe(w, true)
		return errClosed
	}
	d.watches.Add(1)
	go func() { // owned by the driver: Close waits for it
		defer d.watches.Done()
		defer d.mux.Unsubscribe(w, true)
		for {
			select {
			case <-wake:
				changed()
			case <-ctx.Done():
				return
			case <-d.mux.Done():
				return
			}
		}
	}()
	return nil
}
