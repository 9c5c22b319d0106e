package conformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/semaphore"
)

// The crowd cells repeat Partition with more than one contender, for the
// claims of a semaphore of more than one permit and of a reader.
const (
	// SemaphoreCrowdPartition is Partition with the holder taking one permit
	// of a semaphore of 3 and four contenders taking permits of it, each slot
	// fenced apart; it also fails on a slot outside the 3, two contenders on
	// one slot, or the holder's slot granted before the fault. Without a cell
	// of its own it has Partition's claim.
	SemaphoreCrowdPartition Fault = "semaphore-3-partition"

	// ReaderPartition is Partition with the holder reading a read/write lock
	// and the contender writing it, behind one guard; it also fails if the
	// writer is granted before the fault, or a later reader while the writer
	// holds or not within the liveness bound after. Without a cell of its own
	// it has Partition's claim.
	ReaderPartition Fault = "rw-reader-partition"
)

// crowdPermits is the size of SemaphoreCrowdPartition's semaphore and
// crowdContenders the number of its contenders besides the holder.
const (
	crowdPermits    = 3
	crowdContenders = 4
)

// isCrowd reports whether f is a crowd cell.
func isCrowd(f Fault) bool {
	_, r := baseFault(f)
	return r == rolePermits || r == roleReader
}

// A tenure is one hold of a crowd trial, on the wall clock (ns): from when
// its acquire returned until it ended (see tenureEnd; 0: never).
type tenure struct {
	label   string
	key     string // the register key: the slot, or the read/write lock
	read    bool
	token   dlock.Token
	called  int64 // when its acquire was called (0: not known)
	granted int64 // when its acquire returned
	sent    int64 // when the request that completed it was sent
	until   int64
	lost    bool
	endErr  string
}

// conflicts reports whether two holds exclude each other: the same slot,
// or the same read/write lock with a writer among them.
func conflicts(a, b tenure) bool { return a.key == b.key && !(a.read && b.read) }

// mostAtOnce returns the most tenures of ts that overlap at one moment
// before the wall time before (ns; 0: at any moment), and the moment.
func mostAtOnce(ts []tenure, before int64) (most int, at int64) {
	for _, s := range ts {
		if before != 0 && s.granted >= before {
			continue
		}
		n := 0
		for _, o := range ts {
			if o.granted <= s.granted && (o.until == 0 || s.granted < o.until) {
				n++
			}
		}
		if n > most {
			most, at = n, s.granted
		}
	}
	return most, at
}

// A party is a contender of a crowd trial: it takes its hold from
// h.NewLocker, makes requests of the register with it until it is stopped
// or the hold ends, then releases it; its tenure is what it recorded.
type party struct {
	label   string
	asked   chan struct{} // closed as it asks for its hold
	granted chan struct{} // closed once its hold is granted
	stop    func() error  // cancels its wait or releases its hold; waits for it

	mu       sync.Mutex
	t        tenure
	keys     []string // the primitive's keys (for Residue), once granted
	doneAt   int64
	deadline int64
	relAt    int64
}

// startParty starts a party in role r on the primitive named k. onGrant, if
// not nil, is called with its tenure as it is granted.
func (fs *faultSuite) startParty(t *testing.T, k string, reg *register, bound time.Duration, r role, label string, onGrant func(tenure)) *party {
	p := &party{label: label, asked: make(chan struct{}), granted: make(chan struct{})}
	l := fs.h.NewLocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	done := make(chan error, 1)
	go func() { done <- p.run(ctx, l, k, reg, r, fs.ttl, onGrant) }() // owned by the trial: stop cancels ctx and waits for done
	var once sync.Once
	var stopErr error
	p.stop = func() error {
		once.Do(func() {
			cancel()
			stopErr = <-done
			if err := l.Close(); err != nil && !errors.Is(err, dlock.ErrClosed) && stopErr == nil {
				stopErr = fmt.Errorf("%s: close: %w", label, err)
			}
		})
		return stopErr
	}
	t.Cleanup(func() { _ = p.stop() })
	return p
}

func (p *party) run(ctx context.Context, l dlock.Locker, k string, reg *register, r role, ttl time.Duration, onGrant func(tenure)) error {
	called := time.Now().UnixNano()
	close(p.asked)
	h, err := takeHold(ctx, l, k, r, ttl)
	if err != nil {
		if ctx.Err() != nil {
			return nil // never granted: the trial's checks say whether it should have been
		}
		return fmt.Errorf("%s: acquire: %w", p.label, err)
	}
	ref := leaseRef{Label: p.label, Token: h.token, Granted: time.Now().UnixNano()}
	p.mu.Lock()
	p.t = tenure{label: p.label, key: h.key, read: h.read, token: h.token, called: called, granted: ref.Granted, sent: h.granted.UnixNano()}
	p.keys = h.keys
	tn := p.t
	p.mu.Unlock()
	close(p.granted)
	if onGrant != nil {
		onGrant(tn)
	}
	watched := make(chan struct{})
	go func() { // owned by run: ends with the hold, which run releases
		defer close(watched)
		<-h.done
		at := time.Now()
		p.mu.Lock()
		p.doneAt = at.UnixNano()
		p.deadline = at.Add(h.deadline().Sub(at)).UnixNano() // on the wall clock
		p.t.lost = errors.Is(h.err(), dlock.ErrLeaseLost)
		p.t.endErr = fmt.Sprint(h.err())
		p.mu.Unlock()
	}()
	for h.err() == nil && ctx.Err() == nil {
		h.work(reg, ref, ttl/10)
		select {
		case <-ctx.Done():
		case <-time.After(ttl / 20): // pacing between requests
		}
	}
	p.mu.Lock()
	p.relAt = time.Now().UnixNano()
	p.mu.Unlock()
	err = h.release(context.Background())
	<-watched
	if err != nil && !errors.Is(err, dlock.ErrLeaseLost) {
		return fmt.Errorf("%s: release: %w", p.label, err)
	}
	return nil
}

// tenure returns the party's tenure, and false if it was never granted.
func (p *party) tenure() (tenure, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	tn := p.t
	tn.until = tenureEnd(p.doneAt, tn.lost, p.deadline, p.relAt)
	return tn, tn.granted != 0
}

// crowdTrial is a trial of a crowd cell (see SemaphoreCrowdPartition and
// ReaderPartition): trial's schedule, with the contenders of the cell.
func (fs *faultSuite) crowdTrial(t *testing.T, f Fault) trialResult {
	ttl := fs.ttl
	k := key(t)
	reg := newRegister()
	base, r := baseFault(f)
	if base != Partition {
		t.Fatalf("%s: a crowd cell repeats partition, not %s", f, base)
	}
	dsn, link := fs.h.LinkedDSN(t)
	if link == nil {
		return trialResult{skip: fmt.Sprintf("the %s harness has no Link (LinkedDSN returned nil), so it cannot take %s", fs.h.Deployment(), f)}
	}
	hv, _, stopHolder, link := fs.startHolder(t, f, k, reg, dsn, link)
	hv.mu.Lock()
	grantAt := time.Unix(0, hv.grantAt)
	holder := tenure{label: "holder", key: hv.key, read: r == roleReader, token: hv.token, granted: hv.grantAt}
	hv.mu.Unlock()

	bound := ttl + fs.failover + livenessSlack
	faultLen := 2 * ttl
	partyBound := 10*bound + 4*faultLen + time.Minute
	var (
		mu       sync.Mutex
		grants   int
		full     = make(chan struct{}) // the semaphore's free permits are held
		succ     = make(chan struct{}) // a hold that conflicts with the holder's is granted
		succOnce sync.Once
	)
	held := holder // read by the parties' goroutines, while holder is filled in
	onGrant := func(tn tenure) {
		mu.Lock()
		if grants++; grants == crowdPermits-1 {
			close(full)
		}
		mu.Unlock()
		if conflicts(held, tn) {
			succOnce.Do(func() { close(succ) })
		}
	}
	var parties []*party
	if r == rolePermits {
		for i := range crowdContenders {
			parties = append(parties, fs.startParty(t, k, reg, partyBound, rolePermits, fmt.Sprintf("contender-%d", i+1), onGrant))
		}
		select {
		case <-full:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the %d free permits of %q were not granted within 30s", f, crowdPermits-1, k)
		}
	} else {
		parties = append(parties, fs.startParty(t, k, reg, partyBound, roleWriter, "writer", onGrant))
	}

	// Inject at a random phase of the refresh tick (every TTL/3 after the
	// grant): the first such moment not past.
	at := grantAt.Add(ttl/3 + rand.N(ttl/3))
	for at.Before(time.Now()) {
		at = at.Add(ttl / 3)
	}
	sleepUntil(at)
	faultAt := time.Now()
	link.Blackhole(t)
	sleepUntil(faultAt.Add(faultLen))
	link.Heal(t)
	healedAt := time.Now()

	var res trialResult
	res.failures = fs.awaitSuccessor(succ, hv, stopHolder, k, healedAt)
	var reader *party
	if r == roleReader {
		select {
		case <-succ: // the writer is in: a reader that asks now waits for it
			reader = fs.startParty(t, k, reg, partyBound, roleReader, "later reader", nil)
		default:
		}
	}
	// Let the holder notice its loss, then stop it.
	select {
	case <-hv.ended:
	case <-time.After(2*ttl + livenessSlack):
	}
	if err := stopHolder(); err != nil {
		res.failures = append(res.failures, err.Error())
	}
	if reader != nil {
		// The writer keeps writing for TTL/2 after the reader asked (the
		// trial's schedule), then lets go: the reader must then get in.
		<-reader.asked
		time.Sleep(ttl / 2)
		if err := parties[0].stop(); err != nil {
			res.failures = append(res.failures, err.Error())
		}
		select {
		case <-reader.granted:
		case <-time.After(bound):
			res.failures = append(res.failures, fmt.Sprintf("liveness: the later reader was not granted %q within %v of the writer's release", k, bound))
		}
		parties = append(parties, reader)
	}
	for _, p := range parties {
		if err := p.stop(); err != nil && (p != parties[0] || reader == nil) {
			res.failures = append(res.failures, err.Error())
		}
	}
	if in, ok := fs.h.(Inspector); ok {
		keys := []string{k}
		for _, p := range parties {
			p.mu.Lock()
			keys = append(keys, p.keys...)
			p.mu.Unlock()
		}
		slices.Sort(keys)
		for _, rk := range slices.Compact(keys) {
			if left := in.Residue(t, rk); len(left) > 0 {
				res.failures = append(res.failures, fmt.Sprintf("residue after Close: %q", left))
			}
		}
	}

	// Check and classify.
	hv.mu.Lock()
	holder.until = tenureEnd(hv.endAt, hv.lost, hv.deadline, hv.relAt)
	holder.lost, holder.endErr = hv.lost, hv.endErr
	hv.mu.Unlock()
	var ts []tenure
	for _, p := range parties {
		if tn, ok := p.tenure(); ok {
			ts = append(ts, tn)
		}
	}
	slices.SortFunc(ts, func(a, b tenure) int { return cmp.Compare(a.granted, b.granted) })
	res.failures = append(res.failures, crowdFailures(k, r, holder, ts, faultAt.UnixNano())...)
	var successor tenure
	for _, tn := range ts {
		if conflicts(holder, tn) {
			successor = tn
			break
		}
	}
	g := successor.granted
	if holder.lost && g != 0 && successor.sent != 0 && (successor.sent < faultAt.UnixNano() || successor.sent > healedAt.UnixNano()) {
		g = successor.sent // as in trial
	}
	accepted, rejected, stale, staleEv := reg.counts()
	res.stale = stale
	res.latency = -1
	if holder.lost {
		res.latency = time.Duration(holder.until - faultAt.UnixNano())
	}
	linErr := reg.checkLinearizable(t)
	regressed := tokenRegressed(holder.token, successor.token)
	res.outcome = classify(holder.lost, holder.until, g, stale > 0 || linErr != nil || regressed)
	if g != 0 && (holder.until == 0 || g < holder.until) {
		res.overlaps = 1
	}

	var ev strings.Builder
	fmt.Fprintf(&ev, "  fault %s injected %s, healed %s\n", f, wallString(faultAt.UnixNano()), wallString(healedAt.UnixNano()))
	for _, tn := range append([]tenure{holder}, ts...) {
		kind := "holds"
		if tn.read {
			kind = "reads"
		}
		fmt.Fprintf(&ev, "  %s %s %q: token %d granted %s, until %s (%s)", tn.label, kind,
			tn.key, tn.token, wallString(tn.granted), wallString(tn.until), tn.endErr)
		if tn.label != holder.label && tn == successor {
			fmt.Fprintf(&ev, "; the holder's successor, counted from %s", wallString(g))
			if regressed {
				fmt.Fprintf(&ev, " (token not above the holder's %d)", holder.token)
			}
		}
		ev.WriteString("\n")
	}
	if r == rolePermits {
		most, _ := mostAtOnce(ts, 0)
		all, _ := mostAtOnce(append([]tenure{holder}, ts...), 0)
		fmt.Fprintf(&ev, "  at most %d contenders held permits at once; %d counting the holder until its lease ended\n", most, all)
	}
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

// crowdFailures returns what a crowd trial's tenures break whatever the
// cell's expected outcome: the holder's place granted before the fault; two
// contenders (none faulted) that exclude each other holding at once, or the
// later one, asked for after the earlier was granted, with a token not above
// it; and, in the semaphore, a permit on a slot that is not one of its
// crowdPermits, or more than crowdPermits holding at once — the holder
// counted before the fault, the contenders at any time. ts is in grant
// order.
func crowdFailures(k string, r role, holder tenure, ts []tenure, faultAt int64) []string {
	var out []string
	for _, tn := range ts {
		if conflicts(holder, tn) && tn.granted < faultAt {
			out = append(out, fmt.Sprintf("%s was granted %q (token %d) at %s, before the fault (%s), while the holder (token %d) held it",
				tn.label, tn.key, tn.token, wallString(tn.granted), wallString(faultAt), holder.token))
		}
	}
	for i, a := range ts {
		for _, b := range ts[i+1:] {
			if !conflicts(a, b) {
				continue
			}
			if a.until == 0 || b.granted < a.until {
				out = append(out, fmt.Sprintf("%s (token %d, granted %s) and %s (token %d, granted %s) held %q at once; %s held it until %s, and neither was cut off",
					a.label, a.token, wallString(a.granted), b.label, b.token, wallString(b.granted), a.key, a.label, wallString(a.until)))
			}
			if b.called > a.granted && tokenRegressed(a.token, b.token) {
				out = append(out, fmt.Sprintf("%s, asked for after %s was granted %q, has token %d, not above its %d", b.label, a.label, a.key, b.token, a.token))
			}
		}
	}
	if r != rolePermits {
		return out
	}
	for _, tn := range append([]tenure{holder}, ts...) {
		valid := false
		for i := range crowdPermits {
			valid = valid || tn.key == semaphore.SlotKey(k, i)
		}
		if !valid {
			out = append(out, fmt.Sprintf("%s's permit is %q, not one of the %d slots of %q", tn.label, tn.key, crowdPermits, k))
		}
	}
	if most, at := mostAtOnce(append([]tenure{holder}, ts...), faultAt); most > crowdPermits {
		out = append(out, fmt.Sprintf("%d held permits of %q at once before the fault, the holder among them (at %s); it has %d", most, k, wallString(at), crowdPermits))
	}
	if most, at := mostAtOnce(ts, 0); most > crowdPermits {
		out = append(out, fmt.Sprintf("%d contenders held permits of %q at once (at %s); it has %d", most, k, wallString(at), crowdPermits))
	}
	return out
}
