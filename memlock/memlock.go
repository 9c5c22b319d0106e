// Package memlock is dlock's in-process driver, for tests, examples and
// benchmarks. It is NOT a distributed lock: it excludes goroutines of one
// process only, so never configure it in production.
//
// Importing the package registers the DSN scheme "mem" (nothing else does):
//
//	import _ "github.com/dlock-go/dlock/memlock"
//
//	locker, err := dlock.Open(ctx, "mem://tests")
//
// Lockers opened on the same "mem://NAME" share one lock space (a Store) for
// the life of the process; NewStore makes a private one. It claims every
// capability but fault tolerance, and is the reference implementation of the
// driver contract. docs/memlock.md has the details.
package memlock

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/backend"
)

func init() {
	backend.Register("mem", func(_ context.Context, u *url.URL) (backend.Driver, error) {
		if err := backend.NewParams(u).Done(); err != nil {
			return nil, err
		}
		if u.Path != "" && u.Path != "/" {
			return nil, fmt.Errorf("mem DSN takes a store name as its host (mem://NAME), not a path %q", u.Path)
		}
		return Shared(u.Host).NewDriver(), nil
	})
}

var (
	sharedMu sync.Mutex
	shared   = map[string]*Store{}
)

// Shared returns the process-wide store with the given name, creating it on
// first use.
func Shared(name string) *Store {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	s, ok := shared[name]
	if !ok {
		s = NewStore()
		shared[name] = s
	}
	return s
}

// Store is one in-process lock space. Its methods are safe for concurrent use.
type Store struct {
	mu       sync.Mutex
	locks    map[string]*holder            // exclusive holders
	shared   map[string]map[string]*holder // shared holders, by key and owner
	queues   map[string][]*waiter
	tokens   map[string]uint64
	watchers map[string]map[chan struct{}]struct{} // Watch's, by key
	sems     map[string]*sem                       // counted semaphores (AcquireRequest.Permits), by key
}

// sem is a counted semaphore (backend.AcquireRequest.Permits): its permits
// are the locks of its slot keys (backend.PermitKey), so Inspect, Expire and
// Break see each permit as the lock of its slot.
type sem struct {
	n       int // the number of permits its holders use
	held    int
	waiters []*waiter // in arrival order
}

type holder struct {
	sem     string // the counted semaphore it holds a permit of; "" for a lock
	shared  bool
	owner   string
	label   string
	token   uint64
	granted time.Time
	lost    chan struct{} // closed when the store forgets this holder without a release
	timer   *time.Timer   // expires the holder after its TTL
	expires time.Time
}

type waiter struct {
	shared bool
	owner  string
	label  string
	ttl    time.Duration
	grant  chan *backend.Grant // buffered(1): the hand-off
}

// Waiters returns how many Acquire calls wait for key.
func (s *Store) Waiters(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queues[key])
}

// Held reports whether key is held.
func (s *Store) Held(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heldLocked(key)
}

// NewStore returns an empty, private store.
func NewStore() *Store {
	return &Store{
		locks:    map[string]*holder{},
		shared:   map[string]map[string]*holder{},
		queues:   map[string][]*waiter{},
		tokens:   map[string]uint64{},
		watchers: map[string]map[chan struct{}]struct{}{},
		sems:     map[string]*sem{},
	}
}

// NewDriver returns a new client of the store. Drivers of one store exclude
// each other as separate processes' clients of one server would.
func (s *Store) NewDriver() backend.Driver { return &driver{store: s, quit: make(chan struct{})} }

// Expire makes the store forget key's holders at once, as a server does when
// a session expires (Grant.Lost closes, the next waiters are granted), and
// reports whether the key was held.
func (s *Store) Expire(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	hs := s.holdersLocked(key)
	for _, h := range hs {
		s.dropLocked(key, h, true)
	}
	return len(hs) > 0
}

// holdersLocked returns key's holders as they are, expired or not: the
// exclusive one, or the shared ones. s.mu must be held.
func (s *Store) holdersLocked(key string) []*holder {
	if h, ok := s.locks[key]; ok {
		return []*holder{h}
	}
	hs := make([]*holder, 0, len(s.shared[key]))
	for _, h := range s.shared[key] {
		hs = append(hs, h)
	}
	return hs
}

// grantLocked makes owner a holder of key. s.mu must be held.
func (s *Store) grantLocked(key, owner, label string, ttl time.Duration, shared bool) *backend.Grant {
	s.tokens[key]++
	// Start must not be later than the moment the expiry counts from, or the
	// lease's deadline would fall after the store forgets the holder.
	start := time.Now()
	h := &holder{shared: shared, owner: owner, label: label, token: s.tokens[key], granted: start, lost: make(chan struct{}), expires: start.Add(ttl)}
	h.timer = time.AfterFunc(ttl, func() { s.expire(key) })
	if shared {
		if s.shared[key] == nil {
			s.shared[key] = map[string]*holder{}
		}
		s.shared[key][owner] = h
	} else {
		s.locks[key] = h
	}
	s.changedLocked(key)
	return &backend.Grant{
		Key:      key,
		Owner:    owner,
		Token:    s.tokens[key],
		Start:    start,
		Validity: ttl,
		Lost:     h.lost,
	}
}

// liveLocked forgets key's holders whose expiry has passed although their
// timer has not run yet (as a server forgets an expired key when it is next
// touched), so that no caller ever sees one, and returns key's live
// exclusive holder (nil if none). s.mu must be held.
func (s *Store) liveLocked(key string) *holder {
	now := time.Now()
	if h := s.locks[key]; h != nil && !now.Before(h.expires) {
		s.dropLocked(key, h, true) // may grant the lock to waiters
	}
	for _, h := range s.shared[key] {
		if !now.Before(h.expires) {
			s.dropLocked(key, h, true)
		}
	}
	return s.locks[key]
}

// heldLocked reports whether anyone holds key. s.mu must be held.
func (s *Store) heldLocked(key string) bool {
	return s.liveLocked(key) != nil || len(s.shared[key]) > 0
}

// ownedLocked returns owner's live hold of key, or nil. s.mu must be held.
func (s *Store) ownedLocked(key, owner string) *holder {
	if h := s.liveLocked(key); h != nil {
		if h.owner == owner {
			return h
		}
		return nil
	}
	return s.shared[key][owner]
}

// freeLocked reports whether a request in the given mode can be granted at
// once: an exclusive one when nobody holds key, a shared one when nobody
// holds it exclusively and nobody waits for it (a waiting writer goes
// first). s.mu must be held.
func (s *Store) freeLocked(key string, shared bool) bool {
	if s.liveLocked(key) != nil {
		return false
	}
	if shared {
		return len(s.queues[key]) == 0
	}
	return len(s.shared[key]) == 0
}

// expire forgets key's holders whose expiry has passed (a timer's; a
// refresh may have moved the expiry after the timer fired).
func (s *Store) expire(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.liveLocked(key)
}

// dropLocked removes h, a holder of key, and hands the lock to the waiters
// it can go to now.
func (s *Store) dropLocked(key string, h *holder, lost bool) {
	h.timer.Stop()
	if lost {
		close(h.lost)
	}
	if h.shared {
		delete(s.shared[key], h.owner)
		if len(s.shared[key]) == 0 {
			delete(s.shared, key)
		}
	} else {
		delete(s.locks, key)
	}
	s.changedLocked(key)
	s.grantWaitersLocked(key)
	if h.sem != "" {
		if sm := s.sems[h.sem]; sm != nil {
			sm.held--
			s.grantCountedLocked(h.sem, sm)
		}
	}
}

// freeSlotLocked returns the lowest slot of the counted semaphore key of n
// permits whose lock is free with nobody queued for it, or -1. s.mu must be
// held.
func (s *Store) freeSlotLocked(key string, n int) int {
	for i := range n {
		slot := backend.PermitKey(key, i)
		if s.freeLocked(slot, false) && len(s.queues[slot]) == 0 {
			return i
		}
	}
	return -1
}

// grantPermitLocked grants owner slot i of the counted semaphore key. s.mu
// must be held.
func (s *Store) grantPermitLocked(key string, sm *sem, i int, owner, label string, ttl time.Duration) *backend.Grant {
	slot := backend.PermitKey(key, i)
	g := s.grantLocked(slot, owner, label, ttl, false)
	s.locks[slot].sem = key
	sm.held++
	s.sems[key] = sm // again, if a drop of an expired holder forgot it meanwhile
	return g
}

// grantCountedLocked grants the counted semaphore key's waiters, in order,
// the permits that are free, and forgets the semaphore once nobody holds or
// waits. s.mu must be held.
func (s *Store) grantCountedLocked(key string, sm *sem) {
	for len(sm.waiters) > 0 {
		// Looking for a slot may drop an expired holder, which grants
		// waiters in turn: read the head only after.
		i := s.freeSlotLocked(key, sm.n)
		if i < 0 || len(sm.waiters) == 0 {
			return
		}
		w := sm.waiters[0]
		sm.waiters = sm.waiters[1:]
		w.grant <- s.grantPermitLocked(key, sm, i, w.owner, w.label, w.ttl)
	}
	if sm.held == 0 && s.sems[key] == sm {
		delete(s.sems, key)
	}
}

// acquireCounted is Acquire for a counted request: the lowest free slot,
// first come first served.
func (d *driver) acquireCounted(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	s := d.store
	s.mu.Lock()
	sm := s.sems[req.Key]
	if sm == nil {
		sm = &sem{n: req.Permits}
	}
	if sm.n != req.Permits {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: the holders of %q use %d, this request %d", backend.ErrSizeMismatch, req.Key, sm.n, req.Permits)
	}
	if len(sm.waiters) == 0 {
		if i := s.freeSlotLocked(req.Key, sm.n); i >= 0 {
			g := s.grantPermitLocked(req.Key, sm, i, req.Owner, req.Label, req.TTL)
			s.mu.Unlock()
			return g, nil
		}
	}
	if !req.Wait {
		s.mu.Unlock()
		return nil, backend.ErrHeld
	}
	w := &waiter{owner: req.Owner, label: req.Label, ttl: req.TTL, grant: make(chan *backend.Grant, 1)}
	sm.waiters = append(sm.waiters, w)
	s.sems[req.Key] = sm
	s.mu.Unlock()

	select {
	case g := <-w.grant:
		return g, nil
	case <-ctx.Done():
	}
	// Cancelled: leave the queue, or give back a grant that raced the cancel.
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.Index(sm.waiters, w); i >= 0 {
		sm.waiters = slices.Delete(sm.waiters, i, i+1)
		s.grantCountedLocked(req.Key, sm) // those it stood in front of
		return nil, ctx.Err()
	}
	g := <-w.grant
	if h := s.ownedLocked(g.Key, g.Owner); h != nil {
		s.dropLocked(g.Key, h, false)
	}
	return nil, ctx.Err()
}

// grantWaitersLocked grants key to the waiters at the head of its queue
// that can have it now, in order: one exclusive waiter, or a run of shared
// ones. s.mu must be held.
func (s *Store) grantWaitersLocked(key string) {
	for {
		q := s.queues[key]
		if len(q) == 0 {
			return
		}
		w := q[0]
		_, excl := s.locks[key]
		if excl || (!w.shared && len(s.shared[key]) > 0) {
			return
		}
		if len(q) == 1 {
			delete(s.queues, key)
		} else {
			s.queues[key] = q[1:]
		}
		w.grant <- s.grantLocked(key, w.owner, w.label, w.ttl, w.shared)
	}
}

// errClosed is returned by a driver used after Close.
var errClosed = fmt.Errorf("memlock driver: %w", backend.ErrClosed)

// changedLocked tells key's watchers it changed. s.mu must be held.
func (s *Store) changedLocked(key string) {
	for kick := range s.watchers[key] {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
}

type driver struct {
	store   *Store
	mu      sync.Mutex
	done    bool
	quit    chan struct{}  // closed by Close
	watches sync.WaitGroup // Watch's goroutines
}

func (d *driver) Name() string { return "mem" }

func (d *driver) closed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done
}

func (d *driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	if d.closed() {
		return nil, errClosed
	}
	if req.Permits > 0 {
		return d.acquireCounted(ctx, req)
	}
	s := d.store
	s.mu.Lock()
	if s.freeLocked(req.Key, req.Shared) {
		g := s.grantLocked(req.Key, req.Owner, req.Label, req.TTL, req.Shared)
		s.mu.Unlock()
		return g, nil
	}
	if !req.Wait {
		s.mu.Unlock()
		return nil, backend.ErrHeld
	}
	w := &waiter{shared: req.Shared, owner: req.Owner, label: req.Label, ttl: req.TTL, grant: make(chan *backend.Grant, 1)}
	s.queues[req.Key] = append(s.queues[req.Key], w)
	s.mu.Unlock()

	select {
	case g := <-w.grant:
		return g, nil
	case <-ctx.Done():
	}
	// Cancelled: leave the queue, or give back a grant that raced the cancel.
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[req.Key]
	for i, x := range q {
		if x == w {
			s.queues[req.Key] = append(q[:i:i], q[i+1:]...)
			if len(s.queues[req.Key]) == 0 {
				delete(s.queues, req.Key)
			}
			s.grantWaitersLocked(req.Key) // those it stood in front of
			return nil, ctx.Err()
		}
	}
	g := <-w.grant
	if h := s.ownedLocked(req.Key, g.Owner); h != nil {
		s.dropLocked(req.Key, h, false)
	}
	return nil, ctx.Err()
}

func (d *driver) Refresh(_ context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	if d.closed() {
		return 0, errClosed
	}
	s := d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.ownedLocked(g.Key, g.Owner)
	if h == nil {
		return 0, backend.ErrNotHeld
	}
	h.expires = time.Now().Add(ttl)
	h.timer.Reset(ttl)
	return ttl, nil
}

func (d *driver) Release(_ context.Context, g *backend.Grant) error {
	if d.closed() {
		return errClosed
	}
	s := d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.ownedLocked(g.Key, g.Owner)
	if h == nil {
		return backend.ErrNotHeld
	}
	s.dropLocked(g.Key, h, false)
	return nil
}

// Relabel implements backend.Relabeler.
func (d *driver) Relabel(_ context.Context, g *backend.Grant, label string) error {
	if d.closed() {
		return errClosed
	}
	s := d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.ownedLocked(g.Key, g.Owner)
	if h == nil {
		return backend.ErrNotHeld
	}
	h.label = label
	s.changedLocked(g.Key)
	return nil
}

// Watch implements backend.Watcher: grants, relabels, releases, expiries and
// breaks of key are reported.
func (d *driver) Watch(ctx context.Context, key string, changed func()) error {
	if d.closed() {
		return errClosed
	}
	s := d.store
	kick := make(chan struct{}, 1)
	s.mu.Lock()
	if s.watchers[key] == nil {
		s.watchers[key] = map[chan struct{}]struct{}{}
	}
	s.watchers[key][kick] = struct{}{}
	s.mu.Unlock()
	d.mu.Lock()
	if d.done { // closed meanwhile: Close may be waiting already
		d.mu.Unlock()
		d.unwatch(key, kick)
		return errClosed
	}
	d.watches.Add(1)
	d.mu.Unlock()
	go func() { // owned by the driver: Close waits for it
		defer d.watches.Done()
		defer d.unwatch(key, kick)
		for {
			select {
			case <-kick:
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

func (d *driver) unwatch(key string, kick chan struct{}) {
	s := d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.watchers[key], kick)
	if len(s.watchers[key]) == 0 {
		delete(s.watchers, key)
	}
}

// TryAcquireAll implements backend.MultiAcquirer: every key, or none.
func (d *driver) TryAcquireAll(_ context.Context, reqs []backend.AcquireRequest) ([]*backend.Grant, error) {
	if d.closed() {
		return nil, errClosed
	}
	s := d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range reqs {
		if s.heldLocked(r.Key) {
			return nil, fmt.Errorf("key %q: %w", r.Key, backend.ErrHeld)
		}
	}
	gs := make([]*backend.Grant, len(reqs))
	for i, r := range reqs {
		gs[i] = s.grantLocked(r.Key, r.Owner, r.Label, r.TTL, false)
	}
	return gs, nil
}

// infoLocked reports key's lock; s.mu must be held.
func (s *Store) infoLocked(key string) backend.LockInfo {
	info := backend.LockInfo{Key: key, Waiters: len(s.queues[key])}
	s.liveLocked(key)
	hs := s.holdersLocked(key)
	for _, h := range hs {
		if h.token > info.Token { // the exclusive holder, or the latest shared one
			info.Held, info.Token, info.Owner, info.Label = true, h.token, h.owner, h.label
			info.Granted, info.Expires = h.granted, h.expires
		}
	}
	if len(hs) > 0 && hs[0].shared {
		info.Shared = len(hs)
	}
	return info
}

// Inspect implements backend.Inspector.
func (d *driver) Inspect(_ context.Context, key string) (backend.LockInfo, error) {
	if d.closed() {
		return backend.LockInfo{}, errClosed
	}
	d.store.mu.Lock()
	defer d.store.mu.Unlock()
	return d.store.infoLocked(key), nil
}

// List implements backend.Inspector.
func (d *driver) List(_ context.Context, prefix string) ([]backend.LockInfo, error) {
	if d.closed() {
		return nil, errClosed
	}
	s := d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for key := range s.locks {
		if strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
	}
	for key := range s.shared {
		if strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
	}
	var infos []backend.LockInfo
	for _, key := range keys {
		if info := s.infoLocked(key); info.Held { // not one that expired just now
			infos = append(infos, info)
		}
	}
	slices.SortFunc(infos, func(a, b backend.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	return infos, nil
}

// Break implements backend.Breaker: the holder is forgotten as on expiry
// (its Grant.Lost is closed) and the next waiter is granted.
func (d *driver) Break(_ context.Context, key string) (backend.LockInfo, error) {
	if d.closed() {
		return backend.LockInfo{}, errClosed
	}
	s := d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	info := s.infoLocked(key) // forgets expired holders first
	hs := s.holdersLocked(key)
	if len(hs) == 0 {
		return info, fmt.Errorf("key %q: %w", key, backend.ErrNotHeld)
	}
	for _, h := range hs {
		s.dropLocked(key, h, true)
	}
	return info, nil
}

func (d *driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:         backend.FencingStrict,
		FIFO:            true,
		FaultTolerant:   false,
		TimeAuthority:   backend.TimeServer,
		PushWait:        true,
		LossNotify:      true,
		Shared:          true,
		NativeSemaphore: true,
	}
}

func (d *driver) Close() error {
	d.mu.Lock()
	if d.done {
		d.mu.Unlock()
		return errClosed
	}
	d.done = true
	close(d.quit)
	d.mu.Unlock()
	d.watches.Wait()
	return nil
}
