package dlock

import (
	"container/heap"
	"sync"
	"time"
)

// scheduler is a Locker's one keepalive loop. It keeps every live lease in a
// heap ordered by the time the lease next needs attention (its next renewal or
// its deadline) and calls Lease.tick when that time comes. Renewals themselves
// run in short-lived goroutines it owns, so one slow backend call never delays
// another lease's deadline. stop waits for all of them.
type scheduler struct {
	mu    sync.Mutex
	items map[*Lease]*schedItem
	queue schedHeap
	armed time.Time     // when the loop's timer fires next; zero while the loop is busy
	wake  chan struct{} // buffered(1): an event earlier than armed was added
	quit  chan struct{}
	wg    sync.WaitGroup // the loop, renewals, loss watchers, clean-up releases
	once  sync.Once
}

type schedItem struct {
	lease *Lease
	when  time.Time
	index int
}

func newScheduler() *scheduler {
	s := &scheduler{
		items: map[*Lease]*schedItem{},
		wake:  make(chan struct{}, 1),
		quit:  make(chan struct{}),
	}
	s.wg.Add(1)
	go s.loop()
	return s
}

// schedule sets (or moves) the lease's next event.
func (s *scheduler) schedule(l *Lease, when time.Time) {
	s.mu.Lock()
	it, ok := s.items[l]
	if ok {
		it.when = when
		heap.Fix(&s.queue, it.index)
	} else {
		it = &schedItem{lease: l, when: when}
		s.items[l] = it
		heap.Push(&s.queue, it)
	}
	// Wake the loop only if its timer would fire too late for this event. In a
	// steady acquire/release loop no event is earlier than the armed timer, so
	// scheduling costs no goroutine switch.
	early := !s.armed.IsZero() && when.Before(s.armed)
	if early {
		s.armed = time.Time{}
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
	if it, ok := s.items[l]; ok {
		heap.Remove(&s.queue, it.index)
		delete(s.items, l)
	}
}

func (s *scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// spawn runs f in a goroutine that stop waits for.
func (s *scheduler) spawn(f func()) {
	s.wg.Go(f)
}

// stop ends the loop and waits for every goroutine the scheduler owns. The
// Locker calls it after every lease has ended.
func (s *scheduler) stop() {
	s.once.Do(func() { close(s.quit) })
	s.wg.Wait()
}

func (s *scheduler) loop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var due []*Lease
		s.mu.Lock()
		for len(s.queue) > 0 && !s.queue[0].when.After(now) {
			it := heap.Pop(&s.queue).(*schedItem)
			delete(s.items, it.lease)
			due = append(due, it.lease)
		}
		s.armed = time.Time{} // busy: every schedule call until re-armed must not be missed
		s.mu.Unlock()
		for _, l := range due {
			l.tick(now) // reschedules the lease if it is still held
		}

		s.mu.Lock()
		next := time.Now().Add(time.Hour)
		if len(s.queue) > 0 {
			next = s.queue[0].when
		}
		s.armed = next
		s.mu.Unlock()
		timer.Reset(max(time.Until(next), 0))
		select {
		case <-timer.C:
		case <-s.wake:
		case <-s.quit:
			return
		}
	}
}

// schedHeap is a min-heap of items by when.
type schedHeap []*schedItem

func (h schedHeap) Len() int           { return len(h) }
func (h schedHeap) Less(i, j int) bool { return h[i].when.Before(h[j].when) }
func (h schedHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *schedHeap) Push(x any) {
	it := x.(*schedItem)
	it.index = len(*h)
	*h = append(*h, it)
}
func (h *schedHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}
