package nats

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dlock-go/dlock/backend"
)

var (
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
	_ backend.Watcher   = (*Driver)(nil)
	_ backend.Relabeler = (*Driver)(nil)
)

// Inspect implements backend.Inspector: the key's value names the holder,
// its token and TTL. Waiters are not counted (-1): the bucket does not record
// them.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	if d.closed.Load() {
		return backend.LockInfo{}, errClosed
	}
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	e, err := d.kv.Get(rctx, KeyName(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return backend.LockInfo{Key: key, Waiters: -1}, nil
	}
	if err != nil {
		return backend.LockInfo{}, err
	}
	return info(key, e), nil
}

// info is what entry e, the key's current value, says of key's lock.
func info(key string, e jetstream.KeyValueEntry) backend.LockInfo {
	li := backend.LockInfo{Key: key, Held: true, Waiters: -1}
	v, ok := decode(e.Value())
	if !ok { // another client's create-only write: held, by someone else
		li.Token = e.Revision()
		li.Granted = e.Created()
		return li
	}
	li.Owner, li.Label = v.Owner, v.Label
	if v.Token == 0 { // the create itself
		li.Token, li.Granted = e.Revision(), e.Created()
	} else {
		li.Token = v.Token
		if v.Granted != 0 {
			li.Granted = time.Unix(0, v.Granted)
		}
	}
	if v.TTLms > 0 {
		li.Expires = e.Created().Add(time.Duration(v.TTLms) * time.Millisecond)
	}
	return li
}

// List implements backend.Inspector: every key of the bucket whose lock key
// starts with prefix, read one by one.
func (d *Driver) List(ctx context.Context, prefix string) ([]backend.LockInfo, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	lister, err := d.kv.ListKeys(rctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = lister.Stop() }()
	pre := KeyName(prefix)
	var names []string
	for name := range lister.Keys() {
		if strings.HasPrefix(name, pre) {
			names = append(names, name)
		}
	}
	slices.Sort(names) // the escaping keeps the keys' order
	var infos []backend.LockInfo
	for _, name := range names {
		key, ok := keyOf(name)
		if !ok {
			continue // not a dlock key
		}
		e, err := d.kv.Get(rctx, name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return nil, err
		}
		infos = append(infos, info(key, e))
	}
	return infos, nil
}

// keyOf inverts KeyName; false if name is not one of its results.
func keyOf(name string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c != '=' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(name) {
			return "", false
		}
		var x byte
		for _, h := range name[i+1 : i+3] {
			switch {
			case h >= '0' && h <= '9':
				x = x<<4 | byte(h-'0')
			case h >= 'A' && h <= 'F':
				x = x<<4 | byte(h-'A'+10)
			default:
				return "", false
			}
		}
		b.WriteByte(x)
		i += 2
	}
	k := b.String()
	return k, KeyName(k) == name
}

// Break implements backend.Breaker: a purge of the key conditional on the
// revision it read; the holder's loss watch reports it at once.
func (d *Driver) Break(ctx context.Context, key string) (backend.LockInfo, error) {
	if d.closed.Load() {
		return backend.LockInfo{}, errClosed
	}
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	name := KeyName(key)
	for {
		e, err := d.kv.Get(rctx, name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return backend.LockInfo{}, backend.ErrNotHeld
		}
		if err != nil {
			return backend.LockInfo{}, err
		}
		err = d.kv.Purge(rctx, name, jetstream.LastRevision(e.Revision()), jetstream.PurgeTTL(d.markerTTL))
		if err == nil {
			return info(key, e), nil
		}
		if !revisionMismatch(err) {
			return backend.LockInfo{}, err
		}
		// Renewed or taken meanwhile: read it again.
	}
}

// Relabel implements backend.Relabeler: a write of the key with the new
// label, conditional on the holder's last revision, with the last write's
// TTL.
func (d *Driver) Relabel(ctx context.Context, g *backend.Grant, label string) error {
	h, ok := g.Data.(*hold)
	if !ok {
		return fmt.Errorf("nats driver: grant of another driver")
	}
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	rev := h.rev.Load()
	pa, err := d.js.PublishMsg(rctx, &natsgo.Msg{Subject: d.subject + h.name, Data: h.value(label, h.ttl)},
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(h.ttl))
	if err != nil {
		if wrongLastSequence(err) {
			return fmt.Errorf("key %s changed: %w", h.name, backend.ErrNotHeld)
		}
		return err
	}
	h.rev.Store(pa.Sequence)
	h.label = label
	return nil
}

// Watch implements backend.Watcher: a watch of the key from its next change
// on, calling changed for every change and again whenever the watch is set
// up anew after it broke.
func (d *Driver) Watch(ctx context.Context, key string, changed func()) error {
	if d.closed.Load() {
		return errClosed
	}
	wctx, stop := context.WithCancel(ctx)
	name := KeyName(key)
	w, err := d.kv.Watch(wctx, name, jetstream.UpdatesOnly())
	if err != nil {
		stop()
		return err
	}
	end := context.AfterFunc(d.bg, stop)
	ok := d.spawn(func() {
		defer end()
		defer stop()
		var bo backend.Backoff
		for {
			for ok := true; ok; {
				var e jetstream.KeyValueEntry
				select {
				case <-wctx.Done():
					_ = w.Stop()
					return
				case e, ok = <-w.Updates():
				}
				if ok && e != nil {
					changed()
				}
			}
			_ = w.Stop()
			for { // the watch ended: set it up again
				if w, err = d.kv.Watch(wctx, name, jetstream.UpdatesOnly()); err == nil {
					bo.Reset()
					changed()
					break
				}
				if backend.Sleep(wctx, bo.Next()) != nil {
					return
				}
			}
		}
	})
	if !ok {
		end()
		stop()
		_ = w.Stop()
		return errClosed
	}
	return nil
}
