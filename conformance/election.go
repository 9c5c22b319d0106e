package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/election"
)

// testElection: three candidates, each on its own Locker, run election.Run
// on one election until every one has led twice; each term does a fenced
// read-modify-write and resigns. At most one term runs at any moment, no
// update is lost, and each term's token is higher than the one before. An
// observer on a fourth Locker sees the terms in strictly increasing token
// order and ends on the last leader's value.
func (s *suite) testElection(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	const candidates, terms = 3, 2
	viewer := s.locker(t)
	if _, err := election.Leader(ctx, viewer, name); !supports(t, err, "report who leads") {
		return
	}
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	seen, err := election.Observe(octx, viewer, name, election.WithInterval(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var (
		omu      sync.Mutex
		observed []election.Info
	)
	observing := make(chan struct{})
	go func() {
		defer close(observing)
		for in := range seen {
			omu.Lock()
			observed = append(observed, in)
			omu.Unlock()
		}
	}()

	var (
		mu        sync.Mutex
		leading   int    // terms running now
		counter   int    // the fenced resource
		lastToken uint64 // the token of the last term to start
		lastValue string
		runErrs   = make(chan error, candidates)
	)
	for c := range candidates {
		l := s.locker(t)
		value := fmt.Sprintf("candidate-%d", c)
		led := 0
		go func() {
			runErrs <- election.Run(ctx, election.Config{Locker: l, Name: name, Value: value,
				AcquireOptions: []dlock.AcquireOption{dlock.WithTTL(s.ttl)}, OnStartedLeading: func(tctx context.Context, ld *election.Leadership) error {
					mu.Lock()
					leading++
					overlap := leading > 1
					tok := uint64(ld.Token())
					stale := s.fences() && tok <= lastToken
					lastToken, lastValue = tok, value
					mu.Unlock()
					switch {
					case overlap:
						t.Errorf("%s leads while another term runs", value)
					case stale:
						t.Errorf("%s's term has token %d, not above the last term's", value, tok)
					}
					if c == 0 && led == 0 {
						// One term lasts until the observer has read a leader, so
						// that a late observer on a loaded machine sees one.
						waitObserved(tctx, &omu, &observed)
					}
					mu.Lock()
					v := counter
					mu.Unlock()
					select { // think time, cut short by a loss
					case <-time.After(5 * time.Millisecond):
					case <-tctx.Done():
					}
					mu.Lock()
					counter = v + 1
					leading--
					mu.Unlock()
					if led++; led == terms {
						return election.ErrStop
					}
					return nil
				}})
		}()
	}
	for range candidates {
		if err := <-runErrs; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	if counter != candidates*terms {
		t.Errorf("counter %d after %d terms: an update was lost", counter, candidates*terms)
	}

	// The observer ends on the last leader, or on no leader once it resigned.
	deadline := time.Now().Add(PushWaitBound + time.Second)
	for {
		in, err := election.Leader(ctx, viewer, name)
		if err != nil {
			t.Fatal(err)
		}
		if !in.Led {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("someone still leads after every candidate stopped: %+v", in)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The observer comes to no leader too (it reads every 5ms; a loaded
	// machine may delay it, hence the second bound).
	for deadline := time.Now().Add(5 * time.Second); ; {
		omu.Lock()
		n, last := len(observed), election.Info{}
		if n > 0 {
			last = observed[n-1]
		}
		omu.Unlock()
		if n > 0 && !last.Led {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the observer's last read is a leader (%+v) 5s after the last one (%s) resigned", last, lastValue)
			break
		}
		time.Sleep(5 * time.Millisecond) // polling the observer's reads
	}
	stopObserving()
	<-observing
	var top uint64
	led := 0
	for _, in := range observed {
		if !in.Led {
			continue
		}
		led++
		if s.fences() && in.Token != 0 {
			if in.Token <= top {
				t.Errorf("observer saw token %d after %d: a stale leader after a newer one (%+v)", in.Token, top, observed)
			}
			top = in.Token
		}
	}
	if led == 0 {
		t.Fatalf("the observer never saw a leader (%d reads sent)", len(observed))
	}
	t.Logf("observer saw %d leaders over %d terms", led, candidates*terms)
}

// testElectionHandover: Leader reports the leader's value and token; a
// candidate waiting in Campaign leads within the push-wait bound of the
// leader's Resign (3s without push waits).
func (s *suite) testElectionHandover(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	a, b, viewer := s.locker(t), s.locker(t), s.locker(t)
	first, err := election.Campaign(ctx, a, name, "first")
	if err != nil {
		t.Fatal(err)
	}
	in, err := election.Leader(ctx, viewer, name)
	if !supports(t, err, "report who leads") {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if !in.Led || in.Value != "first" || (s.fences() && in.Token != 0 && in.Token != uint64(first.Token())) {
		t.Errorf("Leader: %+v, want led by %q with token %d", in, "first", first.Token())
	}
	type result struct {
		ld  *election.Leadership
		err error
		at  time.Time
	}
	next := make(chan result, 1)
	go func() {
		ld, err := election.Campaign(ctx, b, name, "second")
		next <- result{ld, err, time.Now()}
	}()
	if wc, ok := s.h.(WaiterCounter); ok {
		deadline := time.Now().Add(10 * time.Second)
		for wc.Waiters(t, name) < 1 {
			if time.Now().After(deadline) {
				t.Fatal("the backend never saw the second candidate wait")
			}
			time.Sleep(5 * time.Millisecond)
		}
	} else {
		time.Sleep(200 * time.Millisecond)
	}
	resigned := time.Now()
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-next
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.ld.Resign(context.Background())
	bound := 3 * time.Second
	if s.caps.PushWait {
		bound = PushWaitBound
	}
	t.Logf("resign → next leader: %v", r.at.Sub(resigned))
	if d := r.at.Sub(resigned); d > bound {
		t.Errorf("the next candidate led %v after the resign (bound %v)", d, bound)
	}
	if s.fences() && r.ld.Token() <= first.Token() {
		t.Errorf("the second term's token %d is not above the first's %d", r.ld.Token(), first.Token())
	}
	if !errors.Is(first.Err(), dlock.ErrReleased) {
		t.Errorf("the resigned term's Err: %v, want ErrReleased", first.Err())
	}
}

// testElectionLossCancelsRun: when the leader's term is lost behind its back
// — the harness expires the lock (a server-side expiry), or another client
// breaks it (dlock.Break, where the backend can) — the ctx Run gave its
// function is cancelled with a cause matching dlock.ErrLeaseLost, and
// OnStoppedLeading hears it. (Partitions and pauses are the fault matrix's
// leader-partition and leader-pause cells.)
func (s *suite) testElectionLossCancelsRun(t *testing.T) {
	t.Run("expire", func(t *testing.T) {
		s.runUntilLost(t, func(name string) { s.h.Expire(t, name) })
	})
	t.Run("break", func(t *testing.T) {
		admin := s.locker(t)
		if _, err := dlock.Break(s.ctx(t), admin, key(t)+"/probe"); !supports(t, err, "break locks") {
			return
		}
		s.runUntilLost(t, func(name string) {
			if _, err := dlock.Break(s.ctx(t), admin, name); err != nil {
				t.Errorf("Break: %v", err)
			}
		})
	})
}

// runUntilLost runs one term of election.Run in which lose ends the term
// behind the leader's back, and checks Run's ctx and callbacks report it.
func (s *suite) runUntilLost(t *testing.T, lose func(name string)) {
	ctx := s.ctx(t)
	name := key(t)
	l := s.locker(t)
	started := make(chan struct{})
	var stopped error
	cause := make(chan error, 1)
	err := election.Run(ctx, election.Config{
		Locker:         l,
		Name:           name,
		Value:          "leader",
		AcquireOptions: []dlock.AcquireOption{dlock.WithTTL(s.ttl)},
		OnStartedLeading: func(tctx context.Context, ld *election.Leadership) error {
			close(started)
			lose(name)
			select {
			case <-tctx.Done():
				cause <- context.Cause(tctx)
			case <-time.After(5*s.ttl + 5*time.Second):
				cause <- errors.New("the term's ctx was not cancelled")
			}
			return election.ErrStop
		},
		OnStoppedLeading: func(_ *election.Leadership, err error) { stopped = err },
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	<-started
	if c := <-cause; !errors.Is(c, dlock.ErrLeaseLost) {
		t.Errorf("the term's ctx ended with %v, want a cause matching ErrLeaseLost", c)
	}
	if !errors.Is(stopped, dlock.ErrLeaseLost) {
		t.Errorf("OnStoppedLeading heard %v, want ErrLeaseLost", stopped)
	}
}

// testElectionObservePush: where the backend pushes changes (dlock.Watch),
// Observe sees each new leader, and the end of each term, within the
// push-wait bound, although its polling interval is an hour.
func (s *suite) testElectionObservePush(t *testing.T) {
	ctx := s.ctx(t)
	name := key(t)
	viewer := s.locker(t)
	probe, cancelProbe := context.WithCancel(ctx)
	err := dlock.Watch(probe, viewer, name, func() {})
	cancelProbe()
	if !supports(t, err, "push changes of a lock") {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	octx, stop := context.WithCancel(ctx)
	defer stop()
	seen, err := election.Observe(octx, viewer, name, election.WithInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if in := <-seen; in.Led {
		t.Fatalf("first read: %+v, want nobody leading", in)
	}
	// expect waits for an observation that want accepts; one that interim
	// accepts (a state on the way, pushed too) may come first.
	expect := func(what string, want, interim func(election.Info) bool) {
		t.Helper()
		start := time.Now()
		bound := time.After(PushWaitBound + time.Second)
		for {
			select {
			case in := <-seen:
				switch {
				case want(in):
					t.Logf("%s: observed after %v", what, time.Since(start))
					return
				case interim != nil && interim(in):
					t.Logf("%s: on the way, observed %+v", what, in)
				default:
					t.Fatalf("%s: observed %+v", what, in)
				}
			case <-bound:
				t.Fatalf("%s: not observed within %v with an hour's polling interval", what, PushWaitBound+time.Second)
			}
		}
	}
	a, b := s.locker(t), s.locker(t)
	first, err := election.Campaign(ctx, a, name, "first")
	if err != nil {
		t.Fatal(err)
	}
	expect("first leader", func(in election.Info) bool { return in.Led && in.Value == "first" }, nil)
	// The leader's new value (Proclaim) is pushed as well, with the same term.
	switch err := first.Proclaim(ctx, "first, proclaimed"); {
	case errors.Is(err, errors.ErrUnsupported):
		t.Logf("Proclaim: %v", err)
	case err != nil:
		t.Fatalf("Proclaim: %v", err)
	default:
		// On a backend that relabels node by node (Redlock), the first
		// node's push may be read before most nodes have the new value:
		// the old one, still led, is on the way.
		expect("proclaimed value", func(in election.Info) bool {
			return in.Led && in.Value == "first, proclaimed" && (in.Token == 0 || in.Token == uint64(first.Token()))
		}, func(in election.Info) bool { return in.Led && in.Value == "first" })
	}
	next := make(chan *election.Leadership, 1)
	go func() {
		ld, err := election.Campaign(ctx, b, name, "second")
		if err != nil {
			t.Error(err)
		}
		next <- ld
	}()
	if wc, ok := s.h.(WaiterCounter); ok {
		deadline := time.Now().Add(10 * time.Second)
		for wc.Waiters(t, name) < 1 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	} else {
		time.Sleep(200 * time.Millisecond)
	}
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	// The hand-over may be seen as one change or as nobody, then second.
	start := time.Now()
	for {
		select {
		case in := <-seen:
			if in.Led && in.Value == "second" {
				t.Logf("hand-over observed after %v", time.Since(start))
				second := <-next
				if second == nil {
					return
				}
				if err := second.Resign(ctx); err != nil {
					t.Fatal(err)
				}
				expect("no leader", func(in election.Info) bool { return !in.Led }, nil)
				return
			}
		case <-time.After(PushWaitBound + time.Second):
			t.Fatalf("the hand-over to the second leader was not observed within %v", PushWaitBound+time.Second)
		}
	}
}

// waitObserved returns once *observed holds a read of a leader, or after 5s,
// or when ctx ends.
func waitObserved(ctx context.Context, mu *sync.Mutex, observed *[]election.Info) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; {
		mu.Lock()
		seen := slices.ContainsFunc(*observed, func(in election.Info) bool { return in.Led })
		mu.Unlock()
		if seen {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling the observer's reads
	}
}
