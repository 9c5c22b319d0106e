package conformance

import (
	"flag"
	"fmt"
	"maps"
	"math"
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
)

var soakFlag = flag.Duration("soak", 0, "conformance: how long Soak runs per deployment (default SoakOptions.Duration, or $DLOCK_SOAK, or 45s)")

// DefaultSoakDuration is how long Soak runs when neither -soak, $DLOCK_SOAK
// nor SoakOptions.Duration says otherwise: short enough for CI.
const DefaultSoakDuration = 45 * time.Second

// SoakOptions configures Soak. Zero fields take their defaults.
type SoakOptions struct {
	Processes  int           // child processes; default 3
	Goroutines int           // lock handles per process, each its own dlock.Open; default 4
	Keys       int           // keys contended; default 4
	Duration   time.Duration // default DefaultSoakDuration (45s); the test flag -soak=D or $DLOCK_SOAK (a Go duration) overrides it
	FaultEvery time.Duration // time between the starts of two faults; default 10s
	Interval   time.Duration // least time between two acquisitions by one lock handle (the rate cap); default 200ms

	// Faults the soak picks from at random. Default: Partition and
	// Disconnect (when LinkedDSN has a Link), PauseHolder, and the harness's
	// ServerFaults. Leave out faults whose matrix cell is Unsafe.
	Faults []Fault

	// Matrix is the deployment's row of the fault matrix: a lease overlap
	// during a fault whose cell allows safe-with-fencing is expected and
	// counted apart, any other fails the soak. Without it, only RestartEmpty
	// and ClockJump may overlap.
	Matrix Matrix
}

// overlapExpected reports whether a lease overlap during fault f is
// expected: the matrix's cell for f allows safe-with-fencing (or documents
// it unsafe).
func (o SoakOptions) overlapExpected(f Fault) bool {
	if o.Matrix == nil {
		return f == RestartEmpty || f == ClockJump
	}
	e, ok := o.Matrix[f]
	return ok && e.Outcome&(Fenced|Unsafe) != 0
}

func (o SoakOptions) withDefaults() SoakOptions {
	if o.Processes <= 0 {
		o.Processes = 3
	}
	if o.Goroutines <= 0 {
		o.Goroutines = 4
	}
	if o.Keys <= 0 {
		o.Keys = 4
	}
	if o.Duration <= 0 {
		o.Duration = DefaultSoakDuration
	}
	if *soakFlag > 0 {
		o.Duration = *soakFlag
	} else if d, err := time.ParseDuration(os.Getenv("DLOCK_SOAK")); err == nil && d > 0 {
		o.Duration = d
	}
	if o.FaultEvery <= 0 {
		o.FaultEvery = 10 * time.Second
	}
	if o.Interval <= 0 {
		o.Interval = 200 * time.Millisecond
	}
	return o
}

// soakLease is what the parent knows of one lease granted in a soak. Times
// are wall-clock ns, taken in the child; 0 = not (yet) known.
type soakLease struct {
	label    string
	key      string
	lock     string // the lock key, where it is not key (a permit's slot, a write hold's write lock)
	token    dlock.Token
	grant    int64 // when the holder's Acquire returned
	sent     int64 // when its winning request was sent (Lease.Granted); 0: unknown
	deadline int64 // the lease's Deadline: as granted, then the last one in effect, reported with its end
	done     int64 // when the holder saw Done closed
	released int64 // when the holder called Release
	ended    bool  // the child reported the lease's end
	lost     bool  // the lease ended lost (Err matches ErrLeaseLost)
	err      string
}

// lockKey is the backend lock the lease held: lock, or key where that is
// the lock itself.
func (l *soakLease) lockKey() string {
	if l.lock != "" {
		return l.lock
	}
	return l.key
}

// until returns when the lease stopped counting as its holder's, with RunFaults'
// rule: the earliest of when its Done closed, when its holder called Release,
// and — if it was lost — its Deadline (a paused process cannot close Done,
// and Done fires late on a loaded machine, but no holder is entitled to write
// after its Deadline). how names the bound that decided it. A lease whose end
// was never reported (its child died) counts as never ending.
func (l *soakLease) until() (at int64, how string) {
	if !l.ended {
		return math.MaxInt64, "never reported its end"
	}
	at, how = l.done, "Done"
	if l.released != 0 && (at == 0 || l.released < at) {
		at, how = l.released, "Release called"
	}
	if l.lost && l.deadline != 0 && (at == 0 || l.deadline < at) {
		at, how = l.deadline, "Deadline"
	}
	return at, how
}

// soakFault is one fault injected by a soak, from its start to its heal
// (wall ns).
type soakFault struct {
	f             Fault
	child         int    // the child process a link fault or PauseHolder hit
	key           string // the key a ClockJump hit
	start, healed int64
}

// explains reports whether f can have caused an overlap in which b was
// granted while a still counted as its holder's: f was in effect between a's
// request and b's grant (allowing tail after the heal, see findOverlaps), and it hit
// what a's lease depended on. A fault of one child's link or process (a
// partition, a disconnect, a pause) explains only overlaps whose earlier
// lease that child held; a clock jump only those on the key it hit; a fault
// of the servers themselves (restart, stall, leader loss) any, including
// one whose earlier lease was granted up to tail after the heal: a server's
// fault can outlast it (an etcd leader resumed from a stall revokes the
// leases it saw expire, etcd issue 15247, and with them keys granted just
// after the heal). a's tenure on the server begins when its winning request
// was sent, where that is known, not when its Acquire returned: a clock
// jump whose deletions land between the two takes the lock from a holder
// that is then told it holds it (on Redlock, the later holder's winning
// request can be sent before the earlier holder's Acquire returns).
func (f *soakFault) explains(a, b *soakLease, tail time.Duration) bool {
	until := f.healed // the fault's effect on a's lease lasts until then
	switch {
	case isLinkFault(f.f) || f.f == PauseHolder:
		if childOf(a.label) != f.child {
			return false
		}
	case f.f == ClockJump:
		// The injector hits the backend's lock: a primitive's lease names
		// it apart from the soak's key (a semaphore's permit, k/permits/0).
		if a.key != f.key && a.lock != f.key {
			return false
		}
	default: // a server's fault can outlast its heal
		until += int64(tail)
	}
	began := a.grant
	if a.sent != 0 && a.sent < began {
		began = a.sent
	}
	return until > began && f.start <= b.grant && b.grant <= f.healed+int64(tail)
}

// childOf returns the index of the child process a soak lease's label names
// ("p<i>.g<g>#<seq>"), or -1.
func childOf(label string) int {
	rest, ok := strings.CutPrefix(label, "p")
	if !ok {
		return -1
	}
	n, _, _ := strings.Cut(rest, ".")
	i, err := strconv.Atoi(n)
	if err != nil {
		return -1
	}
	return i
}

// startAfter returns when b's tenure counts as begun, for the overlap check
// against a, an earlier lease of the same key. After a lease that was lost
// and counted as its holder's until its Deadline (its Done closed later, a
// paused holder), it is when b's winning request was sent (Lease.Granted):
// a's Deadline claims the server could not grant the lock before it, and a
// deadline overstated by less than b's round trip must still be caught —
// unless a fault was in effect at some time between the request's sending
// and b's Acquire returning, which may have held it up (a stalled server, a
// paused child) until long after it was sent: a request sent just before a
// server stall is answered only after it. After a lease its holder released,
// or that was lost with its Done closing before its Deadline, it is when b's
// Acquire returned: the release, or the loss the holder saw (a driver gives
// back what is left of a lost lock, Redlock's keys on the nodes that still
// had them), is what let b in, and b's request may have been on its way (a
// retry) meanwhile. So it is, too, after a lease lost at its Deadline whose
// holder then called Release before b's Acquire returned: the release gives
// back what is left of the lock (a key the server had not yet expired), and
// b's request, sent before, may have waited for it (on a loaded host, a
// lease lost at its Deadline can be released hundreds of milliseconds later,
// and a waiter's request sent before the loss granted just after the
// release).
func (b *soakLease) startAfter(a *soakLease, faults []soakFault) int64 {
	if _, how := a.until(); !a.lost || how != "Deadline" || b.sent == 0 {
		return b.grant
	}
	if a.released != 0 && a.released < b.grant {
		return b.grant
	}
	for _, f := range faults {
		if f.start <= b.grant && b.sent <= f.healed {
			return b.grant
		}
	}
	return b.sent
}

// soakOverlap is a pair of leases of one key where b was granted before a
// stopped counting as its holder's (see soakLease.until).
type soakOverlap struct {
	a, b     *soakLease
	fault    *soakFault // the fault the overlap is attributed to; nil: none
	expected bool       // fault's matrix cell allows safe-with-fencing
}

func (o soakOverlap) String() string {
	until, how := o.a.until()
	var b strings.Builder
	fmt.Fprintf(&b, "%q: %s (token %d, granted %s, Deadline %s, Done %s, Release called %s, %s) ended %s (%s), %v after %s (token %d) was granted at %s",
		o.a.key, o.a.label, o.a.token, wallString(o.a.grant), wallString(o.a.deadline), wallString(o.a.done), wallString(o.a.released), o.a.err,
		wallString(until), how, time.Duration(until-o.b.grant), o.b.label, o.b.token, wallString(o.b.grant))
	// The later lease's own story, and both locks: a later lease with the
	// lower token was granted first by the server and learned of it late.
	fmt.Fprintf(&b, " (its request sent %s, Deadline %s, Done %s, Release called %s, %s; locks %q and %q)",
		wallString(o.b.sent), wallString(o.b.deadline), wallString(o.b.done), wallString(o.b.released), o.b.err, o.a.lockKey(), o.b.lockKey())
	if o.fault == nil {
		b.WriteString("; during no fault")
	} else {
		fmt.Fprintf(&b, "; during %s (child p%d, %s to %s)", o.fault.f, o.fault.child, wallString(o.fault.start), wallString(o.fault.healed))
	}
	return b.String()
}

// Soak runs o.Processes child processes (the package's TestMain must call
// Main) of o.Goroutines lock handles each, looping over o.Keys keys as locks,
// semaphores of 1 and write locks with fenced increments, under a random
// fault of o.Faults every o.FaultEvery. It fails on a stale write, a history
// that is not linearizable, no progress, a failed child, or a lease overlap
// that no fault explains, and appends a Record to $DLOCK_SAFETY_OUT when set.
// CONTRIBUTING.md says how a soak is judged.
func Soak(t *testing.T, h FaultHarness, o SoakOptions) {
	t.Helper()
	if !mainCalled {
		t.Skip("the package's TestMain does not call conformance.Main, so Soak cannot start child processes")
	}
	o = o.withDefaults()
	ttl := DefaultShortTTL
	if st, ok := h.(ShortTTLer); ok {
		ttl = st.ShortTTL()
	}
	var failover time.Duration
	if ft, ok := h.(FailoverTimer); ok {
		failover = ft.FailoverTime()
	}
	bound := ttl + failover + livenessSlack

	reg := newRegister()
	prefix := key(t)
	keys := make([]string, o.Keys)
	for i := range keys {
		keys[i] = prefix + "/k" + strconv.Itoa(i)
	}

	var (
		mu      sync.Mutex
		leases  = map[string]*soakLease{}
		grantCh = make(chan struct{}, 1)
	)
	children := make([]*child, o.Processes)
	links := make([]Link, o.Processes)
	var watchers sync.WaitGroup
	for i := range children {
		dsn, link := h.LinkedDSN(t)
		links[i] = link
		ch := startChild(t, "soak", childSpec{Name: "p" + strconv.Itoa(i), DSN: dsn, Keys: keys, TTL: ttl,
			Goroutines: o.Goroutines, Interval: o.Interval, Think: ttl / 50}, reg)
		children[i] = ch
		watchers.Add(1)
		go func() { // owned by Soak: ends when the child's stdout closes
			defer watchers.Done()
			for m := range ch.events {
				mu.Lock()
				switch m.T {
				case "grant":
					leases[m.Lease] = &soakLease{label: m.Lease, key: m.Key, lock: m.Lock, token: m.Token, grant: m.At, sent: m.Granted, deadline: m.Deadline}
					select {
					case grantCh <- struct{}{}:
					default:
					}
				case "end":
					if l := leases[m.Lease]; l != nil {
						l.ended, l.lost, l.err = true, m.Lost, m.Err
						l.done, l.released = m.At, m.Released
						if m.Deadline != 0 {
							l.deadline = m.Deadline
						}
					}
				}
				mu.Unlock()
			}
		}()
	}

	faults := o.Faults
	if faults == nil {
		if links[0] != nil {
			faults = append(faults, Partition, Disconnect)
		}
		faults = append(faults, PauseHolder)
		faults = append(faults, serverFaults(h.ServerFaults())...)
	}
	for _, f := range faults {
		if isLinkFault(f) && links[0] == nil {
			t.Fatalf("Soak: fault %s needs a Link, and LinkedDSN returned none", f)
		}
	}
	t.Logf("soak on %s: %d processes × %d lockers, %d keys, TTL %v, %v, a fault every %v from %v",
		h.Deployment(), o.Processes, o.Goroutines, o.Keys, ttl, o.Duration, o.FaultEvery, faults)

	start := time.Now()
	end := start.Add(o.Duration)
	var (
		injected                 []string
		windows                  []soakFault
		accepted, stale, overlap int
	)
	defer func() { // also when the soak fails with t.Fatal
		fs := slices.Clone(injected)
		sort.Strings(fs)
		WriteRecord(t, Record{Kind: "soak", Deployment: h.Deployment(), Fault: strings.Join(slices.Compact(fs), ","),
			Trials: len(injected), LatencyP50Ms: -1, LatencyMaxMs: -1, Stale: stale, Overlaps: overlap,
			Ops: accepted, Duration: o.Duration.String(), Failed: t.Failed(),
			Observed: fmt.Sprintf("%d processes × %d lockers, %d keys", o.Processes, o.Goroutines, o.Keys)})
	}()
	for next := start.Add(o.FaultEvery); next.Add(2 * ttl).Before(end); next = next.Add(o.FaultEvery) {
		sleepUntil(next)
		if time.Now().Add(2 * ttl).After(end) {
			break // the faults ran long (a slow heal or failover): no time left for another
		}
		f := faults[rand.IntN(len(faults))]
		i := rand.IntN(len(children))
		k := "" // the key a server fault was aimed at
		faultAt := time.Now()
		switch {
		case isLinkFault(f):
			if f == Partition {
				links[i].Blackhole(t)
			} else {
				links[i].Cut(t)
			}
			sleepUntil(faultAt.Add(2 * ttl))
			links[i].Heal(t)
		case f == PauseHolder:
			children[i].pause(t)
			sleepUntil(faultAt.Add(2 * ttl))
			children[i].resume(t)
		default:
			k = heldKey(&mu, leases, keys)
			heal := h.ServerFaults()[f](t, k)
			if lasting(f) {
				sleepUntil(faultAt.Add(2 * ttl))
			}
			heal()
		}
		injected = append(injected, string(f))
		windows = append(windows, soakFault{f: f, child: i, key: k, start: faultAt.UnixNano(), healed: time.Now().UnixNano()})
		on := fmt.Sprintf("child p%d", i)
		if k != "" {
			on = fmt.Sprintf("key %q", k)
		}
		t.Logf("%s (%s): %s (%s) injected, healed after %v", faultAt.Sub(start).Round(time.Millisecond), wallString(faultAt.UnixNano()), f, on, time.Since(faultAt).Round(time.Millisecond))
		// Liveness: a fresh grant within the bound after heal.
		select {
		case <-grantCh:
		default:
		}
		select {
		case <-grantCh:
		case <-time.After(bound):
			t.Errorf("liveness: no lock granted within %v after healing %s", bound, f)
		}
	}
	sleepUntil(end)

	var childErrs []string
	for _, ch := range children {
		if err := ch.stop(t, 30*time.Second); err != nil {
			childErrs = append(childErrs, err.Error())
		}
	}
	watchers.Wait()

	var rejected int
	var staleEv []string
	accepted, rejected, stale, staleEv = reg.counts()
	overlaps := findOverlaps(leases, windows, 2*ttl, o.overlapExpected)
	overlap = len(overlaps)
	var expected, unexpected []string
	for _, ov := range overlaps {
		if ov.expected {
			expected = append(expected, ov.String())
		} else {
			unexpected = append(unexpected, ov.String())
		}
	}
	linErr := reg.checkLinearizable(t)
	regressions := tokenRegressions(leases)
	t.Logf("soak on %s: %d leases, %d requests accepted, %d rejected as stale, %d stale accepted, %d lease overlaps (%d during faults expected to overlap), faults %v",
		h.Deployment(), len(leases), accepted, rejected, stale, len(overlaps), len(expected), injected)
	// Whose requests were rejected: a stale write is the guard doing its
	// work after a loss, but which lease made it tells an overlap's story.
	for _, e := range reg.rejectedEvidence() {
		t.Logf("rejected as stale: %s", e)
	}
	for i, e := range expected {
		if i == 10 {
			t.Logf("… and %d more overlaps during faults expected to overlap", len(expected)-i)
			break
		}
		t.Logf("overlap during a fault expected to overlap: %s", e)
	}
	for i, e := range unexpected {
		if i == 10 {
			t.Errorf("… and %d more lease overlaps outside faults expected to overlap", len(unexpected)-i)
			break
		}
		t.Errorf("lease overlap outside faults expected to overlap: %s", e)
	}
	for i, e := range regressions {
		if i == 10 {
			t.Errorf("… and %d more grants with a token not above an earlier grant's", len(regressions)-i)
			break
		}
		t.Errorf("token order: %s", e)
	}
	for _, e := range childErrs {
		t.Error(e)
	}
	if stale > 0 {
		t.Errorf("%d stale writes accepted: %s", stale, strings.Join(staleEv, "; "))
	}
	if linErr != nil {
		t.Error(linErr)
	}
	if accepted < 2*o.Keys {
		t.Errorf("no progress: only %d register requests accepted in %v", accepted, o.Duration)
	}
}

// heldKey returns a key some lease holds, as far as the test knows (it may
// have been released since), else a random one: an Injector is meant for a held
// key.
func heldKey(mu *sync.Mutex, leases map[string]*soakLease, keys []string) string {
	mu.Lock()
	defer mu.Unlock()
	var held []string
	for _, l := range leases {
		switch {
		case l.ended:
		case l.lock != "":
			held = append(held, l.lock) // a server fault hits the lock itself
		default:
			held = append(held, l.key)
		}
	}
	if len(held) == 0 {
		return keys[rand.IntN(len(keys))]
	}
	return held[rand.IntN(len(held))]
}

// tokenRegressions returns the pairs of leases of one lock where the later
// one's winning request was sent after the earlier one's Acquire returned,
// and yet its token is not above the earlier one's. The server granted the
// earlier lease before its Acquire returned and the later one after its
// request was sent, so tokens that increase with every grant order such a
// pair whatever the faults did: no timing excuses a regression. A lease
// whose request time is unknown is compared only as the earlier one.
func tokenRegressions(leases map[string]*soakLease) []string {
	byLock := map[string][]*soakLease{}
	for _, l := range leases {
		byLock[l.lockKey()] = append(byLock[l.lockKey()], l)
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(byLock)) {
		ls := byLock[k]
		sort.Slice(ls, func(i, j int) bool { return ls[i].grant < ls[j].grant })
		for i, a := range ls {
			for _, b := range ls[i+1:] {
				if b.sent != 0 && b.sent >= a.grant && b.token <= a.token {
					out = append(out, fmt.Sprintf("%q: %s (token %d) was asked for at %s, after %s (token %d) was granted at %s",
						k, b.label, b.token, wallString(b.sent), a.label, a.token, wallString(a.grant)))
				}
			}
		}
	}
	return out
}

// findOverlaps returns the pairs of leases of one key where the later was
// granted (its Acquire returned) before the earlier stopped counting as its
// holder's (see soakLease.until), in grant order. An overlap is attributed to
// a fault that could have caused it (see soakFault.explains): one healed
// after the earlier lease's grant, that started no later than the later
// lease's grant, that was healed no more than tail before it (a lock lost
// with a server's state is granted again after the heal, until the old
// holder's next renewal fails), and that hit the earlier lease's child, its
// key, or the servers. Among those, one that expected says may overlap is
// preferred; an overlap no fault explains has none.
func findOverlaps(leases map[string]*soakLease, faults []soakFault, tail time.Duration, expected func(Fault) bool) []soakOverlap {
	byKey := map[string][]*soakLease{}
	for _, l := range leases {
		byKey[l.key] = append(byKey[l.key], l)
	}
	keys := slices.Sorted(maps.Keys(byKey))
	var out []soakOverlap
	for _, k := range keys {
		ls := byKey[k]
		sort.Slice(ls, func(i, j int) bool { return ls[i].grant < ls[j].grant })
		for i, a := range ls {
			until, _ := a.until()
			for _, b := range ls[i+1:] {
				if b.startAfter(a, faults) >= until {
					if b.grant >= until {
						break // later leases were granted later still
					}
					continue
				}
				ov := soakOverlap{a: a, b: b}
				for j := range faults {
					f := &faults[j]
					if !f.explains(a, b, tail) {
						continue
					}
					if ov.fault == nil || expected(f.f) && !ov.expected { // prefer a fault expected to overlap
						ov.fault, ov.expected = f, expected(f.f)
					}
				}
				out = append(out, ov)
			}
		}
	}
	return out
}
