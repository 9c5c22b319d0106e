package conformance

import (
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

// soakLease is what the parent knows of one lease granted in a soak.
type soakLease struct {
	key        string
	grant, end int64 // wall ns; end = 0 while held
}

// Soak runs o.Processes child processes (the test binary re-executed; the
// package's TestMain must call Main) with o.Goroutines lock handles each, each
// reaching the deployment through its process's LinkedDSN. Every handle loops:
// acquire a random one of o.Keys keys (short TTL, auto-renew), make one to
// three fenced increments of that key's counter in the test process's fenced
// register, release, at most once per o.Interval. Every o.FaultEvery the test
// injects a random fault of o.Faults — a link fault on one child's Link, a
// pause of one child, or a server fault through Inject on a key held at the
// time (as far as the test knows; it may be released meanwhile) —
// lasting 2×TTL for Partition, Disconnect, PauseHolder, Stall and KillLeader,
// healed at once otherwise, and checks that some handle is granted a lock
// within TTL + FailoverTime + 5s of the heal.
//
// It fails on a stale write accepted (see RunFaults), a register history that
// porcupine finds not linearizable, no progress, or a child that fails. Lease
// overlaps (a key granted while its previous holder had not yet noticed its
// loss) are counted and reported, not failed: the fenced register is what
// must stay safe. It appends a Record to $DLOCK_SAFETY_OUT when set.
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
					leases[m.Lease] = &soakLease{key: m.Key, grant: m.At}
					select {
					case grantCh <- struct{}{}:
					default:
					}
				case "end":
					if l := leases[m.Lease]; l != nil {
						l.end = m.At
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
		faults = append(faults, h.ServerFaults()...)
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
			heal := h.Inject(t, f, heldKey(&mu, leases, keys))
			if lasting(f) {
				sleepUntil(faultAt.Add(2 * ttl))
			}
			heal()
		}
		injected = append(injected, string(f))
		t.Logf("%s: %s (child p%d) injected, healed after %v", time.Since(start).Round(time.Millisecond), f, i, time.Since(faultAt).Round(time.Millisecond))
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
	overlap = countOverlaps(leases)
	overlaps := overlap
	linErr := reg.checkLinearizable(t)
	t.Logf("soak on %s: %d leases, %d requests accepted, %d rejected as stale, %d stale accepted, %d lease overlaps, faults %v",
		h.Deployment(), len(leases), accepted, rejected, stale, overlaps, injected)
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
// have been released since), else a random one: Inject is meant for a held
// key.
func heldKey(mu *sync.Mutex, leases map[string]*soakLease, keys []string) string {
	mu.Lock()
	defer mu.Unlock()
	var held []string
	for _, l := range leases {
		if l.end == 0 {
			held = append(held, l.key)
		}
	}
	if len(held) == 0 {
		return keys[rand.IntN(len(keys))]
	}
	return held[rand.IntN(len(held))]
}

// countOverlaps counts pairs of leases of one key where the later was granted
// before the earlier ended (released, or its loss noticed by its holder).
// A lease that never reported its end counts as ending at the next grant.
func countOverlaps(leases map[string]*soakLease) int {
	byKey := map[string][]*soakLease{}
	for _, l := range leases {
		byKey[l.key] = append(byKey[l.key], l)
	}
	n := 0
	for _, ls := range byKey {
		sort.Slice(ls, func(i, j int) bool { return ls[i].grant < ls[j].grant })
		for i, a := range ls {
			if a.end == 0 {
				continue
			}
			for _, b := range ls[i+1:] {
				if b.grant >= a.end {
					break
				}
				n++
			}
		}
	}
	return n
}
