package conformance

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/election"
	"github.com/dlock-go/dlock/rwlock"
	"github.com/dlock-go/dlock/semaphore"
)

// FailoverTimer is an optional interface on a FaultHarness whose deployment
// needs time to serve again after a heal (a leader election): the liveness
// check waits TTL + FailoverTime + 5s, FailoverTime 0 without it.
type FailoverTimer interface {
	FailoverTime() time.Duration
}

// livenessSlack is added to the liveness bound after heal, for a loaded
// machine.
const livenessSlack = 5 * time.Second

var trialsFlag = flag.Int("faults.trials", 0, "conformance: trials per fault-matrix cell (default 1, or $DLOCK_FAULT_TRIALS)")

// trials is the number of trials per cell: -faults.trials, else
// $DLOCK_FAULT_TRIALS, else 1.
func trials() int {
	if *trialsFlag > 0 {
		return *trialsFlag
	}
	if n, err := strconv.Atoi(os.Getenv("DLOCK_FAULT_TRIALS")); err == nil && n > 0 {
		return n
	}
	return 1
}

// faultOrder is the order in which RunFaults runs the known faults; others
// follow in name order.
var faultOrder = []Fault{Partition, Disconnect, PauseHolder, LeaderPartition, LeaderPause,
	SemaphorePartition, SemaphorePause, SemaphoreCrowdPartition, WriterPartition, WriterPause, ReaderPartition,
	Restart, RestartEmpty, Stall, KillLeader, ClockJump}

// A role is what the holder and the contender of a trial take: a lock, an
// election's leadership, a semaphore's permit (of a semaphore of 1, or of
// crowdPermits) or a read/write lock's write or read side.
type role string

const (
	roleLock    role = ""
	roleLeader  role = "leader"
	rolePermit  role = "permit"
	rolePermits role = "permit-of-3"
	roleWriter  role = "writer"
	roleReader  role = "reader"
)

// primitiveFaults maps each fault that repeats a lock fault with another
// role to that fault and the role.
var primitiveFaults = map[Fault]struct {
	base Fault
	role role
}{
	LeaderPartition:    {Partition, roleLeader},
	LeaderPause:        {PauseHolder, roleLeader},
	SemaphorePartition: {Partition, rolePermit},
	SemaphorePause:     {PauseHolder, rolePermit},
	WriterPartition:    {Partition, roleWriter},
	WriterPause:        {PauseHolder, roleWriter},

	SemaphoreCrowdPartition: {Partition, rolePermits},
	ReaderPartition:         {Partition, roleReader},
}

// roleWhy says why a lock fault's claim holds for a role.
var roleWhy = map[role]string{
	roleLeader: "the leader's term is the election lock's lease, and Run cancels its ctx when it ends",
	rolePermit: "a permit is the lease on its slot's lock, fenced by that lock's token",
	roleWriter: "a write hold is the write lock's lease (fenced by its token) and the read slots' leases",
	rolePermits: "a permit of a semaphore of 3 is the lease on one of its 3 slots' locks, fenced per slot, so with 4 contenders " +
		"no more than 3 hold at once unless the lost holder's slot is granted before its lease ends",
	roleReader: "a read hold is the lease on a read slot, which the writer must take too (on a backend's own shared lock, a shared lease " +
		"the writer waits for), fenced by one guard with the writer, and a reader that asks once the writer is in waits for it",
}

// withPrimitiveCells returns m with the primitive cells it lacks, each with
// the claim of the lock fault it repeats.
func withPrimitiveCells(m Matrix) Matrix {
	out := make(Matrix, len(m)+len(primitiveFaults))
	for f, e := range m {
		out[f] = e
	}
	for pf, p := range primitiveFaults {
		if e, ok := m[p.base]; ok {
			if _, own := m[pf]; !own {
				if e.Why != "" {
					e.Why = "as " + string(p.base) + ", for " + roleWhy[p.role] + ": " + e.Why
				}
				out[pf] = e
			}
		}
	}
	return out
}

// baseFault returns the lock fault f repeats and the role of its holder.
func baseFault(f Fault) (Fault, role) {
	if p, ok := primitiveFaults[f]; ok {
		return p.base, p.role
	}
	return f, roleLock
}

// AllFaults returns the faults the suite knows, in the order RunFaults runs
// them and docs/SAFETY.md lists them.
func AllFaults() []Fault { return slices.Clone(faultOrder) }

func orderedFaults(m Matrix) []Fault {
	var out, rest []Fault
	for _, f := range faultOrder {
		if _, ok := m[f]; ok {
			out = append(out, f)
		}
	}
	for f := range m {
		if !slices.Contains(faultOrder, f) {
			rest = append(rest, f)
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i] < rest[j] })
	return append(out, rest...)
}

// isLinkFault reports whether f breaks the holder's Link.
func isLinkFault(f Fault) bool {
	b, _ := baseFault(f)
	return b == Partition || b == Disconnect
}

// lasting reports whether f lasts 2×TTL before it is healed. The others
// (Restart, RestartEmpty, ClockJump) are healed as soon as they are in effect:
// a restart as fast as the server comes back, which is when a lock lost with
// the server's state can be granted again while its holder still believes in
// it.
func lasting(f Fault) bool {
	switch f {
	case Restart, RestartEmpty, ClockJump:
		return false
	}
	return true
}

// RunFaults runs the fault matrix m against h: one subtest per cell, one
// trial each (-faults.trials=N or $DLOCK_FAULT_TRIALS for more), skipping the
// cells with Expect.Skip and the faults h cannot inject. A trial whose
// outcome is outside Expect.Outcome fails; each cell appends a Record to
// $DLOCK_SAFETY_OUT when set. CONTRIBUTING.md says how a trial is judged.
func RunFaults(t *testing.T, h FaultHarness, m Matrix) {
	t.Helper()
	fs := &faultSuite{h: h, ttl: DefaultShortTTL}
	if st, ok := h.(ShortTTLer); ok {
		fs.ttl = st.ShortTTL()
	}
	if ft, ok := h.(FailoverTimer); ok {
		fs.failover = ft.FailoverTime()
	}
	m = withPrimitiveCells(m)
	for _, f := range orderedFaults(m) {
		exp := m[f]
		t.Run(string(f), func(t *testing.T) { fs.runCell(t, f, exp) })
	}
	t.Run("WaiterRidesOutRestart", fs.waiterRidesOutRestart)
}

// waiterRidesOutRestart holds every driver to the Locker contract's word
// that Acquire waits until granted or its ctx is done: a waiter waiting
// while the servers restart (or, for a cluster, its leader is killed) keeps
// waiting through the outage, whatever errors its requests meet, and is
// granted once the lock is free again.
func (fs *faultSuite) waiterRidesOutRestart(t *testing.T) {
	var f Fault
	for _, c := range []Fault{Restart, RestartEmpty, KillLeader} {
		if fs.h.ServerFaults()[c] != nil {
			f = c
			break
		}
	}
	if f == "" {
		t.Skipf("the %s harness can neither restart its servers nor kill a leader", fs.h.Deployment())
	}
	ctx := context.Background()
	k := key(t)
	a, b := fs.h.NewLocker(t), fs.h.NewLocker(t)
	held, err := a.Acquire(ctx, k, dlock.WithTTL(fs.ttl))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*fs.ttl+30*time.Second+fs.failover)
	defer cancel()
	type result struct {
		lease *dlock.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() { // owned by the test: it reads got before returning
		lease, err := b.Acquire(wctx, k, dlock.WithTTL(fs.ttl))
		got <- result{lease, err}
	}()
	heal := fs.h.ServerFaults()[f](t, k)
	// The outage lasts two TTLs, so that the waiter's attempts (at least
	// every poll interval where it polls) meet it, whatever the driver.
	sleepUntil(time.Now().Add(2 * fs.ttl))
	heal()
	// The holder lets go (its lease may have been lost with the servers'
	// state, then the release says so): the lock is free either way.
	_ = held.Release(ctx)
	r := <-got
	if r.err != nil {
		t.Fatalf("a waiting Acquire across %s returned %v; it must wait until granted or its ctx ends", f, r.err)
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Errorf("release after the restart: %v", err)
	}
}

type faultSuite struct {
	h        FaultHarness
	ttl      time.Duration
	failover time.Duration
	// grantBound bounds the wait for a trial holder's grant; 0 means
	// defaultGrantBound.
	grantBound time.Duration
}

// defaultGrantBound bounds the wait for a trial holder's grant.
const defaultGrantBound = 30 * time.Second

// isPause reports whether f is PauseHolder or repeats it.
func isPause(f Fault) bool {
	b, _ := baseFault(f)
	return b == PauseHolder
}

// missing returns why h cannot take f, or "".
func (fs *faultSuite) missing(f Fault) string {
	switch {
	case isLinkFault(f):
		return ""
	case isPause(f):
		if !mainCalled {
			return "the package's TestMain does not call conformance.Main, so the holder cannot run as a child process"
		}
		return ""
	case fs.h.ServerFaults()[f] == nil:
		return fmt.Sprintf("the %s harness cannot inject %s (not in ServerFaults)", fs.h.Deployment(), f)
	}
	return ""
}

func (fs *faultSuite) runCell(t *testing.T, f Fault, exp Expect) {
	rec := Record{Kind: "fault", Deployment: fs.h.Deployment(), Fault: string(f),
		Expected: exp.Outcome.String(), Why: exp.Why, LatencyP50Ms: -1, LatencyMaxMs: -1}
	var observed Outcome
	var lat []time.Duration
	defer func() { // also when a trial fails with t.Fatal or skips
		rec.Observed = observed.String()
		if observed == 0 {
			rec.Observed = ""
		}
		rec.LatencyP50Ms, rec.LatencyMaxMs = latencyStats(lat)
		rec.Failed = rec.Failed || t.Failed()
		WriteRecord(t, rec)
	}()
	if exp.Skip != "" {
		rec.Skip = exp.Skip
		t.Skip(exp.Skip)
	}
	if reason := fs.missing(f); reason != "" {
		rec.Skip = reason
		t.Skip(reason)
	}
	n := trials()
	for i := range n {
		r := fs.trial(t, f)
		if r.skip != "" {
			rec.Skip = r.skip
			t.Skip(r.skip)
		}
		rec.Trials++
		observed |= r.outcome
		rec.Stale += r.stale
		rec.Overlaps += r.overlaps
		if r.latency >= 0 {
			lat = append(lat, r.latency)
		}
		t.Logf("trial %d/%d: %s (detection latency %s)\n%s", i+1, n, r.outcome, latencyString(r.latency), r.evidence)
		if r.outcome&exp.Outcome == 0 {
			rec.Failed = true
			t.Errorf("%s on %s, trial %d: observed %s, expected %s (%s)\nevidence:\n%s",
				f, fs.h.Deployment(), i+1, r.outcome, exp.Outcome, exp.Why, r.evidence)
		}
		for _, e := range r.failures {
			rec.Failed = true
			t.Errorf("%s on %s, trial %d: %s", f, fs.h.Deployment(), i+1, e)
		}
		if t.Failed() {
			break
		}
	}
}

func latencyString(d time.Duration) string {
	if d < 0 {
		return "none: not lost"
	}
	return d.Round(time.Millisecond).String()
}

// latencyStats returns the median and maximum of ds in milliseconds, or -1
// for none.
func latencyStats(ds []time.Duration) (p50, max float64) {
	if len(ds) == 0 {
		return -1, -1
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return ms(s[(len(s)-1)/2]), ms(s[len(s)-1])
}

// trialResult is what one trial observed.
type trialResult struct {
	skip     string
	outcome  Outcome
	latency  time.Duration // loss time minus fault time; -1 if not lost
	stale    int
	overlaps int
	evidence string
	failures []string // liveness, residue, porcupine and process failures
}

// holderView is what the test knows of the holder's lease, from the holder
// goroutine or from the child's events. Times are wall-clock ns; 0 = never.
type holderView struct {
	granted chan struct{} // closed once the lease is granted
	ended   chan struct{} // closed once the lease has ended
	gone    chan struct{} // closed once the holder (goroutine or child) has finished

	mu       sync.Mutex
	key      string // the register key of its requests
	token    dlock.Token
	grantAt  int64
	deadline int64 // the latest known Deadline
	relAt    int64 // when the holder called Release (it writes no more after)
	endAt    int64
	lost     bool
	endErr   string
}

func newHolderView() *holderView {
	return &holderView{granted: make(chan struct{}), ended: make(chan struct{}), gone: make(chan struct{})}
}

func (v *holderView) grant(key string, tok dlock.Token, at, deadline int64) {
	v.mu.Lock()
	v.key, v.token, v.grantAt, v.deadline = key, tok, at, deadline
	v.mu.Unlock()
	close(v.granted)
}

func (v *holderView) end(at int64, lost bool, err string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.endAt != 0 {
		return
	}
	v.endAt, v.lost, v.endErr = at, lost, err
	close(v.ended)
}

// localHolder runs the holder in-process, through dlock.Open(dsn). It
// releases its hold once the hold ends, or when stop is called; it closes
// its Locker only when stop is called (after the heal), as the child holder
// does. stop waits for it.
func (fs *faultSuite) localHolder(t *testing.T, dsn, k string, reg *register, r role) (*holderView, func() error) {
	v := newHolderView()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { // owned by the trial: stop cancels ctx and waits for done
		defer close(v.gone)
		if r == roleLeader {
			done <- fs.localLeader(ctx, dsn, k, reg, v)
			return
		}
		done <- func() error {
			octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
			defer ocancel()
			l, err := dlock.Open(octx, dsn)
			if err != nil {
				return fmt.Errorf("holder: open %s: %w", dsn, err)
			}
			defer l.Close()
			h, err := takeHold(octx, l, k, r, fs.ttl)
			if err != nil {
				return fmt.Errorf("holder: acquire: %w", err)
			}
			ref := leaseRef{Label: "holder", Token: h.token, Granted: time.Now().UnixNano()}
			v.grant(h.key, ref.Token, ref.Granted, 0)
			watched := make(chan struct{})
			go func() { // owned by the holder: ends with the hold
				defer close(watched)
				<-h.done
				at := time.Now()
				v.mu.Lock()
				v.deadline = at.Add(h.deadline().Sub(at)).UnixNano() // on the wall clock
				v.mu.Unlock()
				v.end(at.UnixNano(), errors.Is(h.err(), dlock.ErrLeaseLost), fmt.Sprint(h.err()))
			}()
			for h.err() == nil && ctx.Err() == nil {
				h.work(reg, ref, fs.ttl/10)
				select {
				case <-ctx.Done():
				case <-time.After(fs.ttl / 20): // pacing between requests
				}
			}
			v.mu.Lock()
			v.relAt = time.Now().UnixNano()
			v.mu.Unlock()
			err = h.release(context.Background())
			<-watched
			<-ctx.Done() // the Locker finishes its clean-up until the trial stops the holder
			if err != nil && !errors.Is(err, dlock.ErrLeaseLost) && !errors.Is(err, dlock.ErrReleased) {
				return fmt.Errorf("holder: release: %w", err)
			}
			return nil
		}()
	}()
	var once sync.Once
	var stopErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			stopErr = <-done
		})
		return stopErr
	}
	t.Cleanup(func() { _ = stop() })
	return v, stop
}

// localLeader is localHolder's holder as the leader of an election named k:
// election.Run, whose term's function increments the register until the
// term's ctx ends (the loss it reports, with context.Cause, is the lease's
// end) or ctx does, and then stops Run (which resigns).
func (fs *faultSuite) localLeader(ctx context.Context, dsn, k string, reg *register, v *holderView) error {
	octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
	defer ocancel()
	l, err := dlock.Open(octx, dsn)
	if err != nil {
		return fmt.Errorf("leader: open %s: %w", dsn, err)
	}
	defer l.Close()
	watched := make(chan struct{})
	terms := 0
	err = election.Run(ctx, election.Config{Locker: l, Name: k, Value: "holder",
		AcquireOptions: []dlock.AcquireOption{dlock.WithTTL(fs.ttl)}, OnStartedLeading: func(tctx context.Context, ld *election.Leadership) error {
			terms++
			lease := ld.Lease()
			ref := leaseRef{Label: "holder", Token: lease.Token(), Granted: time.Now().UnixNano()}
			v.grant(k, ref.Token, ref.Granted, 0)
			go func() { // owned by the leader: ends with the term, which Run ends after this function
				defer close(watched)
				<-tctx.Done()
				at := time.Now()
				v.mu.Lock()
				v.deadline = at.Add(lease.Deadline().Sub(at)).UnixNano() // on the wall clock
				v.mu.Unlock()
				cause := context.Cause(tctx)
				v.end(at.UnixNano(), errors.Is(cause, dlock.ErrLeaseLost), fmt.Sprint(cause))
			}()
			for tctx.Err() == nil {
				localIncrement(reg, k, ref, fs.ttl/10)
				select {
				case <-tctx.Done():
				case <-time.After(fs.ttl / 20): // pacing between increments
				}
			}
			if ctx.Err() != nil { // told to stop: the release is Run's resignation
				v.mu.Lock()
				v.relAt = time.Now().UnixNano()
				v.mu.Unlock()
			} else {
				<-ctx.Done() // the term was lost: wait to be told to stop
			}
			return election.ErrStop
		}})
	if terms > 0 {
		<-watched
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("leader: run: %w", err)
	}
	return nil
}

// localIncrement is increment for an in-process lease: a fenced read, think
// time, a fenced write. It does not look at the lease between the two, as a
// real client would not.
func localIncrement(reg *register, k string, ref leaseRef, think time.Duration) bool {
	v, ok := reg.op(k, ref, false, 0)
	if !ok {
		return false
	}
	time.Sleep(think) // think time: the fault may hit between read and write
	_, ok = reg.op(k, ref, true, v+1)
	return ok
}

// childHolder runs the holder as a child process (for PauseHolder).
func (fs *faultSuite) childHolder(t *testing.T, dsn, k string, reg *register, r role) (*holderView, *child, func() error) {
	ch := startChild(t, "holder", childSpec{Name: "holder", DSN: dsn, Keys: []string{k}, TTL: fs.ttl,
		Think: fs.ttl / 10, Interval: fs.ttl / 20, Role: r}, reg)
	v := newHolderView()
	viewed := make(chan struct{})
	go func() { // owned by the child handle: ends when the child's stdout closes
		defer close(viewed)
		defer close(v.gone)
		granted := false
		for m := range ch.events {
			switch m.T {
			case "grant":
				if !granted {
					granted = true
					v.grant(k, m.Token, m.At, m.Deadline)
				}
			case "deadline":
				v.mu.Lock()
				v.deadline = m.Deadline
				v.mu.Unlock()
			case "releasing":
				v.mu.Lock()
				v.relAt = m.At
				v.mu.Unlock()
			case "end":
				v.end(m.At, m.Lost, m.Err)
			}
		}
	}()
	return v, ch, func() error {
		err := ch.stop(t, 15*time.Second)
		<-viewed
		return err
	}
}

// contender waits for the key from h.NewLocker, then keeps incrementing the
// register until stopped.
type contender struct {
	granted chan struct{}
	mu      sync.Mutex
	token   dlock.Token
	grantAt int64 // when its Acquire returned
	sentAt  int64 // when its winning request was sent (Lease.Granted)
	stop    func() error
}

func (fs *faultSuite) startContender(t *testing.T, k string, reg *register, bound time.Duration, r role) *contender {
	c := &contender{granted: make(chan struct{})}
	l := fs.h.NewLocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	done := make(chan error, 1)
	acquire := func() (*dlock.Lease, func(context.Context) error, error) {
		if r != roleLeader {
			return take(ctx, l, k, r, fs.ttl)
		}
		ld, err := election.Campaign(ctx, l, k, "contender", dlock.WithTTL(fs.ttl))
		if err != nil {
			return nil, nil, err
		}
		return ld.Lease(), ld.Resign, nil
	}
	go func() { // owned by the trial: stop cancels ctx and waits for done
		done <- func() error {
			lease, release, err := acquire()
			if err != nil {
				if ctx.Err() != nil {
					return nil // never granted; the liveness check reports it
				}
				return fmt.Errorf("contender: acquire: %w", err)
			}
			ref := leaseRef{Label: "contender", Token: lease.Token(), Granted: time.Now().UnixNano()}
			c.mu.Lock()
			c.token, c.grantAt, c.sentAt = ref.Token, ref.Granted, lease.GrantedAt().UnixNano()
			c.mu.Unlock()
			close(c.granted)
			for lease.Err() == nil && ctx.Err() == nil {
				localIncrement(reg, k, ref, fs.ttl/10)
				select {
				case <-ctx.Done():
				case <-time.After(fs.ttl / 20):
				}
			}
			// The contender's lease may be lost too: granted by a server that
			// was stalled since the request, it ends at once (its deadline
			// counts from the request).
			if err := release(context.Background()); err != nil && !errors.Is(err, dlock.ErrLeaseLost) {
				return fmt.Errorf("contender: release: %w", err)
			}
			return nil
		}()
	}()
	var once sync.Once
	var stopErr error
	c.stop = func() error {
		once.Do(func() {
			cancel()
			stopErr = <-done
			if err := l.Close(); err != nil && !errors.Is(err, dlock.ErrClosed) && stopErr == nil {
				stopErr = fmt.Errorf("contender: close: %w", err)
			}
		})
		return stopErr
	}
	t.Cleanup(func() { _ = c.stop() })
	return c
}

// take acquires k on l in role r (not roleLeader, rolePermits or
// roleReader): the lease that stands for the hold (a lock's lease; a
// permit's, of a semaphore of 1 named k; a write hold's write lock lease, of
// the read/write lock k) and the release of the whole hold.
func take(ctx context.Context, l dlock.Locker, k string, r role, ttl time.Duration) (*dlock.Lease, func(context.Context) error, error) {
	h, err := takeHold(ctx, l, k, r, ttl)
	if err != nil {
		return nil, nil, err
	}
	return h.lease, h.release, nil
}

// A hold is what a trial's holder or contender holds in its role: the lease
// that stands for it, the token and the register key of its requests, and
// the hold's own Done, Err, Deadline and release (a write hold's span its
// read slots' leases too).
type hold struct {
	lease    *dlock.Lease
	token    dlock.Token
	key      string    // the register key: k, or a permit's slot key in a semaphore of 3
	read     bool      // a read hold: its requests only read
	granted  time.Time // when the request that completed the hold was sent
	keys     []string  // the keys the backend stores for the primitive (for Residue)
	done     <-chan struct{}
	err      func() error
	deadline func() time.Time
	release  func(context.Context) error
}

// leaseHold is the hold of one lease whose requests go to key.
func leaseHold(lease *dlock.Lease, key string) hold {
	return hold{lease: lease, token: lease.Token(), key: key, granted: lease.GrantedAt(), keys: []string{lease.Key()},
		done: lease.Done(), err: lease.Err, deadline: lease.Deadline, release: lease.Release}
}

// rwHold is the hold h of the read/write lock m, whose requests go to key.
func rwHold(m *rwlock.RWMutex, h *rwlock.Hold, key string) hold {
	return hold{lease: h.Lease(), token: h.Token(), key: key, read: !h.Write(), granted: h.GrantedAt(),
		keys: append(m.ReadKeys(), m.WriteKey()), done: h.Done(), err: h.Err, deadline: h.Deadline, release: h.Release}
}

// work makes one request of h to the register: a fenced read for a read
// hold, else an increment (see localIncrement).
func (h hold) work(reg *register, ref leaseRef, think time.Duration) {
	if h.read {
		reg.op(h.key, ref, false, 0)
		return
	}
	localIncrement(reg, h.key, ref, think)
}

// takeHold acquires k on l in role r (not roleLeader): a lock; a permit of a
// semaphore of 1 named k (its requests go to k) or of crowdPermits (they go
// to the permit's slot key); the write or the read side of the read/write
// lock k (they go to k).
func takeHold(ctx context.Context, l dlock.Locker, k string, r role, ttl time.Duration) (hold, error) {
	switch r {
	case rolePermit, rolePermits:
		n := 1
		if r == rolePermits {
			n = crowdPermits
		}
		sem, err := semaphore.New(l, k, n, semaphore.WithLeaseOptions(dlock.WithTTL(ttl)), semaphore.WithPollInterval(ttl/10))
		if err != nil {
			return hold{}, err
		}
		p, err := sem.Acquire(ctx)
		if err != nil {
			return hold{}, err
		}
		h := leaseHold(p.Lease(), k)
		h.release = p.Release
		if r == rolePermits {
			h.key = p.Key()
			h.keys = []string{k + "/permits/queue"}
			for i := range n {
				h.keys = append(h.keys, sem.SlotKey(i))
			}
		}
		return h, nil
	case roleWriter, roleReader:
		m, err := rwlock.New(l, k, dlock.WithTTL(ttl))
		if err != nil {
			return hold{}, err
		}
		lock := m.Lock
		if r == roleReader {
			lock = m.RLock
		}
		h, err := lock(ctx)
		if err != nil {
			return hold{}, err
		}
		return rwHold(m, h, k), nil
	case roleLock:
		lease, err := l.Acquire(ctx, k, dlock.WithTTL(ttl))
		if err != nil {
			return hold{}, err
		}
		return leaseHold(lease, k), nil
	}
	return hold{}, fmt.Errorf("take: role %q has a path of its own", r)
}

// sleepUntil sleeps until the wall time at: the trial's schedule, not a
// synchronisation.
func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// errNotGranted is awaitGrant's error when no grant came within its bound.
var errNotGranted = errors.New("the holder was not granted in time")

// awaitGrant waits for the holder's grant. If the holder finishes first, it
// stops it and reports ended with the holder's error; if no grant comes
// within bound (0: defaultGrantBound), it stops it and returns errNotGranted,
// wrapped with the bound and what the stop said.
func awaitGrant(hv *holderView, stop func() error, bound time.Duration) (ended bool, err error) {
	if bound <= 0 {
		bound = defaultGrantBound
	}
	select {
	case <-hv.granted:
		return false, nil
	case <-hv.gone:
		select {
		case <-hv.granted: // granted, and already ended: the trial's checks say what became of it
			return false, nil
		default:
			return true, stop()
		}
	case <-time.After(bound):
		return false, fmt.Errorf("%w (%v; stop: %v)", errNotGranted, bound, stop())
	}
}

// linkReport is what link says it saw, if it reports (testenv's proxies
// do), for a message about a holder that could not get through it.
func linkReport(link Link) string {
	if r, ok := link.(interface{ Report() string }); ok {
		return "; the link: " + r.Report()
	}
	return ""
}

// startHolder starts the trial's holder of k in f's role (a child process
// for PauseHolder and the cells that repeat it) and waits for its grant. It
// returns the holder's view, its child (or nil), its stop and its Link.
func (fs *faultSuite) startHolder(t *testing.T, f Fault, k string, reg *register, dsn string, link Link) (*holderView, *child, func() error, Link) {
	var (
		hv         *holderView
		ch         *child
		stopHolder func() error
	)
	base, r := baseFault(f)
	// A holder that ends before its grant, or is not granted within the
	// bound (its Open or Acquire failed: a connect timeout on a loaded host,
	// a pooler refusing connections, say), is a harness failure, so the
	// attempt is inconclusive: the holder is started once more, saying why,
	// on a new LinkedDSN, where a harness repairs what it can (the table
	// lock's restarts a PgBouncer that crashed). No fault has been injected
	// yet; the trial is about what happens to a lease once granted.
	for start := 1; ; start++ {
		if base == PauseHolder {
			hv, ch, stopHolder = fs.childHolder(t, dsn, k, reg, r)
		} else {
			hv, stopHolder = fs.localHolder(t, dsn, k, reg, r)
		}
		ended, err := awaitGrant(hv, stopHolder, fs.grantBound)
		if !ended && err == nil {
			return hv, ch, stopHolder, link
		}
		why := fmt.Sprintf("the holder finished before it was granted %q: %v", k, err)
		if !ended {
			why = fmt.Sprintf("%q: %v", k, err)
		}
		why += linkReport(link)
		if start > 1 {
			t.Fatalf("%s: attempt 2 of 2 (attempt 1 is logged) inconclusive too: %s", f, why)
		}
		t.Logf("%s: attempt 1 inconclusive: %s; starting the holder again on a new link", f, why)
		dsn, link = fs.h.LinkedDSN(t)
	}
}

// awaitSuccessor is a trial's liveness check: someone holds the holder's
// place (granted is closed once a contender takes it) within the bound after
// healedAt. A holder whose lease is still on 2×TTL + FailoverTime after heal
// kept it through the fault (a lost key would have been granted by then): it
// is stopped, and a contender must then get in. It returns the failures.
func (fs *faultSuite) awaitSuccessor(granted <-chan struct{}, hv *holderView, stopHolder func() error, k string, healedAt time.Time) []string {
	var failures []string
	bound := fs.ttl + fs.failover + livenessSlack
	heldAt := healedAt.Add(2*fs.ttl + fs.failover)
	select {
	case <-granted:
	case <-time.After(time.Until(heldAt)):
		select {
		case <-granted:
		case <-hv.ended:
			select {
			case <-granted:
			case <-time.After(time.Until(healedAt.Add(bound))):
				failures = append(failures, fmt.Sprintf("liveness: nobody holds %q %v after heal (holder's lease ended: %s)", k, bound, hv.endErr))
			}
		default:
			if err := stopHolder(); err != nil {
				failures = append(failures, err.Error())
			}
			select {
			case <-granted:
			case <-time.After(bound):
				failures = append(failures, fmt.Sprintf("liveness: the contender did not get %q within %v of the holder's release", k, bound))
			}
		}
	}
	return failures
}

func (fs *faultSuite) trial(t *testing.T, f Fault) trialResult {
	if isCrowd(f) {
		return fs.crowdTrial(t, f)
	}
	ttl := fs.ttl
	k := key(t)
	reg := newRegister()
	dsn, link := fs.h.LinkedDSN(t)
	if isLinkFault(f) && link == nil {
		return trialResult{skip: fmt.Sprintf("the %s harness has no Link (LinkedDSN returned nil), so it cannot take %s", fs.h.Deployment(), f)}
	}
	base, r := baseFault(f)
	hv, ch, stopHolder, link := fs.startHolder(t, f, k, reg, dsn, link)
	hv.mu.Lock()
	grantAt := time.Unix(0, hv.grantAt)
	hv.mu.Unlock()

	bound := ttl + fs.failover + livenessSlack
	faultLen := 2 * ttl
	c := fs.startContender(t, k, reg, 10*bound+4*faultLen+time.Minute, r)

	// Inject at a random phase of the refresh tick (every TTL/3 after the grant).
	sleepUntil(grantAt.Add(ttl/3 + rand.N(ttl/3)))
	faultAt := time.Now()
	switch {
	case isLinkFault(f):
		if base == Partition {
			link.Blackhole(t)
		} else {
			link.Cut(t)
		}
		sleepUntil(faultAt.Add(faultLen))
		link.Heal(t)
	case base == PauseHolder:
		ch.pause(t)
		sleepUntil(faultAt.Add(faultLen))
		ch.resume(t)
	default:
		heal := fs.h.ServerFaults()[f](t, k)
		if lasting(f) {
			sleepUntil(faultAt.Add(faultLen))
		}
		heal()
	}
	healedAt := time.Now()

	var res trialResult
	res.failures = fs.awaitSuccessor(c.granted, hv, stopHolder, k, healedAt)
	// Let the holder notice its loss, then stop both.
	select {
	case <-hv.ended:
	case <-time.After(2*ttl + livenessSlack):
	}
	if err := stopHolder(); err != nil {
		res.failures = append(res.failures, err.Error())
	}
	if err := c.stop(); err != nil {
		res.failures = append(res.failures, err.Error())
	}
	if in, ok := fs.h.(Inspector); ok {
		if left := in.Residue(t, k); len(left) > 0 {
			res.failures = append(res.failures, fmt.Sprintf("residue after Close: %q", left))
		}
	}

	// Classify.
	hv.mu.Lock()
	tokH, endAt, lost, endErr, deadline, relAt := hv.token, hv.endAt, hv.lost, hv.endErr, hv.deadline, hv.relAt
	hv.mu.Unlock()
	c.mu.Lock()
	tokC, g, sent := c.token, c.grantAt, c.sentAt
	c.mu.Unlock()
	until := tenureEnd(endAt, lost, deadline, relAt)
	accepted, rejected, stale, staleEv := reg.counts()
	res.stale = stale
	res.latency = -1
	if lost {
		res.latency = time.Duration(until - faultAt.UnixNano())
	}
	// After a lost lease the contender's tenure counts from when its winning
	// request was sent (Lease.Granted), up to a round trip before its Acquire
	// returned: the holder's Deadline claims the servers could not grant the
	// lock before it, and one overstated by less than that round trip must
	// read as an overlap, not as a detected loss. Not for a request sent
	// while the fault was in effect, though: a stalled server or a broken
	// link holds it for as long as the fault lasts, and it was granted when
	// it got through, not when it was sent. After a release, the tenure
	// counts from when Acquire returned: the release let the contender in.
	if lost && g != 0 && sent != 0 && (sent < faultAt.UnixNano() || sent > healedAt.UnixNano()) {
		g = sent
	}
	linErr := reg.checkLinearizable(t)
	regressed := tokenRegressed(tokH, tokC)
	res.outcome = classify(lost, until, g, stale > 0 || linErr != nil || regressed)
	if g != 0 && (until == 0 || g < until) {
		res.overlaps = 1
	}
	var ev strings.Builder
	fmt.Fprintf(&ev, "  fault %s injected %s, healed %s\n", f, wallString(faultAt.UnixNano()), wallString(healedAt.UnixNano()))
	fmt.Fprintf(&ev, "  holder: token %d granted %s; Done closed %s (%s)", tokH, wallString(grantAt.UnixNano()), wallString(endAt), endErr)
	if deadline != 0 {
		fmt.Fprintf(&ev, "; Deadline %s", wallString(deadline))
	}
	if relAt != 0 {
		fmt.Fprintf(&ev, "; Release called %s", wallString(relAt))
	}
	fmt.Fprintf(&ev, "\n  contender: token %d granted %s", tokC, wallString(g))
	if regressed {
		fmt.Fprintf(&ev, " (not above the holder's token %d)", tokH)
	}
	ev.WriteString("\n")
	fmt.Fprintf(&ev, "  register: %d requests accepted, %d rejected as stale, %d stale accepted", accepted, rejected, stale)
	for _, e := range staleEv {
		fmt.Fprintf(&ev, "\n    stale: %s", e)
	}
	if linErr != nil {
		fmt.Fprintf(&ev, "\n  porcupine: %v", linErr)
	}
	res.evidence = ev.String()
	return res
}

// tenureEnd returns until when a lease counts as its holder's (wall ns; 0:
// never ended): the earliest of when its Done closed, its Deadline if it was
// lost, and its holder's call to Release.
func tenureEnd(doneAt int64, lost bool, deadline, relAt int64) int64 {
	until := doneAt
	if lost && deadline != 0 && (until == 0 || deadline < until) {
		until = deadline
	}
	if relAt != 0 && (until == 0 || relAt < until) {
		until = relAt
	}
	return until
}

// tokenRegressed reports whether the contender was granted a token not above
// the holder's (0: no grant): that breaks fencing whatever the timing, for
// the old holder's writes would pass a Guard that has seen the new one's.
func tokenRegressed(holder, contender dlock.Token) bool {
	return holder != 0 && contender != 0 && contender <= holder
}

// classify names a trial's outcome from the holder's lease (lost or not,
// and until when it counted: 0 if it never ended), the contender's grant time
// (0: never) and whether the register saw a stale write accepted or a lost
// update. Times are wall-clock ns.
func classify(lost bool, until, grantAt int64, unsafe bool) Outcome {
	switch {
	case unsafe:
		return Unsafe
	case grantAt != 0 && (until == 0 || grantAt < until):
		return Fenced
	case lost:
		return LossDetected
	}
	return Held
}
