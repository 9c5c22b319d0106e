package conformance

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/rwlock"
)

func (s *suite) rwmutex(t *testing.T, l dlock.Locker, name string, opts ...dlock.AcquireOption) *rwlock.RWMutex {
	t.Helper()
	m, err := rwlock.New(l, name, opts...)
	if err != nil {
		t.Fatalf("rwlock.New(%q): %v", name, err)
	}
	return m
}

// testRWExclusion: 3 lockers, each with 2 writers and 3 readers looping. A
// writer never holds the lock with anyone else, readers do hold it side by
// side where the backend is fast enough (RWNested proves they can), writes pass a guard keyed by the lock (strictly increasing tokens
// where tokens are strict), and a read's token lies between the writes: above
// every write granted before it, below every write granted after it.
func (s *suite) testRWExclusion(t *testing.T) {
	const lockers, writers, readers, rounds = 3, 2, 3, 6
	ctx := s.ctx(t)
	name := key(t)
	strict := s.caps.Fencing == backend.FencingStrict
	var (
		guard     fencing.Guard
		mu        sync.Mutex
		nReaders  int
		nWriters  int
		mostReads int
		lastWrite dlock.Token // the token of the last write, set while writing
		maxRead   dlock.Token // the highest read token granted so far
	)
	enter := func(write bool, tok dlock.Token) {
		mu.Lock()
		defer mu.Unlock()
		if write {
			nWriters++
			if nWriters > 1 || nReaders > 0 {
				t.Errorf("a writer holds the lock with %d writer(s) and %d reader(s)", nWriters-1, nReaders)
			}
			if strict && tok <= maxRead {
				t.Errorf("write token %v is not above the read token %v granted before it", tok, maxRead)
			}
			lastWrite = tok
			return
		}
		nReaders++
		mostReads = max(mostReads, nReaders)
		if nWriters > 0 {
			t.Errorf("a reader holds the lock with a writer")
		}
		if strict && tok <= lastWrite {
			t.Errorf("read token %v is not above the write token %v granted before it", tok, lastWrite)
		}
		maxRead = max(maxRead, tok)
	}
	leave := func(write bool) {
		mu.Lock()
		defer mu.Unlock()
		if write {
			nWriters--
		} else {
			nReaders--
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, lockers*(writers+readers))
	for range lockers {
		m := s.rwmutex(t, s.locker(t), name, dlock.WithTTL(30*time.Second))
		for i := range writers + readers {
			write := i < writers
			wg.Go(func() {
				for range rounds {
					lock := m.RLock
					if write {
						lock = m.Lock
					}
					h, err := lock(ctx)
					if err != nil {
						errs <- err
						return
					}
					enter(write, h.Token())
					if write && s.fences() {
						if err := guard.Do(name, h.Token(), func() error { return nil }); err != nil {
							t.Errorf("write: %v", err)
						}
					}
					time.Sleep(5 * time.Millisecond)
					leave(write)
					if err := h.Release(context.Background()); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("rwlock: %v", err)
	}
	// Whether readers overlapped here depends on the backend's speed;
	// RWNested proves that they share.
	t.Logf("at most %d readers at once", mostReads)
}

// testRWWriterNotStarved: while readers keep reading, back to back, a writer
// is granted within the suite's bound, and readers that ask after it has
// taken the write lock wait for it.
func (s *suite) testRWWriterNotStarved(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	stop := make(chan struct{})
	var (
		wg    sync.WaitGroup
		reads atomic.Int64
	)
	for range 3 {
		m := s.rwmutex(t, s.locker(t), name)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				h, err := m.RLock(ctx)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("reader: %v", err)
					}
					return
				}
				reads.Add(1)
				time.Sleep(10 * time.Millisecond)
				h.Release(context.Background())
			}
		})
	}
	defer wg.Wait()
	defer close(stop)
	for reads.Load() < 10 {
		time.Sleep(5 * time.Millisecond)
	}
	w := s.rwmutex(t, s.locker(t), name)
	start := time.Now()
	h, err := w.Lock(ctx)
	if err != nil {
		t.Fatalf("the writer among busy readers: %v", err)
	}
	t.Logf("the writer waited %v among readers", time.Since(start))
	// Held: no reader gets in.
	if r, err := s.rwmutex(t, s.locker(t), name).TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		if err == nil {
			r.Release(ctx)
		}
		t.Errorf("TryRLock while a writer holds the lock: %v, want ErrNotAcquired", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// testRWWriterFirst: a writer waiting for a reader to leave holds the way:
// a reader that asks after it waits for it, and gets in only once the writer
// has written and released.
func (s *suite) testRWWriterFirst(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	r1, err := s.rwmutex(t, s.locker(t), name).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 2)
	wm := s.rwmutex(t, s.locker(t), name)
	wrote := make(chan *rwlock.Hold, 1)
	go func() {
		h, err := wm.Lock(ctx)
		if err != nil {
			t.Errorf("writer: %v", err)
		}
		order <- "writer"
		wrote <- h
	}()
	// The writer holds the write lock once it waits for the read slots; on
	// the backend's own shared lock, it waits in the backend's queue.
	probe := s.locker(t)
	if wm.Shared() {
		s.waitWaiting(t, wm.WriteKey(), 1)
	}
	for end := time.Now().Add(s.waitBound()); !wm.Shared(); {
		in, err := dlock.Inspect(ctx, probe, wm.WriteKey())
		if err != nil && !errors.Is(err, errors.ErrUnsupported) {
			t.Fatal(err)
		}
		if in.Held || err != nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the writer never took the write lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	rm := s.rwmutex(t, s.locker(t), name)
	read := make(chan *rwlock.Hold, 1)
	go func() {
		h, err := rm.RLock(ctx)
		if err != nil {
			t.Errorf("later reader: %v", err)
		}
		order <- "reader"
		read <- h
	}()
	if _, err := s.rwmutex(t, s.locker(t), name).TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("TryRLock while a writer waits: %v, want ErrNotAcquired", err)
	}
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-wrote
	if first := <-order; first != "writer" {
		t.Fatalf("%s got in first; the writer was waiting before the reader asked", first)
	}
	if w == nil {
		return
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-read; r != nil {
		if s.fences() && r.Token() < w.Token() {
			t.Errorf("the later read's token %v is below the write's %v", r.Token(), w.Token())
		}
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// testRWHolderVanishes: a reader that vanished (no renewal; crashed where
// the harness can) stops holding the lock after its TTL, never before its
// deadline: a writer waits for it, then gets in.
func (s *suite) testRWHolderVanishes(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	la := s.locker(t)
	a := s.rwmutex(t, la, name, dlock.WithTTL(s.ttl), dlock.WithAutoRenew(false))
	r, err := a.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cr, ok := s.h.(Crasher); ok {
		cr.Crash(t, la)
	}
	w, err := s.rwmutex(t, s.locker(t), name).Lock(ctx)
	returned := time.Now()
	if err != nil {
		t.Fatalf("the writer after the reader vanished: %v", err)
	}
	defer w.Release(context.Background())
	// The writer's hold is complete when its last slot was granted, which
	// is after the vanished reader's slot was free again.
	if !w.Deadline().After(w.GrantedAt()) {
		t.Errorf("the write hold's deadline %v is not after its grant %v", w.Deadline(), w.GrantedAt())
	}
	notBefore(t, "the write hold (after a vanished reader)", w.GrantedAt(), returned, r.Deadline())
	if s.fences() && w.Token() <= r.Token() {
		t.Errorf("write token %v not above the vanished read's %v", w.Token(), r.Token())
	}
	waitDone(t, r.Lease(), time.Second, "vanished reader's hold")
	select {
	case <-r.Done():
	case <-time.After(time.Second):
		t.Fatal("the vanished reader's hold did not end")
	}
	if !errors.Is(r.Err(), dlock.ErrLeaseLost) {
		t.Errorf("vanished reader's Err() = %v, want ErrLeaseLost", r.Err())
	}
}

// testRWWriteLoss: a write hold whose read slot the backend forgets (not
// its write lock; on the backend's own shared lock, the lock) is lost: Done
// closes, Err and Release report ErrLeaseLost, and another writer then gets
// in.
func (s *suite) testRWWriteLoss(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	ttl, bound := s.ttl, 2*s.ttl
	if s.caps.LossNotify {
		ttl, bound = 60*time.Second, 5*time.Second // only a loss notification explains a prompt end
	}
	m := s.rwmutex(t, s.locker(t), name, dlock.WithTTL(ttl))
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Shared() {
		s.h.Expire(t, m.WriteKey())
	} else {
		s.h.Expire(t, m.ReadKeys()[5])
	}
	select {
	case <-h.Done():
	case <-time.After(bound):
		t.Fatalf("the write hold did not end within %v of losing a read slot (loss-notify=%v)", bound, s.caps.LossNotify)
	}
	if !errors.Is(h.Err(), dlock.ErrLeaseLost) {
		t.Errorf("Err() = %v, want ErrLeaseLost", h.Err())
	}
	if err := h.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("Release of a lost write hold: %v, want ErrLeaseLost", err)
	}
	w, err := s.rwmutex(t, s.locker(t), name).Lock(ctx)
	if err != nil {
		t.Fatalf("the next writer: %v", err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// testRWNested: under a hold's ctx, Lock and RLock of the same lock are
// refused with ErrNested (an upgrade or downgrade would wait for itself);
// readers share, and a writer is refused while one reads.
func (s *suite) testRWNested(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	m := s.rwmutex(t, s.locker(t), name)
	other := s.rwmutex(t, s.locker(t), name)
	err := m.Read(ctx, func(fctx context.Context, h *rwlock.Hold) error {
		if h.Write() {
			t.Error("Read's hold says it writes")
		}
		if _, err := m.Lock(fctx); !errors.Is(err, rwlock.ErrNested) {
			t.Errorf("Lock under a read hold's ctx: %v, want ErrNested", err)
		}
		if _, err := m.TryRLock(fctx); !errors.Is(err, rwlock.ErrNested) {
			t.Errorf("TryRLock under a read hold's ctx: %v, want ErrNested", err)
		}
		r, err := other.TryRLock(ctx)
		if err != nil {
			t.Fatalf("a second reader: %v", err)
		}
		if _, err := other.TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("TryLock while two read: %v, want ErrNotAcquired", err)
		}
		return r.Release(ctx)
	})
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	err = m.Write(ctx, func(fctx context.Context, h *rwlock.Hold) error {
		if _, err := m.RLock(fctx); !errors.Is(err, rwlock.ErrNested) {
			t.Errorf("RLock under a write hold's ctx: %v, want ErrNested", err)
		}
		if _, err := other.TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("TryRLock while one writes: %v, want ErrNotAcquired", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
}

// testRWCancel: a writer cancelled while readers hold the lock returns
// ErrNotAcquired with ctx's error and leaves nothing: the readers keep
// reading, and once they release, every key of the lock is free.
func (s *suite) testRWCancel(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	m := s.rwmutex(t, s.locker(t), name)
	r, err := m.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := s.rwmutex(t, s.locker(t), name).Lock(wctx); !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a writer whose ctx ends while a reader reads: %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if err := r.Err(); err != nil {
		t.Fatalf("the reader after the writer gave up: %v", err)
	}
	r2, err := s.rwmutex(t, s.locker(t), name).TryRLock(ctx)
	if err != nil {
		t.Fatalf("another reader after the writer gave up: %v", err)
	}
	mustRelease(t, r2.Lease())
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range append(m.ReadKeys(), m.WriteKey()) {
		if left := s.residue(t, k); len(left) > 0 {
			t.Fatalf("after every hold ended, the backend still holds %q", left)
		}
	}
	w, err := s.rwmutex(t, s.locker(t), name).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock once everyone left: %v", err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
