package k8s

import (
	"context"
	"fmt"
	"sync"
	"time"

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

// keyWatch is the one watch of a Lease that the driver's waiting Acquires
// for it share: it keeps the Lease as last seen and tells the waiters of
// each change. It lives while a waiter uses it (refs, under Driver.wmu).
type keyWatch struct {
	name string
	refs int
	stop context.CancelFunc

	mu      sync.Mutex
	lease   *coordinationv1.Lease // the Lease as last seen; nil if absent
	gen     uint64                // counts the states seen; 0 before the first
	live    bool                  // the watch is in place
	down    bool                  // the watch failed or broke, and is not back
	tried   uint64                // the state a waiter last wrote a grant from
	changed chan struct{}         // closed at the next state
}

// watchState is a waiter's view of a keyWatch.
type watchState struct {
	lease   *coordinationv1.Lease // do not modify: shared
	gen     uint64
	live    bool
	down    bool
	changed <-chan struct{}
}

func (kw *keyWatch) state() watchState {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	return watchState{lease: kw.lease, gen: kw.gen, live: kw.live, down: kw.down, changed: kw.changed}
}

// publish records l (nil: absent) as the Lease's state and wakes the waiters.
func (kw *keyWatch) publish(l *coordinationv1.Lease) {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	kw.lease = l
	kw.gen++
	kw.live, kw.down = true, false
	close(kw.changed)
	kw.changed = make(chan struct{})
}

// broken marks the watch down, and wakes the waiters so that they poll.
func (kw *keyWatch) broken() {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if !kw.down {
		kw.live, kw.down = false, true
		close(kw.changed)
		kw.changed = make(chan struct{})
	}
}

// claim reports whether the caller is the first of the driver's waiters to
// write a grant from state gen (one write per state and driver: the others
// would only meet a Conflict).
func (kw *keyWatch) claim(gen uint64) bool {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if kw.tried >= gen {
		return false
	}
	kw.tried = gen
	return true
}

// runningWatch returns the shared watch of Lease name if one runs (the
// caller calls leaveWatch when done with it), else nil.
func (d *Driver) runningWatch(name string) *keyWatch {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	kw, ok := d.watches[name]
	if !ok {
		return nil
	}
	kw.refs++
	return kw
}

// joinWatch returns the shared watch of Lease name, started if need be;
// the caller calls leaveWatch when done with it.
func (d *Driver) joinWatch(name string) (*keyWatch, error) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if kw, ok := d.watches[name]; ok {
		kw.refs++
		return kw, nil
	}
	ctx, stop := context.WithCancel(d.bg)
	kw := &keyWatch{name: name, refs: 1, stop: stop, changed: make(chan struct{})}
	if !d.spawn(func() { d.runKeyWatch(ctx, kw) }) {
		stop()
		return nil, errClosed
	}
	if d.watches == nil {
		d.watches = map[string]*keyWatch{}
	}
	d.watches[name] = kw
	return kw, nil
}

// leaveWatch ends the caller's use of kw, and kw once nobody uses it.
func (d *Driver) leaveWatch(kw *keyWatch) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	kw.refs--
	if kw.refs == 0 {
		delete(d.watches, kw.name)
		kw.stop()
	}
}

// runKeyWatch lists kw's Lease and watches it from the list's version,
// publishing each state, again after each break, until ctx ends.
func (d *Driver) runKeyWatch(ctx context.Context, kw *keyWatch) {
	selector := fields.OneTermEqualSelector("metadata.name", kw.name).String()
	var bo backend.Backoff
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, d.timeout)
		list, err := d.leases.List(rctx, metav1.ListOptions{FieldSelector: selector})
		cancel()
		var w watch.Interface
		if err == nil {
			w, err = d.leases.Watch(ctx, metav1.ListOptions{FieldSelector: selector, ResourceVersion: list.ResourceVersion})
		}
		if err != nil {
			kw.broken()
			_ = backend.Sleep(ctx, bo.Next())
			continue
		}
		bo.Reset()
		var cur *coordinationv1.Lease
		if len(list.Items) > 0 {
			cur = &list.Items[0]
			d.heldUntil(cur, time.Now()) // first sight of this version
		}
		kw.publish(cur)
		d.followKey(ctx, kw, w)
		w.Stop()
		kw.broken()
	}
}

// followKey publishes each state w reports until w or ctx ends.
func (d *Driver) followKey(ctx context.Context, kw *keyWatch, w watch.Interface) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			switch ev.Type {
			case watch.Error:
				return
			case watch.Bookmark:
				continue
			case watch.Deleted:
				kw.publish(nil)
				continue
			}
			if l, ok := ev.Object.(*coordinationv1.Lease); ok {
				d.heldUntil(l, time.Now()) // first sight of this version
				kw.publish(l)
			}
		}
	}
}
