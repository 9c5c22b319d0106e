package dlock

import (
	"container/heap"
	"math"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/clock"
)

// scheduler is a Locker's one keepalive loop: it keeps every live lease in a
// heap by the time it next needs attention (its next renewal or its deadline)
// and calls Lease.tick then. Renewals run in goroutines it owns (stop waits for
// them), so a slow backend call never delays another lease's deadline. Times
// are readings of clk, which counts a host suspend; Go's timers do not, so
// while a lease lives the loop never sleeps longer than clock.MaxSleep.
type scheduler struct {
	clk   clock.Clock
	mu    sync.Mutex
	queue schedHeap     // of leases, each with its place (Lease.sched) in it
	armed time.Duration // when the loop's timer fires next, on clk; idle while the loop is busy
	// touched is set by schedule (under mu) and cleared by the loop each
	// time it sleeps: a loop that finds the queue empty keeps a short timer
	// while leases come and go (see loop).
	touched bool
	wake    chan struct{} // buffered(1): an event earlier than armed was added
	quit    chan struct{}
	wg      sync.WaitGroup // the loop, renewals, loss watchers, clean-up releases
	// stopped is set (under mu) when stop begins: spawn adds no goroutine
	// after it.
	stopped bool
	once    sync.Once

	armedHook func(sleep time.Duration) // tests: called each time the loop goes to sleep
}

// schedItem is a lease's place in its scheduler's queue, kept in the Lease
// rather than in an item of its own; its fields are guarded by the
// scheduler's mu.
type schedItem struct {
	when time.Duration // on clk
	pos  int           // 1 + its index in queue; 0 (the zero value) when not queued
}

// idle is the armed value while the loop is busy: every schedule call must then
// be seen by the loop's next pass.
const idle time.Duration = -1

func newScheduler(clk clock.Clock) *scheduler {
	s := &scheduler{
		clk:   clk,
		armed: idle,
		wake:  make(chan struct{}, 1),
		quit:  make(chan struct{}),
	}
	s.wg.Add(1)
	go s.loop()
	return s
}

// schedule sets (or moves) the lease's next event.
func (s *scheduler) schedule(l *Lease, when time.Duration) {
	s.mu.Lock()
	s.touched = true
	l.sched.when = when
	if l.sched.pos > 0 {
		heap.Fix(&s.queue, l.sched.pos-1)
	} else {
		heap.Push(&s.queue, l)
	}
	// Wake the loop only if its timer would fire too late for this event. In a
	// steady acquire/release loop no event is earlier than the armed timer, so
	// scheduling costs no goroutine switch.
	early := s.armed != idle && when < s.armed
	if early {
		s.armed = idle
	}
	s.mu.Unlock()
	if early {
		s.poke()
	}
}

// unschedule forgets the lease.
func (s *scheduler) unschedule(l *Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.sched.pos > 0 {
		heap.Remove(&s.queue, l.sched.pos-1)
	}
}

func (s *scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// spawn runs f in a goroutine that stop waits for. Once stop has begun, f
// is not run: the Locker is closing, its driver about to be closed, and a
// WaitGroup allows no Add while Wait is waiting.
func (s *scheduler) spawn(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.wg.Go(f)
}

// stop ends the loop and waits for every goroutine the scheduler owns. The
// Locker calls it after every lease has ended.
func (s *scheduler) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.once.Do(func() { close(s.quit) })
	s.wg.Wait()
}

func (s *scheduler) loop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := s.clk.Now()
		var due []*Lease
		s.mu.Lock()
		for len(s.queue) > 0 && s.queue[0].sched.when <= now {
			due = append(due, heap.Pop(&s.queue).(*Lease))
		}
		s.armed = idle // busy: every schedule call until re-armed must not be missed
		s.mu.Unlock()
		for _, l := range due {
			l.tick(now) // reschedules the lease if it is still held
		}

		// Sleep until the next event, but never longer than MaxSleep, so that
		// a suspend (which Go's timer does not count) is noticed soon after
		// the host resumes. With nothing queued, sleep MaxSleep too while
		// leases were scheduled since the last sleep, and until woken once a
		// whole MaxSleep passed without one. A Locker that takes and releases
		// leases one after another (its queue empty whenever the loop looks)
		// then costs the loop one wake-up per MaxSleep, not one per lease:
		// schedule pokes only for an event earlier than the armed timer, and
		// with the default TTL a new lease's first renewal is later than it.
		s.mu.Lock()
		now = s.clk.Now()
		sleep, armed := time.Hour, time.Duration(math.MaxInt64)
		switch {
		case len(s.queue) > 0:
			sleep = min(max(s.queue[0].sched.when-now, 0), clock.MaxSleep)
			armed = now + sleep
		case s.touched:
			sleep = clock.MaxSleep
			armed = now + sleep
		}
		s.touched = false
		s.armed = armed
		hook := s.armedHook
		s.mu.Unlock()
		if hook != nil {
			hook(sleep)
		}
		timer.Reset(sleep)
		select {
		case <-timer.C:
		case <-s.wake:
		case <-s.quit:
			return
		}
	}
}

// schedHeap is a min-heap of leases by their sched.when.
type schedHeap []*Lease

func (h schedHeap) Len() int           { return len(h) }
func (h schedHeap) Less(i, j int) bool { return h[i].sched.when < h[j].sched.when }
func (h schedHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].sched.pos = i + 1
	h[j].sched.pos = j + 1
}
func (h *schedHeap) Push(x any) {
	l := x.(*Lease)
	*h = append(*h, l)
	l.sched.pos = len(*h)
}
func (h *schedHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.sched.pos = 0
	return l
}
