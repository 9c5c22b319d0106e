package k8s

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/dlock-go/dlock/backend"
)

// watchLoss watches h's Lease from the grant's version on, until h is
// released or the driver closed, and reports the lock lost (hold.markLost)
// at the first version that is not h's grant: deleted, released or taken.
func (d *Driver) watchLoss(h *hold) {
	ctx, stop := context.WithCancel(d.bg)
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		stop()
		return
	}
	h.stop = stop
	rv := h.last.ResourceVersion
	h.mu.Unlock()
	d.spawn(func() {
		defer stop()
		var bo backend.Backoff
		for ctx.Err() == nil {
			if rv == "" {
				// The watch broke past the server's history: read the
				// Lease, then watch from its version.
				l, err := d.leases.Get(ctx, h.name, metav1.GetOptions{})
				switch {
				case apierrors.IsNotFound(err):
					h.markLost(fmt.Errorf("lease %s deleted: %w", h.name, backend.ErrNotHeld))
					return
				case err != nil:
					_ = backend.Sleep(ctx, bo.Next())
					continue
				case !mine(l, h):
					h.markLost(fmt.Errorf("lease %s taken or released by another: %w", h.name, backend.ErrNotHeld))
					return
				}
				rv = l.ResourceVersion
			}
			w, err := d.leases.Watch(ctx, metav1.ListOptions{
				FieldSelector:   fields.OneTermEqualSelector("metadata.name", h.name).String(),
				ResourceVersion: rv,
			})
			if err != nil {
				if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					rv = ""
				}
				_ = backend.Sleep(ctx, bo.Next())
				continue
			}
			bo.Reset()
			next, lost := follow(ctx, h, w, rv)
			w.Stop()
			if lost != nil {
				h.markLost(lost)
				return
			}
			rv = next
		}
	})
}

// follow reads w until ctx ends or w does (nil, and the version to watch
// from next: "" if the watch broke past the server's history), or a version
// that is not h's grant (the cause of the loss).
func follow(ctx context.Context, h *hold, w watch.Interface, rv string) (string, error) {
	for {
		select {
		case <-ctx.Done():
			return rv, nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv, nil
			}
			switch ev.Type {
			case watch.Error:
				return "", nil
			case watch.Deleted:
				return rv, fmt.Errorf("lease %s deleted: %w", h.name, backend.ErrNotHeld)
			}
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				continue
			}
			rv = l.ResourceVersion
			if ev.Type == watch.Bookmark {
				continue
			}
			if !mine(l, h) {
				return rv, fmt.Errorf("lease %s taken or released by another (holder %q): %w", h.name, holder(l), backend.ErrNotHeld)
			}
		}
	}
}

// Watch implements backend.Watcher: it calls changed at each event of
// key's Lease, and when its watch breaks and is back.
func (d *Driver) Watch(ctx context.Context, key string, changed func()) error {
	if d.closed.Load() {
		return errClosed
	}
	name := d.LeaseName(key)
	if err := checkName(name); err != nil {
		return err
	}
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	open := func(ctx context.Context) (watch.Interface, error) {
		rctx, cancel := context.WithTimeout(ctx, d.timeout)
		defer cancel()
		// The list gives the version to watch from: the watch itself
		// outlives rctx.
		list, err := d.leases.List(rctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			return nil, err
		}
		return d.leases.Watch(ctx, metav1.ListOptions{FieldSelector: selector, ResourceVersion: list.ResourceVersion})
	}
	wctx, stop := context.WithCancel(ctx)
	unhook := context.AfterFunc(d.bg, stop)
	w, err := open(wctx)
	if err != nil {
		unhook()
		stop()
		return err
	}
	if !d.spawn(func() {
		defer unhook()
		defer stop()
		var bo backend.Backoff
		for {
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					break
				}
				if ev.Type != watch.Bookmark {
					changed()
				}
			}
			w.Stop()
			for {
				if wctx.Err() != nil {
					return
				}
				if w, err = open(wctx); err == nil {
					break
				}
				_ = backend.Sleep(wctx, bo.Next())
			}
			bo.Reset()
			changed()
		}
	}) {
		w.Stop()
		unhook()
		stop()
		return errClosed
	}
	return nil
}
