// Package rwlock is a read/write lock on any dlock backend: many readers or
// one writer, each hold made of leases, so renewed, lost loudly, ended by the
// server when its holder vanishes, and fenced.
//
// Where the backend holds locks shared (dlock.Capabilities().Shared), the lock
// NAME is the backend's own, a writer holding it exclusively and a reader
// shared, and other clients of that layout interoperate. Elsewhere it is the
// write lock NAME/write and a semaphore of [Readers] read slots: a reader
// passes through the write lock to take a slot, and a writer keeps the write
// lock and takes every slot. Either way writers are not starved by readers, a
// write's token is above every earlier hold's (where tokens are strict), and a
// read's token lies between the writes before and after it, so one
// fencing.Guard keyed by the lock's name fences both. An upgrade or downgrade
// under a ctx carrying the hold fails with [ErrNested]. docs/primitives.md has
// the algorithm, guarantees and costs.
package rwlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/semaphore"
)

// Readers is the number of read slots of the portable layout, the most
// readers that hold one lock at once there; a constant, as writers and
// readers must agree on it.
const Readers = 16

// ErrNested means Lock or RLock was called under a ctx that already carries
// a hold of the same lock (the same name on the same Locker, compared unwrapped
// through dlock.Unwrapper),
// which would wait for the caller itself.
var ErrNested = errors.New("rwlock: ctx already holds this lock")

// RWMutex is the read/write lock name on one Locker. It is safe for
// concurrent use; two RWMutex values of one name, in one process or in many,
// are the same lock.
type RWMutex struct {
	l       dlock.Locker
	name    string
	opts    []dlock.AcquireOption
	shared  []dlock.AcquireOption // opts and mode.WithShared, where the backend holds locks shared
	readers *semaphore.Semaphore  // nil where the backend holds locks shared
}

// New returns the read/write lock name on l, whose leases all take opts,
// without a call to the backend; it fails with dlock.ErrInvalidKey for a name
// that cannot make its keys.
func New(l dlock.Locker, name string, opts ...dlock.AcquireOption) (*RWMutex, error) {
	if l != nil && l.Capabilities().Shared {
		// The same names as elsewhere, so that a name is valid on every backend.
		if err := semaphore.CheckName(name + "/read"); err != nil {
			return nil, fmt.Errorf("rwlock %q: %w", name, err)
		}
		return &RWMutex{l: l, name: name, opts: opts, shared: append(slices.Clip(opts), mode.WithShared())}, nil
	}
	// Slot locks even where the backend has its own semaphore: a writer
	// takes every slot as a lock.
	readers, err := semaphore.New(l, name+"/read", Readers, semaphore.WithLeaseOptions(opts...), semaphore.WithSizeCheck(false), semaphore.WithSlotLocks())
	if err != nil {
		return nil, fmt.Errorf("rwlock %q: %w", name, err)
	}
	return &RWMutex{l: l, name: name, opts: opts, readers: readers}, nil
}

// Name returns the lock's name.
func (m *RWMutex) Name() string { return m.name }

// Shared reports whether the lock is the backend's own shared lock NAME
// (its Locker's Capabilities().Shared), rather than a write lock and read
// slots.
func (m *RWMutex) Shared() bool { return m.readers == nil }

// WriteKey returns the key writers hold: NAME/write, or NAME itself where
// the lock is the backend's own (Shared).
func (m *RWMutex) WriteKey() string {
	if m.Shared() {
		return m.name
	}
	return m.name + "/write"
}

// ReadKeys returns the keys of the read slots; none where the lock is the
// backend's own (Shared): readers then hold WriteKey shared.
func (m *RWMutex) ReadKeys() []string {
	if m.Shared() {
		return nil
	}
	keys := make([]string, Readers)
	for i := range keys {
		keys[i] = m.readers.SlotKey(i)
	}
	return keys
}

// Hold is a read or write hold of the lock. Its methods are safe for
// concurrent use.
type Hold struct {
	m       *RWMutex
	write   bool
	token   dlock.Token
	granted time.Time
	lease   *dlock.Lease    // write: the write lock; read: the read slot
	slots   *dlock.LeaseSet // write only: every read slot
	done    <-chan struct{} // read: the slot's Done; write: closed when lease or slots end
}

// Write reports whether this is a write hold.
func (h *Hold) Write() bool { return h.write }

// Token returns the hold's token (see the package doc): a write's is its
// write lock's lease token; a read's, the write lock's token when the reader
// passed through it.
func (h *Hold) Token() dlock.Token { return h.token }

// GrantedAt returns when the hold began: when the request that completed it
// was sent (for a write, the last read slot's; for a read, its slot's).
func (h *Hold) GrantedAt() time.Time { return h.granted }

// Deadline returns the earliest deadline of the hold's leases: the hold is
// lost by then unless they are renewed.
func (h *Hold) Deadline() time.Time {
	d := h.lease.Deadline()
	if h.slots != nil {
		for _, l := range h.slots.Leases() {
			if ld := l.Deadline(); ld.Before(d) {
				d = ld
			}
		}
	}
	return d
}

// Lease returns the hold's main lease: the write lock's for a write, the
// read slot's for a read.
func (h *Hold) Lease() *dlock.Lease { return h.lease }

// Done is closed when the hold ends: released, or lost (any of its leases;
// Err says which).
func (h *Hold) Done() <-chan struct{} { return h.done }

// Err is nil while the hold lasts; afterwards an error matching
// dlock.ErrReleased or dlock.ErrLeaseLost.
func (h *Hold) Err() error {
	if err := h.lease.Err(); err != nil || h.slots == nil {
		return err
	}
	return h.slots.Err()
}

// newHold returns the hold of lease (and, for a write, slots).
func newHold(m *RWMutex, write bool, token dlock.Token, granted time.Time, lease *dlock.Lease, slots *dlock.LeaseSet) *Hold {
	h := &Hold{m: m, write: write, token: token, granted: granted, lease: lease, slots: slots, done: lease.Done()}
	if slots != nil {
		done := make(chan struct{})
		h.done = done
		go func() { // owned by the hold: ends when one of its leases does
			select {
			case <-lease.Done():
			case <-slots.Done():
			}
			close(done)
		}()
	}
	return h
}

// Release ends the hold. It returns an error matching dlock.ErrLeaseLost if
// the hold had been lost, dlock.ErrReleased if it was already released.
func (h *Hold) Release(ctx context.Context) error {
	var errs []error
	if h.slots != nil {
		if err := h.slots.Release(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := h.lease.Release(ctx); err != nil {
		errs = append(errs, err)
	}
	<-h.done
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("rwlock %q: release: %w", h.m.name, errors.Join(errs...))
}

// holdKey is the context key of the holds a ctx carries.
type holdKey struct{}

type holdList struct {
	h    *Hold
	next *holdList
}

// Context returns a copy of ctx that carries h: Lock and RLock of the same
// lock under it return ErrNested instead of waiting for h.
func (h *Hold) Context(ctx context.Context) context.Context {
	next, _ := ctx.Value(holdKey{}).(*holdList)
	return context.WithValue(ctx, holdKey{}, &holdList{h: h, next: next})
}

func (m *RWMutex) nested(ctx context.Context) error {
	for hl, _ := ctx.Value(holdKey{}).(*holdList); hl != nil; hl = hl.next {
		if hl.h.m.name == m.name && sameLocker(hl.h.m.l, m.l) && hl.h.Err() == nil {
			kind := "read"
			if hl.h.write {
				kind = "write"
			}
			return fmt.Errorf("%w (a %s hold): upgrading or downgrading is not supported; release it first", ErrNested, kind)
		}
	}
	return nil
}

// sameLocker reports whether a and b take the same locks: the same Locker
// once each is unwrapped (dlock.Unwrapper). Lockers whose type == cannot
// compare are never the same.
func sameLocker(a, b dlock.Locker) (same bool) {
	a, b = unwrap(a), unwrap(b)
	defer func() {
		if recover() != nil { // == on a type that cannot compare
			same = false
		}
	}()
	return a != nil && a == b
}

// unwrap returns the Locker l wraps, at the bottom of its dlock.Unwrapper
// chain (at most maxUnwrap deep).
func unwrap(l dlock.Locker) dlock.Locker {
	for range maxUnwrap {
		u, ok := l.(dlock.Unwrapper)
		if !ok {
			return l
		}
		inner := u.Unwrap()
		if inner == nil {
			return l
		}
		l = inner
	}
	return l
}

// maxUnwrap bounds the Unwrap chain unwrap follows (one that loops, say).
const maxUnwrap = 64

// Lock waits for a write hold or until ctx ends (the error then matches
// dlock.ErrNotAcquired and ctx's error, and nothing is left behind).
func (m *RWMutex) Lock(ctx context.Context) (*Hold, error) {
	h, err := m.lock(ctx, true)
	if err != nil {
		return nil, fmt.Errorf("rwlock %q: lock: %w", m.name, err)
	}
	return h, nil
}

// TryLock makes one attempt at a write hold; if a reader or a writer holds
// the lock, the error matches dlock.ErrNotAcquired.
func (m *RWMutex) TryLock(ctx context.Context) (*Hold, error) {
	h, err := m.lock(ctx, false)
	if err != nil {
		return nil, fmt.Errorf("rwlock %q: try-lock: %w", m.name, err)
	}
	return h, nil
}

func (m *RWMutex) lock(ctx context.Context, wait bool) (*Hold, error) {
	if err := m.nested(ctx); err != nil {
		return nil, err
	}
	for {
		w, err := m.take(ctx, wait, m.opts)
		if err != nil {
			return nil, err
		}
		if m.Shared() {
			return newHold(m, true, w.Token(), w.GrantedAt(), w, nil), nil
		}
		var slots *dlock.LeaseSet
		if wait {
			slots, err = dlock.AcquireAll(ctx, m.l, m.ReadKeys(), m.opts...)
		} else {
			slots, err = dlock.TryAcquireAll(ctx, m.l, m.ReadKeys(), m.opts...)
		}
		if err != nil {
			_ = w.Release(context.WithoutCancel(ctx))
			return nil, err
		}
		// Waiting for the readers' slots may have outlasted the write
		// lock's lease (a renewal that failed meanwhile, a slow backend):
		// never hand out a hold that is already lost.
		if lerr := w.Err(); lerr != nil {
			_ = slots.Release(context.WithoutCancel(ctx))
			if !wait {
				return nil, fmt.Errorf("%w: the write lock %q was lost while the read slots were taken: %w", dlock.ErrNotAcquired, m.WriteKey(), lerr)
			}
			continue // take it again
		}
		granted := w.GrantedAt()
		for _, l := range slots.Leases() {
			if l.GrantedAt().After(granted) {
				granted = l.GrantedAt()
			}
		}
		return newHold(m, true, w.Token(), granted, w, slots), nil
	}
}

// RLock waits for a read hold, riding out what a Locker's Acquire rides out,
// or until ctx ends: then the error matches dlock.ErrNotAcquired and ctx's
// error, and nothing is left behind.
func (m *RWMutex) RLock(ctx context.Context) (*Hold, error) {
	h, err := m.rlock(ctx, true)
	if err != nil {
		return nil, fmt.Errorf("rwlock %q: rlock: %w", m.name, err)
	}
	return h, nil
}

// TryRLock makes one attempt at a read hold; if a writer holds the lock (or
// waits for it), or, in the portable layout, Readers readers hold it, the
// error matches dlock.ErrNotAcquired.
func (m *RWMutex) TryRLock(ctx context.Context) (*Hold, error) {
	h, err := m.rlock(ctx, false)
	if err != nil {
		return nil, fmt.Errorf("rwlock %q: try-rlock: %w", m.name, err)
	}
	return h, nil
}

func (m *RWMutex) rlock(ctx context.Context, wait bool) (*Hold, error) {
	if err := m.nested(ctx); err != nil {
		return nil, err
	}
	if m.Shared() {
		r, err := m.take(ctx, wait, m.shared)
		if err != nil {
			return nil, err
		}
		return newHold(m, false, r.Token(), r.GrantedAt(), r, nil), nil
	}
	for {
		w, err := m.take(ctx, wait, m.opts)
		if err != nil {
			return nil, err
		}
		var p *semaphore.Permit
		if wait {
			p, err = m.readers.Acquire(ctx)
		} else {
			p, err = m.readers.TryAcquire(ctx)
		}
		var lost error
		if err == nil && w.Err() != nil {
			// The write lock ended before the slot was granted: a writer may
			// already have found this slot free.
			lost = fmt.Errorf("%w: the write lock was lost while taking a read slot: %w", dlock.ErrNotAcquired, w.Err())
			_ = p.Release(context.WithoutCancel(ctx))
		}
		// Passed through: give the write lock back, whatever ctx has become
		// (Release bounds a ctx without deadline by the release timeout).
		_ = w.Release(context.WithoutCancel(ctx))
		if err == nil && lost == nil && p.Err() != nil {
			// Giving the write lock back (a round trip, longer under load) may
			// have outlasted the read slot: never hand out a read hold that is
			// already lost, whose slot a writer may hold by now.
			lost = fmt.Errorf("%w: the read slot was lost while the write lock was given back: %w", dlock.ErrNotAcquired, p.Err())
		}
		switch {
		case err != nil:
			return nil, err
		case lost == nil:
			return newHold(m, false, w.Token(), p.Lease().GrantedAt(), p.Lease(), nil), nil
		case !wait:
			return nil, lost
		}
		// A waiting RLock whose write lock or slot was lost (a session that
		// ended with a cut link, a renewal that failed) passes through again.
	}
}

// take acquires WriteKey with opts (m.opts: exclusively; m.shared:
// shared), waiting or not.
func (m *RWMutex) take(ctx context.Context, wait bool, opts []dlock.AcquireOption) (*dlock.Lease, error) {
	if wait {
		return m.l.Acquire(ctx, m.WriteKey(), opts...)
	}
	return m.l.TryAcquire(ctx, m.WriteKey(), opts...)
}

// Read runs fn under a read hold: it waits for one (as RLock), runs fn with
// a ctx that carries the hold and is cancelled if the hold is lost, and
// releases it when fn returns.
func (m *RWMutex) Read(ctx context.Context, fn func(ctx context.Context, h *Hold) error) error {
	return m.do(ctx, false, fn)
}

// Write runs fn under a write hold, as Read does under a read hold.
func (m *RWMutex) Write(ctx context.Context, fn func(ctx context.Context, h *Hold) error) error {
	return m.do(ctx, true, fn)
}

func (m *RWMutex) do(ctx context.Context, write bool, fn func(ctx context.Context, h *Hold) error) error {
	var (
		h   *Hold
		err error
	)
	if write {
		h, err = m.Lock(ctx)
	} else {
		h, err = m.RLock(ctx)
	}
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(h.Context(ctx))
	go func() {
		select {
		case <-h.Done():
			cancel(h.Err())
		case <-fctx.Done():
		}
	}()
	fnErr := fn(fctx, h)
	cancel(nil)
	relErr := h.Release(context.WithoutCancel(ctx)) // bounded by the release timeout
	if errors.Is(relErr, dlock.ErrReleased) {
		relErr = nil
	}
	return errors.Join(fnErr, relErr)
}
