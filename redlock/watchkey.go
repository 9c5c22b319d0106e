package redlock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
)

var _ backend.Watcher = (*Driver)(nil)

// Watch implements backend.Watcher through the key's release channel on
// every node: grants, relabels, releases, breaks and reconnects are
// reported, expiries are not. It returns once a quorum of subscriptions is
// confirmed, or after a second.
func (d *Driver) Watch(ctx context.Context, key string, changed func()) error {
	if d.closed.Load() {
		return errClosed
	}
	k := rediscore.KeysFor(d.prefix, key)
	wake, ready := make(chan struct{}, 1), make(chan struct{}, len(d.nodes))
	subs := make([]*rediscore.Waiter, 0, len(d.nodes))
	leave := func() {
		for i, s := range subs {
			d.nodes[i].mux.Unsubscribe(s, true)
		}
	}
	for _, n := range d.nodes {
		s, err := n.mux.Observe(k.Channel, wake, ready)
		if err != nil {
			leave()
			return err
		}
		subs = append(subs, s)
	}
	timer := time.NewTimer(watchConfirmBound)
	defer timer.Stop()
	for range d.quorum {
		select {
		case <-ready:
		case <-timer.C:
		case <-ctx.Done():
			leave()
			return ctx.Err()
		case <-d.quit:
			leave()
			return errClosed
		}
	}
	d.watches.Add(1)
	go func() { // owned by the driver: Close waits for it
		defer d.watches.Done()
		defer leave()
		for {
			select {
			case <-wake:
				changed()
			case <-ctx.Done():
				return
			case <-d.quit:
				return
			}
		}
	}()
	return nil
}

// watchConfirmBound is the longest Watch waits for a quorum of its
// subscriptions to be confirmed.
const watchConfirmBound = time.Second
