// Package semaphore lets at most n holders at a time take a permit of a
// named semaphore, on any dlock backend, each permit a lease with a fencing
// token.
//
// In its portable layout a semaphore of n permits is n locks, its slots
// NAME/permits/0 to NAME/permits/(n-1); waiters queue on the lock
// NAME/permits/queue, and the head watches the slots. Where the backend has a
// counted semaphore of its own (dlock.Capabilities().NativeSemaphore), the semaphore
// is that one instead ([Semaphore.Native]), so that the backend's other
// clients count toward n. Either way a permit names its slot (Key) and
// carries a token that increases per slot, so a resource keeps one
// fencing.Guard per slot:
//
//	sem, err := semaphore.New(locker, "gpu", 4)
//	permit, err := sem.Acquire(ctx)
//	if err != nil { return err }
//	defer permit.Release(context.Background())
//	// write with (permit.Key(), permit.Token()); guard.Check keyed by permit.Key()
//
// All holders must agree on n (ErrSizeMismatch). docs/primitives.md has the
// layouts, the algorithm and the guarantees.
package semaphore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/mode"
)

// MaxPermits is the largest number of permits a semaphore may have.
const MaxPermits = 1024

// DefaultPollInterval is how often the waiter at the head of the queue reads
// every slot again when no change was pushed.
const DefaultPollInterval = 500 * time.Millisecond

// ErrSizeMismatch means a holder of the semaphore uses another number of
// permits than this caller: the caller's permit was given back (or, in a
// backend's own layout, never granted). It is dlock.ErrSizeMismatch.
var ErrSizeMismatch = dlock.ErrSizeMismatch

// maxWatched is the most slots the head waiter watches; past it, it polls.
const maxWatched = 64

// Option configures a Semaphore.
type Option func(*config)

type config struct {
	lease     []dlock.AcquireOption
	sizeCheck bool
	poll      time.Duration
	slotLocks bool
}

// WithLeaseOptions passes opts to every acquire of a slot and of the queue
// (WithTTL, say); a WithLabel among them labels only the queue, as a permit's
// label is "permits=N HOSTNAME:PID".
func WithLeaseOptions(opts ...dlock.AcquireOption) Option {
	return func(c *config) { c.lease = append(c.lease, opts...) }
}

// WithSizeCheck turns on (the default) or off the List after each grant in
// the portable layout that refuses a caller disagreeing on n; off, the
// semaphore admits up to the largest n any caller uses. It has no effect
// where Native is true.
func WithSizeCheck(on bool) Option {
	return func(c *config) { c.sizeCheck = on }
}

// WithSlotLocks keeps the semaphore in the portable layout even where the
// backend has a counted semaphore of its own, for callers that also take the
// slots as locks (rwlock's writers). Off by default.
func WithSlotLocks() Option {
	return func(c *config) { c.slotLocks = true }
}

// WithPollInterval sets how often the head waiter reads every slot again
// (DefaultPollInterval by default); d must be > 0.
func WithPollInterval(d time.Duration) Option {
	return func(c *config) { c.poll = d }
}

// Semaphore is a named semaphore of n permits on one Locker. It is safe for
// concurrent use; two Semaphore values of one name, in one process or in
// many, share the permits.
type Semaphore struct {
	l       dlock.Locker
	name    string
	n       int
	counted bool                  // in the backend's own layout: l.Capabilities().NativeSemaphore
	opts    []dlock.AcquireOption // of a permit: the caller's, then its label and WithAnnounce (and mode.WithPermits)
	cfg     config
}

// New returns the semaphore name of n permits on l, without a call to the
// backend. It fails with dlock.ErrInvalidKey for a name that cannot make slot
// keys, and dlock.ErrInvalidOption for n outside 1..MaxPermits or a bad option.
func New(l dlock.Locker, name string, n int, opts ...Option) (*Semaphore, error) {
	cfg := config{sizeCheck: true, poll: DefaultPollInterval}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case l == nil:
		return nil, fmt.Errorf("semaphore %q: %w: nil Locker", name, dlock.ErrInvalidOption)
	case n < 1 || n > MaxPermits:
		return nil, fmt.Errorf("semaphore %q: %w: permits must be 1..%d, got %d", name, dlock.ErrInvalidOption, MaxPermits, n)
	case cfg.poll <= 0:
		return nil, fmt.Errorf("semaphore %q: %w: poll interval must be > 0, got %v", name, dlock.ErrInvalidOption, cfg.poll)
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if l.Capabilities().NativeSemaphore && !cfg.slotLocks {
		// The driver records n beside the holder's label itself.
		permit := append(cfg.lease[:len(cfg.lease):len(cfg.lease)],
			dlock.WithLabel(dlock.DefaultLabel), dlock.WithAnnounce(), mode.WithPermits(n))
		return &Semaphore{l: l, name: name, n: n, counted: true, cfg: cfg, opts: permit}, nil
	}
	permit := append(cfg.lease[:len(cfg.lease):len(cfg.lease)],
		dlock.WithLabel("permits="+strconv.Itoa(n)+" "+dlock.DefaultLabel), dlock.WithAnnounce())
	return &Semaphore{l: l, name: name, n: n, cfg: cfg, opts: permit}, nil
}

// CheckName reports whether name can name a semaphore: the keys of its slots
// must be valid keys (non-empty, valid UTF-8, no NUL, at most
// dlock.MaxKeyLen bytes). The error matches dlock.ErrInvalidKey.
func CheckName(name string) error {
	const longest = "/permits/queue"
	switch {
	case name == "":
		return fmt.Errorf("semaphore: %w: empty name", dlock.ErrInvalidKey)
	case !utf8.ValidString(name) || strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("semaphore %q: %w: the name must be valid UTF-8 without NUL", name, dlock.ErrInvalidKey)
	case len(name)+len(longest) > dlock.MaxKeyLen:
		return fmt.Errorf("semaphore: %w: a name of %d bytes makes slot keys longer than %d bytes", dlock.ErrInvalidKey, len(name), dlock.MaxKeyLen)
	}
	return nil
}

// Locker returns the Locker the semaphore is on.
func (s *Semaphore) Locker() dlock.Locker { return s.l }

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns n, the number of permits.
func (s *Semaphore) Permits() int { return s.n }

// Native reports whether the semaphore is held in the backend's own layout
// (its Locker's Capabilities().NativeSemaphore) rather than in
// slot locks.
func (s *Semaphore) Native() bool { return s.counted }

// slotOf returns the slot of a lease of the semaphore's.
func (s *Semaphore) slotOf(lease *dlock.Lease) (int, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(lease.Key(), s.name+"/permits/"))
	if err != nil || i < 0 || i >= s.n {
		return 0, fmt.Errorf("semaphore %q: a permit on %q, not one of the %d slots", s.name, lease.Key(), s.n)
	}
	return i, nil
}

// SlotKey returns the lock key of slot i: NAME/permits/i.
func (s *Semaphore) SlotKey(i int) string { return SlotKey(s.name, i) }

// SlotKey returns the lock key of slot i of the semaphore name.
func SlotKey(name string, i int) string { return name + "/permits/" + strconv.Itoa(i) }

func (s *Semaphore) queueKey() string { return s.name + "/permits/queue" }

// Permit is one permit of a semaphore: the lease on one of its slots. Its
// methods are safe for concurrent use.
type Permit struct {
	sem   *Semaphore
	slot  int
	lease *dlock.Lease
}

// Slot returns the index of the permit's slot, 0..n-1.
func (p *Permit) Slot() int { return p.slot }

// Key returns the lock key of the permit's slot. A resource that fences
// permit holders keys its guard by it: the token is strictly increasing per
// slot, not across slots.
func (p *Permit) Key() string { return p.lease.Key() }

// Token returns the permit's fencing token: strictly greater than every
// earlier grant's of the same slot (Key) on backends with strict tokens.
func (p *Permit) Token() dlock.Token { return p.lease.Token() }

// Lease returns the lease on the permit's slot.
func (p *Permit) Lease() *dlock.Lease { return p.lease }

// Done is closed when the permit ends: released, or lost (Err says which).
func (p *Permit) Done() <-chan struct{} { return p.lease.Done() }

// Err is nil while the permit is held; afterwards an error matching
// dlock.ErrReleased or dlock.ErrLeaseLost.
func (p *Permit) Err() error { return p.lease.Err() }

// Release gives the permit back. It returns an error matching
// dlock.ErrLeaseLost if the permit had been lost, dlock.ErrReleased if it was
// already released.
func (p *Permit) Release(ctx context.Context) error {
	if err := p.lease.Release(ctx); err != nil {
		return fmt.Errorf("semaphore %q: release permit %d: %w", p.sem.name, p.slot, err)
	}
	return nil
}

// TryAcquire makes one attempt at each slot, from a random one on, and
// returns the first permit granted. If every slot is held it returns an
// error matching dlock.ErrNotAcquired.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Permit, error) {
	ps, err := s.TryAcquireN(ctx, 1)
	if err != nil {
		return nil, err
	}
	return ps[0], nil
}

// Acquire waits until a permit is granted, riding out what a Locker's
// Acquire rides out, or ctx ends: then the error matches
// dlock.ErrNotAcquired and ctx's error, and nothing is left behind.
func (s *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	ps, err := s.AcquireN(ctx, 1)
	if err != nil {
		return nil, err
	}
	return ps[0], nil
}

// TryAcquireN takes k permits (1 ≤ k ≤ n) at once or none: one attempt at
// each slot; if fewer than k are free, it gives back what it took and
// returns an error matching dlock.ErrNotAcquired.
func (s *Semaphore) TryAcquireN(ctx context.Context, k int) ([]*Permit, error) {
	ps, err := s.acquire(ctx, k, false)
	if err == nil && ps == nil {
		err = fmt.Errorf("%w: fewer than %d of the %d permits are free", dlock.ErrNotAcquired, k, s.n)
	}
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: try-acquire: %w", s.name, err)
	}
	return ps, nil
}

// AcquireN waits until it holds k permits (1 ≤ k ≤ n), in slot order, or
// ctx ends, as Acquire does; only the head of the queue keeps what it gathers,
// so two callers never hold part of what the other needs.
func (s *Semaphore) AcquireN(ctx context.Context, k int) ([]*Permit, error) {
	ps, err := s.acquire(ctx, k, true)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: acquire: %w", s.name, err)
	}
	return ps, nil
}

// acquire takes k permits; without wait it returns (nil, nil) if fewer are
// free.
func (s *Semaphore) acquire(ctx context.Context, k int, wait bool) (ps []*Permit, err error) {
	if k < 1 || k > s.n {
		return nil, fmt.Errorf("%w: asked for %d permits of %d", dlock.ErrInvalidOption, k, s.n)
	}
	held := map[int]*dlock.Lease{}
	defer func() {
		if ps == nil {
			s.giveBack(ctx, held)
		}
	}()
	err = s.tryMore(ctx, held, k, nil)
	if wait && err != nil && ctx.Err() == nil && !permanent(err) {
		// A try failed (a link cut, a server restarting): queue, below,
		// where a waiting Acquire rides out what Acquire rides out.
		err = nil
	}
	if err != nil || len(held) == k {
		if ps, err := s.complete(ctx, held, err); !wait || !errors.Is(err, errLostInCheck) {
			return ps, err
		}
	}
	if !wait {
		return nil, nil
	}
	// Not enough free: give back what the first try took, and queue.
	for {
		s.giveBack(ctx, held)
		ps, err := s.waitQueued(ctx, held, k)
		if errors.Is(err, errQueueLost) {
			continue // give back what it gathered, and queue again
		}
		if err != nil {
			return nil, err
		}
		// Leaving the queue, a release behind whatever else its session is
		// doing, may have outlasted a permit that passed complete's check
		// (a renewal that failed meanwhile, a lock broken, a paused
		// process): never hand out a permit that is already lost, whose
		// slot another holder may have been granted by now. Queue again.
		if !slices.ContainsFunc(ps, func(p *Permit) bool { return p.Err() != nil }) {
			return ps, nil
		}
	}
}

// waitQueued queues on the semaphore's queue lock and, once at its head,
// gathers permits into held until it has k or ctx ends; it leaves the queue
// before it returns. The queue's lock admits one waiter at a time to watch
// the slots (and keep what it gathers); the others wait in the backend's
// order. If the queue lock is lost before it has k (broken, its session
// ended), another waiter may be at the head and gathering: it returns
// errQueueLost, and the caller gives back what it gathered and queues again.
func (s *Semaphore) waitQueued(ctx context.Context, held map[int]*dlock.Lease, k int) ([]*Permit, error) {
	q, err := s.l.Acquire(ctx, s.queueKey(), s.cfg.lease...)
	if err != nil {
		return nil, err
	}
	defer q.Release(context.WithoutCancel(ctx)) // bounded by the release timeout

	// qctx ends with ctx, or with the cause errQueueLost when q is lost.
	qctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() { // owned by waitQueued: ends when qctx does, at its return at the latest
		select {
		case <-q.Done():
			cancel(errQueueLost)
		case <-qctx.Done():
		}
	}()
	fail := func(err error) ([]*Permit, error) {
		if ctx.Err() == nil && errors.Is(context.Cause(qctx), errQueueLost) {
			return nil, fmt.Errorf("%w: %w", errQueueLost, q.Err())
		}
		return nil, err
	}

	if s.counted {
		ps, err := s.waitCounted(qctx, held, k)
		if err != nil {
			return fail(err)
		}
		return ps, nil
	}
	changed, set, unwatched, stop := s.watch(qctx)
	defer stop()
	watched := true
	tick := time.NewTicker(s.cfg.poll)
	defer tick.Stop()
	var first *int
	for next := rand.IntN(s.n); ; next = (next + 1) % s.n {
		err := s.tryMore(qctx, held, k, first)
		if i, ok := ridable(err); ok && qctx.Err() == nil {
			// A try failed (a link cut, a server restarting): a waiting
			// Acquire of that slot, for at most an interval, rides out
			// what Acquire rides out, and returns what it does not.
			if err := s.waitOn(qctx, held, i); err != nil {
				return fail(err)
			}
			first = nil
			continue
		}
		if err != nil || len(held) == k {
			ps, err := s.complete(ctx, held, err)
			if err == nil {
				return ps, nil
			}
			if !errors.Is(err, errLostInCheck) {
				return fail(err)
			}
			s.giveBack(ctx, held) // and gather again
		}
		if watched {
			select {
			case <-unwatched:
				watched = false
			default:
			}
		}
		if !watched {
			// Wait on one slot not held yet, in the backend's own way, for
			// at most an interval; then read all slots again.
			for held[next] != nil {
				next = (next + 1) % s.n
			}
			if err := s.waitOn(qctx, held, next); err != nil {
				return fail(err)
			}
			continue
		}
		select {
		case i := <-changed:
			first = &i // try the slot that changed first
		case <-tick.C:
			first = nil
		case <-set:
			set, first = nil, nil // read every slot: a change before the watches were in place went unreported
		case <-unwatched:
			watched, first = false, nil
		case <-qctx.Done():
			return fail(notAcquired(ctx))
		}
	}
}

// errQueueLost means the head waiter's queue lock was lost before it had
// every permit it waits for.
var errQueueLost = errors.New("the queue lock was lost")

// waitCounted gathers permits into held, in the backend's own layout, until
// it has k or ctx ends: one waiting counted acquire at a time, each queued
// and woken by the backend.
func (s *Semaphore) waitCounted(ctx context.Context, held map[int]*dlock.Lease, k int) ([]*Permit, error) {
	for {
		for len(held) < k {
			lease, err := s.l.Acquire(ctx, s.name, s.opts...)
			if err != nil {
				return nil, err
			}
			if err := s.add(held, lease); err != nil {
				return nil, err
			}
		}
		ps, err := s.complete(ctx, held, nil)
		if !errors.Is(err, errLostInCheck) {
			return ps, err
		}
		s.giveBack(ctx, held) // and gather again
	}
}

// add puts a counted lease into held by its slot; a lease on a slot the
// semaphore cannot have (a driver's bug) is given back.
func (s *Semaphore) add(held map[int]*dlock.Lease, lease *dlock.Lease) error {
	i, err := s.slotOf(lease)
	if err == nil && held[i] != nil {
		err = fmt.Errorf("semaphore %q: slot %d granted twice", s.name, i)
	}
	if err != nil {
		_ = lease.Release(context.Background())
		return err
	}
	held[i] = lease
	return nil
}

// watch watches every slot until stop is called, and sends a slot's index
// on changed when it may have changed. It sets the watches up in the
// background, so the head waiter polls meanwhile (a link cut can hold a
// setup up for long): it closes set once they are in place, or unwatched,
// ending those already set up, if one cannot be (the backend cannot watch,
// as the table lock) or the semaphore has more than maxWatched slots.
func (s *Semaphore) watch(ctx context.Context) (changed chan int, set, unwatched <-chan struct{}, stop func()) {
	changed = make(chan int, maxWatched)
	ok, failed := make(chan struct{}), make(chan struct{})
	if s.n > maxWatched {
		close(failed)
		return changed, ok, failed, func() {}
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // owned by stop, which waits for it
		defer close(done)
		for i := range s.n {
			err := dlock.Watch(wctx, s.l, s.SlotKey(i), func() {
				select {
				case changed <- i:
				default:
				}
			})
			if err != nil {
				cancel() // end the watches already set up
				close(failed)
				return
			}
		}
		close(ok)
	}()
	return changed, ok, failed, func() { cancel(); <-done }
}

// waitOn waits up to the poll interval for slot i, and adds it to held if
// granted.
func (s *Semaphore) waitOn(ctx context.Context, held map[int]*dlock.Lease, i int) error {
	wctx, cancel := context.WithTimeout(ctx, s.cfg.poll)
	defer cancel()
	lease, err := s.l.Acquire(wctx, s.SlotKey(i), s.opts...)
	switch {
	case err == nil:
		held[i] = lease
		return nil
	case ctx.Err() != nil:
		return notAcquired(ctx)
	case errors.Is(err, dlock.ErrNotAcquired):
		return nil
	default:
		return err
	}
}

func notAcquired(ctx context.Context) error {
	return fmt.Errorf("%w: %w", dlock.ErrNotAcquired, context.Cause(ctx))
}

// tryMore tries every slot not in held once, from first (or a random slot)
// on, until held has k.
func (s *Semaphore) tryMore(ctx context.Context, held map[int]*dlock.Lease, k int, first *int) error {
	if s.counted {
		// One attempt per permit; the backend picks the slot.
		for len(held) < k {
			lease, err := s.l.TryAcquire(ctx, s.name, s.opts...)
			switch {
			case err == nil:
				if err := s.add(held, lease); err != nil {
					return err
				}
				continue
			case !errors.Is(err, dlock.ErrNotAcquired):
				return err
			case ctx.Err() == nil:
				return nil // fewer than k free
			case errors.Is(err, ctx.Err()):
				return err
			default:
				return fmt.Errorf("%w (%w)", notAcquired(ctx), err)
			}
		}
		return nil
	}
	start := rand.IntN(s.n)
	if first != nil {
		start = *first
	}
	for j := 0; j < s.n && len(held) < k; j++ {
		i := (start + j) % s.n
		if held[i] != nil {
			continue
		}
		lease, err := s.l.TryAcquire(ctx, s.SlotKey(i), s.opts...)
		switch {
		case err == nil:
		case !errors.Is(err, dlock.ErrNotAcquired):
			return &tryError{slot: i, err: err}
		case ctx.Err() == nil:
			continue
		case errors.Is(err, ctx.Err()):
			return err
		default:
			// Cancelled while the try was out, which found the slot held:
			// report the cancel, as a cancelled Acquire does, and what the
			// try found.
			return fmt.Errorf("%w (slot %d: %w)", notAcquired(ctx), i, err)
		}
		held[i] = lease
	}
	return nil
}

// tryError is the error of a try at one slot that failed (not one that
// found the slot held).
type tryError struct {
	slot int
	err  error
}

func (e *tryError) Error() string { return e.err.Error() }
func (e *tryError) Unwrap() error { return e.err }

// ridable reports whether err is a try's failure that a waiting acquire
// rides out, unless a waiting Acquire of the slot says otherwise, and which
// slot failed.
func ridable(err error) (slot int, ok bool) {
	var te *tryError
	if !errors.As(err, &te) || permanent(err) {
		return 0, false
	}
	return te.slot, true
}

// permanent reports whether err, from an acquire, is one that no wait can
// change: the Locker closed, a bad key or option, a disagreement on n, an
// operation the backend lacks.
func permanent(err error) bool {
	return errors.Is(err, dlock.ErrClosed) || errors.Is(err, dlock.ErrInvalidKey) ||
		errors.Is(err, dlock.ErrInvalidOption) || errors.Is(err, dlock.ErrSizeMismatch) ||
		errors.Is(err, errors.ErrUnsupported)
}

// complete makes the leases in held permits, once the size check passed
// (the caller gives them back on an error).
func (s *Semaphore) complete(ctx context.Context, held map[int]*dlock.Lease, err error) ([]*Permit, error) {
	if err != nil {
		return nil, err
	}
	err = s.checkSize(ctx, held)
	// The check may have outlasted a lease (a slow List, which then fails
	// at the lease's deadline): never hand out a permit that is already
	// lost.
	for i, lease := range held {
		if lerr := lease.Err(); lerr != nil {
			return nil, fmt.Errorf("%w: permit %d was lost while the number of permits was checked: %w", errLostInCheck, i, lerr)
		}
	}
	if err != nil {
		return nil, err
	}
	ps := make([]*Permit, 0, len(held))
	for i := range s.n {
		if lease := held[i]; lease != nil {
			ps = append(ps, &Permit{sem: s, slot: i, lease: lease})
		}
	}
	return ps, nil
}

// giveBack releases every lease in held, whatever ctx has become, and
// empties it.
func (s *Semaphore) giveBack(ctx context.Context, held map[int]*dlock.Lease) {
	if len(held) == 0 {
		return
	}
	for i, lease := range held {
		_ = lease.Release(context.WithoutCancel(ctx)) // bounded by the release timeout
		delete(held, i)
	}
}

// errLostInCheck means a lease taken for a permit was lost before the grant
// completed; the acquire gives back the rest and, if it waits, goes on.
var errLostInCheck = fmt.Errorf("%w: lost before the grant completed", dlock.ErrNotAcquired)

// checkSize reads the held slots and refuses the grant if a holder uses
// another number of permits. It does not outlast the leases in held.
func (s *Semaphore) checkSize(ctx context.Context, held map[int]*dlock.Lease) error {
	if !s.cfg.sizeCheck || s.counted { // counted: the driver checked, under the semaphore's lock
		return nil
	}
	var until time.Time
	for _, lease := range held {
		if d := lease.Deadline(); until.IsZero() || d.Before(until) {
			until = d
		}
	}
	lctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	defer cancel()
	infos, err := dlock.List(lctx, s.l, s.name+"/permits/")
	if errors.Is(err, errors.ErrUnsupported) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check the number of permits: %w", err)
	}
	for _, in := range infos {
		rest := strings.TrimPrefix(in.Key, s.name+"/permits/")
		slot, err := strconv.Atoi(rest)
		if err != nil || !in.Held {
			continue // the queue, or another name that shares the prefix
		}
		if slot >= s.n {
			return fmt.Errorf("%w: permit %d is held (label %q), this semaphore has %d", ErrSizeMismatch, slot, in.Label, s.n)
		}
		if m, ok := ParseLabel(in.Label); ok && m != s.n {
			return fmt.Errorf("%w: the holder of permit %d (label %q) uses %d permits, this semaphore %d", ErrSizeMismatch, slot, in.Label, m, s.n)
		}
	}
	return nil
}

// ParseLabel reads the number of permits from a permit's label
// ("permits=N ..."). ok is false for a label of another form.
func ParseLabel(label string) (n int, ok bool) {
	rest, found := strings.CutPrefix(label, "permits=")
	if !found {
		return 0, false
	}
	if i := strings.IndexByte(rest, ' '); i >= 0 {
		rest = rest[:i]
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n > 0
}
