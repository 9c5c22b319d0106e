package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/backend"
)

var _ backend.Watcher = (*Driver)(nil)

// Watch implements backend.Watcher with one etcd watch on the keys under
// key's lock name; a watch that ends is reported as a change and started
// again after a pause.
func (d *Driver) Watch(ctx context.Context, key string, changed func()) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return errClosed
	}
	d.wg.Add(1)
	d.mu.Unlock()
	name := LockName(d.prefix, key) + "/"
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	stop := context.AfterFunc(d.bg, cancel)
	start := func() (clientv3.WatchChan, error) {
		wch := d.cli.Watch(wctx, name, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		timer := time.NewTimer(d.timeout)
		defer timer.Stop()
		select {
		case resp, ok := <-wch:
			switch {
			case !ok:
				return nil, errors.New("the watch ended before it started")
			case resp.Err() != nil:
				return nil, resp.Err()
			}
			return wch, nil
		case <-timer.C:
			return nil, fmt.Errorf("no answer within %v", d.timeout)
		}
	}
	wch, err := start()
	if err != nil {
		stop()
		cancel()
		d.wg.Done()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("watch %s: %w", name, err)
	}
	go func() { // owned by the driver: Close waits for it
		defer d.wg.Done()
		defer cancel()
		defer stop()
		backoff := backend.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
		for {
			for resp := range wch {
				if len(resp.Events) > 0 {
					changed()
				}
			}
			if wctx.Err() != nil {
				return
			}
			changed() // it broke: something may have changed meanwhile
			for {
				if backend.Sleep(wctx, backoff.Next()) != nil {
					return
				}
				if wch, err = start(); err == nil {
					break
				}
			}
			backoff.Reset()
			changed()
		}
	}()
	return nil
}
