package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.Watcher = (*Driver)(nil)

// Watch implements backend.Watcher: a children watch on key's node (an
// exists watch while it has none), set again each time it fires, as
// Curator's LeaderLatch follows its participants.
func (d *Driver) Watch(ctx context.Context, key string, changed func()) error {
	if d.closed.Load() {
		return errClosed
	}
	parent := LockPath(d.root, key)
	arm := func() (<-chan zk.Event, error) {
		_, _, ev, err := d.conn.ChildrenW(parent)
		if errors.Is(err, zk.ErrNoNode) {
			var ok bool
			ok, _, ev, err = d.conn.ExistsW(parent)
			if err == nil && ok { // created between the two calls
				_, _, ev, err = d.conn.ChildrenW(parent)
			}
		}
		return ev, err
	}
	ev, err := arm()
	if err != nil {
		return fmt.Errorf("watch %s: %w", parent, err)
	}
	d.wg.Add(1)
	go func() { // owned by the driver: Close waits for it
		defer d.wg.Done()
		backoff := backend.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
		for {
			select {
			case <-ev:
				changed()
			case <-ctx.Done():
				return
			case <-d.quit:
				return
			}
			for {
				if ev, err = arm(); err == nil {
					break
				}
				changed() // not watching: something may change unseen
				select {
				case <-time.After(backoff.Next()):
				case <-ctx.Done():
					return
				case <-d.quit:
					return
				}
			}
			backoff.Reset()
		}
	}()
	return nil
}
