package nats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dlock-go/dlock/backend"
)

// watchLinger is how long a driver keeps its bucket watch once nothing is
// registered on it, so that a program that takes locks now and then does
// not create and delete a consumer for each.
const watchLinger = 30 * time.Second

// watcher is a driver's one watch of its bucket: a single ordered consumer
// of every key's subject, from the time it is set up on, whose updates go by
// key to the subscriptions registered on it: waiting Acquires (woken by a
// delete, a purge or an expiry) and held leases (ended by the first state
// that is not the holder's). The server caps a stream's consumers (1 000
// by default), so there is one per driver, not one per lock.
type watcher struct {
	d *Driver

	mu      sync.Mutex
	subs    map[string]map[*sub]struct{} // by bucket key
	n       int                          // subscriptions in subs
	running bool                         // run's goroutine is alive
	live    bool                         // the consumer is set up: every write sent from now on is seen
	epoch   uint64                       // counts the times the watch went down
	kw      jetstream.KeyWatcher         // the consumer while live
	check   []*sub                       // held leases granted while their key was not covered, for run to read
	kick    chan struct{}                // (buffered 1) tells run that check has work, or that subs emptied
}

// sub is one Acquire's registration on the watcher, made before its first
// write and kept while it waits and, once granted, while the lease is held.
type sub struct {
	h    *hold
	wake chan struct{} // (buffered 1) the key was deleted, purged or expired, or the watch was set up anew

	// Guarded by watcher.mu.
	epoch uint64 // the watcher's epoch at registration; 0: registered while the watch was down
	woke  uint64 // the epoch at which the watch last woke it after setting up
	token uint64 // the grant's revision; 0 while not granted
	last  event  // the newest update of the key read before the grant
	done  bool   // removed, or its lease ended
}

// event is what the watcher keeps of one update of a key.
type event struct {
	rev     uint64
	op      jetstream.KeyValueOp
	owner   string // "" when the value is not dlock's
	created time.Time
}

func newWatcher(d *Driver) *watcher {
	return &watcher{d: d, subs: make(map[string]map[*sub]struct{}), kick: make(chan struct{}, 1), epoch: 1}
}

// add registers h's key, starting the watch if it is not running. Register
// before the first write: updates are then seen from before it.
func (w *watcher) add(h *hold) *sub {
	s := &sub{h: h, wake: make(chan struct{}, 1)}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.live {
		s.epoch = w.epoch
	}
	m := w.subs[h.name]
	if m == nil {
		m = make(map[*sub]struct{})
		w.subs[h.name] = m
	}
	m[s] = struct{}{}
	w.n++
	if !w.running && w.d.spawn(w.run) {
		w.running = true
	}
	return s
}

// remove ends s's registration; its key's updates are no longer read for it.
func (w *watcher) remove(s *sub) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removeLocked(s)
}

func (w *watcher) removeLocked(s *sub) {
	if s.done {
		return
	}
	s.done = true
	if m := w.subs[s.h.name]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(w.subs, s.h.name)
		}
	}
	w.n--
	if w.n == 0 {
		w.signal()
	}
}

func (w *watcher) signal() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// isLive reports whether the watch is set up.
func (w *watcher) isLive() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.live
}

// watchLoss turns h's registration into its loss watch, now that h is
// granted (h.token set): the first update after the grant that is not h's
// (a delete, a purge, an expiry's marker, another owner's write) reports the
// lock lost (hold.markLost); so does an update read between the
// registration and the grant. Release ends it (hold.stop).
func (d *Driver) watchLoss(h *hold) {
	w, s := d.watch, h.sub
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		w.remove(s)
		return
	}
	h.stop = func() { w.remove(s) }
	h.mu.Unlock()
	w.mu.Lock()
	if s.done {
		w.mu.Unlock()
		return
	}
	s.token = h.token
	lost := s.judge(s.last)
	if lost == nil && w.live && s.epoch != w.epoch {
		// The create may have gone out while the watch was down: read the
		// key now that it is up (else up does).
		w.check = append(w.check, s)
		w.signal()
	}
	if lost != nil {
		w.removeLocked(s)
	}
	w.mu.Unlock()
	if lost != nil {
		h.markLost(lost)
	}
}

// judge returns why e ends s's lease (s granted), or nil: an update after
// the grant that is not the holder's. The grant's own update gives its time.
func (s *sub) judge(e event) error {
	switch {
	case e.rev == 0 || e.rev < s.token:
		return nil
	case e.rev == s.token:
		if e.op == jetstream.KeyValuePut && e.owner == s.h.owner {
			s.h.granted.Store(e.created.UnixNano())
			return nil
		}
	}
	if e.op != jetstream.KeyValuePut {
		return fmt.Errorf("key %s %s at revision %d: %w", s.h.name, opName(e.op), e.rev, backend.ErrNotHeld)
	}
	if e.owner != s.h.owner {
		return fmt.Errorf("key %s written by another owner at revision %d: %w", s.h.name, e.rev, backend.ErrNotHeld)
	}
	return nil
}

// run is the watch's goroutine: it sets the consumer up (again after it
// ends), hands each update to the subscriptions of its key, and stops once
// nothing has been registered for watchLinger, or at Close.
func (w *watcher) run() {
	ctx := w.d.bg
	var bo backend.Backoff
	idle := time.NewTimer(watchLinger)
	defer idle.Stop()
	for {
		if w.stopIfIdle(ctx, false) {
			return
		}
		wctx, cancel := context.WithCancel(ctx) // ends the watch
		kw, err := w.setup(wctx, cancel)
		if err != nil {
			cancel()
			if backend.Sleep(ctx, bo.Next()) != nil {
				w.stopIfIdle(ctx, true)
				return
			}
			continue
		}
		bo.Reset()
		w.up(kw)
		w.follow(ctx, kw, idle)
		_ = kw.Stop()
		cancel()
		w.down()
		if hook := testHookWatchDown.Load(); hook != nil {
			(*hook)()
		}
	}
}

// watchKey sets up the driver's bucket watch (key ">"), new updates only;
// tests replace it.
var watchKey = func(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyWatcher, error) {
	return kv.Watch(ctx, key, jetstream.UpdatesOnly())
}

// testHookWatchDown, set by the tests, runs each time the watch has ended,
// before it is set up again.
var testHookWatchDown atomic.Pointer[func()]

// setup sets up the watch for as long as ctx lasts, giving up (cancel) when
// the server has not answered within the request timeout: a consumer
// creation whose request is lost (with a dying meta leader) is never
// answered, and the watch would stay down with no error to retry on.
func (w *watcher) setup(ctx context.Context, cancel context.CancelFunc) (jetstream.KeyWatcher, error) {
	type result struct {
		kw  jetstream.KeyWatcher
		err error
	}
	done := make(chan result, 1)
	go func() { // owned by setup, which waits for it
		kw, err := watchKey(ctx, w.d.kv, jetstream.AllKeys)
		done <- result{kw, err}
	}()
	timer := time.NewTimer(w.d.timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.kw, r.err
	case <-timer.C:
		cancel()
		if r := <-done; r.kw != nil {
			_ = r.kw.Stop()
		}
		return nil, fmt.Errorf("bucket watch: no answer within %v", w.d.timeout)
	}
}

// stopIfIdle ends run (true) when the driver is closed, or when force or
// nothing is registered.
func (w *watcher) stopIfIdle(ctx context.Context, force bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ctx.Err() != nil || force || w.n == 0 {
		w.running = false
		return true
	}
	return false
}

// up marks the watch set up: every write sent from now on is seen. What
// was registered before may have missed updates: waiters are woken to try
// again, and held leases have their key read (checkHeld).
func (w *watcher) up(kw jetstream.KeyWatcher) {
	w.mu.Lock()
	w.live = true
	w.kw = kw
	var woken []*sub
	for _, m := range w.subs {
		for s := range m {
			switch {
			case s.epoch == w.epoch:
			case s.token == 0:
				s.woke = w.epoch
				woken = append(woken, s)
			default:
				w.check = append(w.check, s)
			}
		}
	}
	w.mu.Unlock()
	for _, s := range woken {
		s.signalWake()
	}
	w.signal()
}

// down marks the watch ended: what is registered from now on, and what is
// held, must be checked when it is set up again.
func (w *watcher) down() {
	w.mu.Lock()
	w.live = false
	w.kw = nil
	w.epoch++
	w.check = w.check[:0]
	w.mu.Unlock()
}

func (s *sub) signalWake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// follow reads kw until it ends, ctx does, or nothing has been registered
// for watchLinger; between updates it reads the keys of held leases that
// the watch may have missed.
func (w *watcher) follow(ctx context.Context, kw jetstream.KeyWatcher, idle *time.Timer) {
	var retry <-chan time.Time
	var bo backend.Backoff
	for {
		select {
		case <-ctx.Done():
			return
		case <-idle.C:
			w.mu.Lock()
			empty := w.n == 0
			w.mu.Unlock()
			if empty {
				return
			}
		case <-w.kick:
			w.mu.Lock()
			empty := w.n == 0
			w.mu.Unlock()
			if empty {
				idle.Reset(watchLinger)
			}
			if retry == nil && !w.checkHeld(ctx) {
				retry = time.After(bo.Next())
			}
		case <-retry:
			retry = nil
			if w.checkHeld(ctx) {
				bo.Reset()
			} else {
				retry = time.After(bo.Next())
			}
		case e, ok := <-kw.Updates():
			if !ok {
				return
			}
			if e != nil {
				w.dispatch(e)
			}
		}
	}
}

// dispatch hands e to the subscriptions of its key.
func (w *watcher) dispatch(e jetstream.KeyValueEntry) {
	w.mu.Lock()
	m := w.subs[e.Key()]
	if len(m) == 0 {
		w.mu.Unlock()
		return
	}
	ev := event{rev: e.Revision(), op: e.Operation(), created: e.Created()}
	if ev.op == jetstream.KeyValuePut {
		if v, ok := decode(e.Value()); ok {
			ev.owner = v.Owner
		}
	}
	type loss struct {
		s   *sub
		err error
	}
	var lost []loss
	var woken []*sub
	for s := range m {
		if s.token == 0 {
			if ev.rev > s.last.rev {
				s.last = ev
			}
			if ev.op != jetstream.KeyValuePut {
				woken = append(woken, s)
			}
			continue
		}
		if err := s.judge(ev); err != nil {
			lost = append(lost, loss{s, err})
		}
	}
	for _, l := range lost {
		w.removeLocked(l.s)
	}
	w.mu.Unlock()
	for _, s := range woken {
		s.signalWake()
	}
	for _, l := range lost {
		l.s.h.markLost(l.err)
	}
}

// checkHeld reads the key of each held lease queued in check, and reports
// the loss of those whose key is gone or another owner's; false if a read
// failed (the rest stay queued).
func (w *watcher) checkHeld(ctx context.Context) bool {
	for {
		w.mu.Lock()
		if len(w.check) == 0 || !w.live {
			w.mu.Unlock()
			return true
		}
		s := w.check[len(w.check)-1]
		epoch := w.epoch
		w.mu.Unlock()
		var lost error
		if !w.isDone(s) {
			rctx, cancel := context.WithTimeout(ctx, w.d.timeout)
			e, err := w.d.readKey(rctx, s.h.name)
			cancel()
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				lost = fmt.Errorf("key %s deleted: %w", s.h.name, backend.ErrNotHeld)
			case err != nil:
				return false
			case e.op != jetstream.KeyValuePut:
				lost = fmt.Errorf("key %s %s at revision %d: %w", s.h.name, opName(e.op), e.rev, backend.ErrNotHeld)
			default:
				if v, ok := decode(e.value); !ok || v.Owner != s.h.owner {
					lost = fmt.Errorf("key %s written by another owner at revision %d: %w", s.h.name, e.rev, backend.ErrNotHeld)
				}
			}
		}
		w.mu.Lock()
		if w.epoch != epoch {
			// The watch went down during the read: up reads it again.
			w.mu.Unlock()
			return true
		}
		if n := len(w.check); n > 0 && w.check[n-1] == s {
			w.check = w.check[:n-1]
			s.epoch = epoch // covered from the read on
		}
		if s.done {
			lost = nil
		}
		if lost != nil {
			w.removeLocked(s)
		}
		w.mu.Unlock()
		if lost != nil {
			s.h.markLost(lost)
		}
	}
}

func (w *watcher) isDone(s *sub) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return s.done
}

func opName(op jetstream.KeyValueOp) string {
	if op == jetstream.KeyValueDelete {
		return "deleted"
	}
	return "purged or expired"
}

// testDrivers, when the tests set it, records each open driver, so that they
// can count its waiters (export_test.go).
var testDrivers *sync.Map

// waiters counts the waiting Acquires of the bucket key name that the watch
// covers.
func (w *watcher) waiters(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for s := range w.subs[name] {
		if w.live && s.token == 0 && (s.epoch == w.epoch || s.woke == w.epoch) {
			n++
		}
	}
	return n
}
