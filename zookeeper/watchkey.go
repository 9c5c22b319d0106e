package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.Watcher = (*Driver)(nil)

// Watch implements backend.Watcher with a children watch on key's node, as
// Curator's LeaderLatch follows its participants, and a data watch on the
// holder's node, which hears a new label.
func (d *Driver) Watch(ctx context.Context, key string, changed func()) error {
	if d.closed.Load() {
		return errClosed
	}
	parent := LockPath(d.root, key)
	// arm sets the children watch, and the data watch on the holder's node
	// (nil channel: none holds).
	arm := func() (children, data <-chan zk.Event, err error) {
		names, st, ev, err := d.conn.ChildrenW(parent)
		if errors.Is(err, zk.ErrNoNode) {
			var ok bool
			ok, _, ev, err = d.conn.ExistsW(parent)
			if err == nil && ok { // created between the two calls
				names, st, ev, err = d.conn.ChildrenW(parent)
			}
		}
		if err != nil || st == nil {
			return ev, nil, err
		}
		if locks := sortedLocks(names, st.Cversion); len(locks) > 0 {
			_, _, data, err = d.conn.GetW(parent + "/" + locks[holders(locks)-1])
			if errors.Is(err, zk.ErrNoNode) {
				// Gone since the listing: the children watch fires.
				return ev, nil, nil
			}
		}
		return ev, data, err
	}
	ev, data, err := arm()
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
			case e := <-data:
				changed()
				if e.Type == zk.EventNodeDataChanged {
					// Only the holder's data changed: watch it again;
					// the children watch is still set.
					_, _, data, err = d.conn.GetW(e.Path)
					if err == nil {
						continue
					}
					data = nil
					if errors.Is(err, zk.ErrNoNode) {
						continue // the children watch fires
					}
				}
			case <-ctx.Done():
				return
			case <-d.quit:
				return
			}
			for {
				if ev, data, err = arm(); err == nil {
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
