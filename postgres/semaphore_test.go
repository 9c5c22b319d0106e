package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/observe"
	"github.com/dlock-go/dlock/semaphore"
)

// queueObserver watches one Locker's leases of a semaphore: it reports each
// grant of the semaphore's queue lock and each lost permit, and holds up
// the first release of the queue lock until unblock is closed.
type queueObserver struct {
	queue, slot string

	queued  chan struct{} // a grant of the queue lock
	lost    chan struct{} // a permit (a lease of slot) ended lost
	blocked chan struct{} // closed when the first release of the queue lock is held up
	unblock chan struct{} // closed by release: that release goes on
	held    sync.Once     // the first release of the queue lock
	freed   sync.Once     // closing unblock
}

// release lets the held-up release of the queue lock go on.
func (o *queueObserver) release() { o.freed.Do(func() { close(o.unblock) }) }

func newQueueObserver(name string) *queueObserver {
	return &queueObserver{queue: name + "/permits/queue", slot: semaphore.SlotKey(name, 0),
		queued: make(chan struct{}, 8), lost: make(chan struct{}, 8), blocked: make(chan struct{}), unblock: make(chan struct{})}
}

func (o *queueObserver) StartAcquire(ctx context.Context, a observe.AcquireInfo) (context.Context, func(observe.AcquireOutcome) observe.LeaseObserver) {
	return ctx, func(out observe.AcquireOutcome) observe.LeaseObserver {
		if out.Result != observe.ResultGranted {
			return nil
		}
		switch a.Key {
		case o.queue:
			o.queued <- struct{}{}
			return queueLease{o}
		case o.slot:
			return slotLease{o}
		}
		return nil
	}
}

type queueLease struct{ o *queueObserver }

func (queueLease) Renewed(time.Duration, error) {}
func (queueLease) Ended(observe.LeaseEnd)       {}
func (q queueLease) StartRelease(ctx context.Context) (context.Context, func(error)) {
	first := false
	q.o.held.Do(func() { first = true })
	if first {
		close(q.o.blocked)
		<-q.o.unblock
	}
	return ctx, func(error) {}
}

type slotLease struct{ o *queueObserver }

func (slotLease) Renewed(time.Duration, error) {}
func (slotLease) StartRelease(ctx context.Context) (context.Context, func(error)) {
	return ctx, func(error) {}
}
func (s slotLease) Ended(e observe.LeaseEnd) {
	if e.Lost {
		s.o.lost <- struct{}{}
	}
}

// A waiting semaphore Acquire leaves the queue after its last look at the
// permit it gathered; a permit lost while it leaves (the queue's release is
// a round trip, behind whatever else its session is doing, on a loaded
// host more) must not be handed out: its slot may be another holder's by
// then. The test holds the queue's release up, breaks the permit meanwhile
// and lets another holder take the slot; Acquire must then wait for the
// slot again, and return a permit of its own, above the other holder's.
// (CI: the soak's p0 was handed a permit with token 370 during p2's tenure
// of the slot with token 380.)
func TestSemaphoreHandsOutNoPermitLostLeavingTheQueue(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	const name = "sem/leaving-the-queue"
	obs := newQueueObserver(name)
	a := openLocker(t, h.srv.URL(), dlock.WithObserver(obs))
	b := openLocker(t, h.srv.URL())
	t.Cleanup(obs.release) // before the Lockers close: a failed test must not leave A's release held up
	opts := []semaphore.Option{semaphore.WithLeaseOptions(dlock.WithTTL(10 * time.Second)), semaphore.WithPollInterval(50 * time.Millisecond)}
	semA, err := semaphore.New(a, name, 1, opts...)
	if err != nil {
		t.Fatal(err)
	}
	semB, err := semaphore.New(b, name, 1, opts...)
	if err != nil {
		t.Fatal(err)
	}

	held, err := semB.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		p   *semaphore.Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := semA.Acquire(ctx)
		got <- result{p, err}
	}()
	<-obs.queued // A waits at the head of the queue
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A takes the slot, checks it, and leaves the queue: held up there.
	select {
	case <-obs.blocked:
	case r := <-got:
		t.Fatalf("Acquire returned (%v, %v) without releasing the queue lock", r.p, r.err)
	}
	if _, err := dlock.Break(ctx, b, semaphore.SlotKey(name, 0)); err != nil {
		t.Fatalf("break A's permit: %v", err)
	}
	<-obs.lost
	other, err := semB.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("B's TryAcquire after the break: %v", err)
	}
	obs.release()

	var r result
	select {
	case r = <-got:
	case <-obs.queued: // A queues again, as it should: the slot is B's
		if err := other.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r = <-got
	}
	if r.err != nil {
		t.Fatalf("Acquire: %v", r.err)
	}
	defer r.p.Release(context.Background())
	if err := r.p.Err(); err != nil {
		t.Fatalf("Acquire returned a permit (token %d) lost before it returned, while B held the slot with token %d: %v",
			r.p.Token(), other.Token(), err)
	}
	if r.p.Token() <= other.Token() {
		t.Errorf("Acquire returned token %d, not above B's %d", r.p.Token(), other.Token())
	}
}
