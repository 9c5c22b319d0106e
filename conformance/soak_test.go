package conformance

import (
	"encoding/json"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

// A soak lease counts as its holder's until the earliest of Done, its call to
// Release and, if it was lost, its Deadline — the rule RunFaults' classify
// uses.
func TestSoakLeaseUntil(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    soakLease
		at   int64
		how  string
	}{
		{"released", soakLease{ended: true, deadline: 90, done: 31, released: 30}, 30, "Release called"},
		{"lost, Done before the Deadline", soakLease{ended: true, lost: true, deadline: 90, done: 40, released: 50}, 40, "Done"},
		// A paused holder: Done closes and Release is called only after SIGCONT.
		{"lost while paused", soakLease{ended: true, lost: true, deadline: 60, done: 200, released: 190}, 60, "Deadline"},
		// Not lost: a Release that finished after the Deadline (the key was
		// still there) ends it, not the Deadline.
		{"released after its Deadline", soakLease{ended: true, deadline: 60, done: 80, released: 70}, 70, "Release called"},
		{"never reported", soakLease{deadline: 60}, math.MaxInt64, "never reported its end"},
	} {
		if at, how := tc.l.until(); at != tc.at || how != tc.how {
			t.Errorf("%s: until = %d (%s), want %d (%s)", tc.name, at, how, tc.at, tc.how)
		}
	}
}

func TestFindOverlaps(t *testing.T) {
	leases := map[string]*soakLease{}
	add := func(l soakLease) {
		l.ended = l.ended || l.done != 0
		leases[l.label] = &l
	}
	// Labels name the child process: p<i>.g<g>#<seq>.
	add(soakLease{label: "p0.g0#1", key: "k", grant: 10, deadline: 100, done: 21, released: 20})
	add(soakLease{label: "p0.g0#2", key: "k", grant: 20, deadline: 100, done: 31, released: 30}) // after #1's Release: none
	add(soakLease{label: "p2.g0#1", key: "k", grant: 25, deadline: 100, done: 41, released: 40}) // before p0#2's Release: one, during restart-empty
	// Paused past its Deadline: lost at 60 though Done closed at 200.
	add(soakLease{label: "p1.g0#1", key: "k", grant: 50, deadline: 60, done: 200, released: 190, lost: true})
	add(soakLease{label: "p2.g0#2", key: "k", grant: 70, deadline: 160, done: 151, released: 150})  // after p1's Deadline: none
	add(soakLease{label: "p0.g0#3", key: "k", grant: 140, deadline: 300, done: 301, released: 300}) // before p2#2's Release: one, during no fault
	add(soakLease{label: "p0.g1#1", key: "j", grant: 26, deadline: 90, done: 28, released: 27})     // another key
	add(soakLease{label: "p1.g1#1", key: "i", grant: 400, deadline: 500})                           // never reported its end
	add(soakLease{label: "p2.g1#1", key: "i", grant: 600, deadline: 700, done: 601, released: 600}) // after p1's Deadline, but p1 never ended: one, during pause-holder of p1
	// An overlap during a pause of another child than the earlier lease's:
	// the pause cannot have caused it.
	add(soakLease{label: "p0.g2#1", key: "m", grant: 1000, deadline: 1100, done: 1051, released: 1050})
	add(soakLease{label: "p1.g2#1", key: "m", grant: 1040, deadline: 1140, done: 1101, released: 1100})
	// A clock jump on key n explains an overlap on n, not one on o.
	add(soakLease{label: "p0.g3#1", key: "n", grant: 2000, deadline: 2100, done: 2051, released: 2050})
	add(soakLease{label: "p1.g3#1", key: "n", grant: 2030, deadline: 2130, done: 2101, released: 2100})
	add(soakLease{label: "p0.g4#1", key: "o", grant: 2000, deadline: 2100, done: 2051, released: 2050})
	add(soakLease{label: "p1.g4#1", key: "o", grant: 2030, deadline: 2130, done: 2101, released: 2100})
	// After a release, b's tenure counts from when its Acquire returned (its
	// request may have been in flight during the release): none. After a
	// lost lease, from when b's winning request was sent: a Deadline
	// overstated by less than b's round trip is an overlap.
	add(soakLease{label: "p0.g5#1", key: "q", grant: 3000, deadline: 3100, done: 3051, released: 3050})
	add(soakLease{label: "p1.g5#1", key: "q", grant: 3052, sent: 3049, deadline: 3150, done: 3101, released: 3100})
	add(soakLease{label: "p0.g6#1", key: "r", grant: 3000, deadline: 3050, done: 3200, released: 3190, lost: true})
	add(soakLease{label: "p1.g6#1", key: "r", grant: 3052, sent: 3048, deadline: 3150, done: 3101, released: 3100})
	// A request sent just before a server stall is answered after it: b's
	// tenure counts from its Acquire's return, after the lost lease's holder
	// had released (a Redis soak in CI: the release was called during the
	// stall, the waiter's attempt sent 3ms before it). None.
	add(soakLease{label: "p1.g7#1", key: "s", grant: 4000, deadline: 4044, done: 4200, released: 4043, lost: true})
	add(soakLease{label: "p0.g7#1", key: "s", grant: 4205, sent: 4005, deadline: 4300, done: 4251, released: 4250})
	// A lease lost with its Done before its Deadline (a renewal failed, and
	// the driver gave back the lock): b's tenure counts from its Acquire's
	// return, which came after that Done, though its request was sent before
	// (a Redlock soak in CI, on a loaded machine). None. One whose Acquire
	// returned before the Done: one.
	add(soakLease{label: "p2.g8#1", key: "t", grant: 5000, deadline: 5100, done: 5040, released: 5041, lost: true})
	add(soakLease{label: "p2.g8#2", key: "t", grant: 5060, sent: 5030, deadline: 5200, done: 5071, released: 5070})
	add(soakLease{label: "p2.g9#1", key: "u", grant: 6000, deadline: 6100, done: 6040, released: 6041, lost: true})
	add(soakLease{label: "p1.g9#1", key: "u", grant: 6030, sent: 6020, deadline: 6200, done: 6071, released: 6070})
	// A server's fault outlasts its heal: a lease granted just after a
	// stall's heal, lost when the resumed leader revokes it (etcd issue
	// 15247), overlaps with the stall; one granted past the tail does not.
	add(soakLease{label: "p0.g10#1", key: "v", grant: 4205, deadline: 4400, done: 4215, released: 4216, lost: true})
	add(soakLease{label: "p1.g10#1", key: "v", grant: 4212, deadline: 4500, done: 4301, released: 4300})
	add(soakLease{label: "p0.g11#1", key: "w", grant: 4230, deadline: 4400, done: 4240, released: 4241, lost: true})
	add(soakLease{label: "p1.g11#1", key: "w", grant: 4235, deadline: 4500, done: 4301, released: 4300})
	// A clock jump on a permit's lock explains an overlap on the soak key
	// whose lease held that lock.
	add(soakLease{label: "p0.g12#1", key: "x", lock: "x/permits/0", grant: 2000, deadline: 2100, done: 2051, released: 2050})
	add(soakLease{label: "p1.g12#1", key: "x", lock: "x/permits/0", grant: 2030, deadline: 2130, done: 2101, released: 2100})
	// A lease lost at its Deadline whose holder then released what was left
	// of the lock, before b's Acquire returned: b's request, sent before the
	// loss, may have waited for that release (a Redis soak on a loaded host,
	// no fault). None.
	add(soakLease{label: "p1.g13#1", key: "y", grant: 7045, deadline: 7059, done: 7060, released: 7359, lost: true})
	add(soakLease{label: "p2.g13#1", key: "y", grant: 7398, sent: 6764, deadline: 8396, done: 7643, released: 7641})
	// A clock jump whose deletions land while the earlier lease's Acquire
	// is on its way back: its request was sent before the heal, its Acquire
	// returned after it (a Redlock soak in CI). One, during the jump. Where
	// the request's sending is unknown, the grant counts: none explained.
	add(soakLease{label: "p2.g14#1", key: "z", lock: "z/permits/0", grant: 8015, sent: 8004, deadline: 8900, done: 8029, released: 8027, lost: true})
	add(soakLease{label: "p0.g14#1", key: "z", lock: "z/permits/0", grant: 8020, sent: 8005, deadline: 8900, done: 8081, released: 8080})
	add(soakLease{label: "p2.g15#1", key: "zz", grant: 8015, deadline: 8900, done: 8029, released: 8027, lost: true})
	add(soakLease{label: "p0.g15#1", key: "zz", grant: 8020, sent: 8005, deadline: 8900, done: 8081, released: 8080})
	faults := []soakFault{
		{f: RestartEmpty, child: 0, start: 22, healed: 24},
		{f: PauseHolder, child: 1, start: 500, healed: 590},
		{f: PauseHolder, child: 2, start: 1010, healed: 1030},
		{f: ClockJump, child: 0, key: "n", start: 2010, healed: 2020},
		{f: ClockJump, child: 0, key: "x/permits/0", start: 2010, healed: 2020},
		{f: Stall, child: 1, start: 4010, healed: 4200},
		{f: ClockJump, child: 1, key: "z/permits/0", start: 8008, healed: 8010},
		{f: ClockJump, child: 1, key: "zz", start: 8008, healed: 8010},
	}
	o := SoakOptions{Matrix: Matrix{
		RestartEmpty: {Outcome: LossDetected | Fenced},
		PauseHolder:  {Outcome: LossDetected | Fenced},
		ClockJump:    {Outcome: LossDetected | Fenced},
		Stall:        {Outcome: LossDetected},
	}}
	got := findOverlaps(leases, faults, 20, o.overlapExpected)
	type pair struct {
		a, b     string
		fault    Fault
		expected bool
	}
	want := []pair{
		{"p1.g1#1", "p2.g1#1", PauseHolder, true},
		{"p0.g0#2", "p2.g0#1", RestartEmpty, true},
		{"p2.g0#2", "p0.g0#3", "", false},
		{"p0.g2#1", "p1.g2#1", "", false}, // the pause hit p2, not p0
		{"p0.g3#1", "p1.g3#1", ClockJump, true},
		{"p0.g4#1", "p1.g4#1", "", false},         // the jump hit key n, not o
		{"p0.g6#1", "p1.g6#1", "", false},         // sent 2 before the lost lease's Deadline
		{"p2.g9#1", "p1.g9#1", "", false},         // returned before the lost lease's Done
		{"p0.g10#1", "p1.g10#1", Stall, false},    // granted 5 after the stall's heal
		{"p0.g11#1", "p1.g11#1", "", false},       // granted past the tail
		{"p0.g12#1", "p1.g12#1", ClockJump, true}, // the jump hit x's permit lock
		{"p2.g14#1", "p0.g14#1", ClockJump, true}, // healed after p2's request was sent
		{"p2.g15#1", "p0.g15#1", "", false},       // healed before p2's Acquire returned, its request's sending unknown
	}
	if len(got) != len(want) {
		t.Fatalf("findOverlaps found %d overlaps, want %d: %v", len(got), len(want), got)
	}
	for i, ov := range got {
		p := pair{a: ov.a.label, b: ov.b.label, expected: ov.expected}
		if ov.fault != nil {
			p.fault = ov.fault.f
		}
		if p != want[i] {
			t.Errorf("overlap %d = %+v, want %+v", i, p, want[i])
		}
	}
	if s := got[1].String(); !strings.Contains(s, "during restart-empty") || !strings.Contains(s, "(Release called)") {
		t.Errorf("evidence %q does not name the fault or how the earlier lease ended", s)
	}
}

func TestSoakTokenOrder(t *testing.T) {
	leases := map[string]*soakLease{
		"a": {label: "a", key: "k", token: 10, grant: 100, sent: 90},
		"b": {label: "b", key: "k", token: 11, grant: 200, sent: 150},                     // asked after a's grant, higher: fine
		"c": {label: "c", key: "k", token: 9, grant: 210, sent: 95},                       // asked before a's grant returned: no order known
		"d": {label: "d", key: "k", token: 11, grant: 300, sent: 250},                     // asked after b's grant, the same token
		"e": {label: "e", key: "k", lock: "k/permits/0", token: 1, grant: 400, sent: 350}, // another lock: its own order
		"f": {label: "f", key: "j", token: 5, grant: 500},                                 // request time unknown
	}
	got := tokenRegressions(leases)
	if len(got) != 1 || !strings.Contains(got[0], "d (token 11)") || !strings.Contains(got[0], "b (token 11)") {
		t.Errorf("tokenRegressions = %q, want one: d's token 11 asked for after b's 11 was granted", got)
	}
	leases["d"].token = 12
	if got := tokenRegressions(leases); len(got) != 0 {
		t.Errorf("tokenRegressions = %q with increasing tokens, want none", got)
	}
}

func TestSoakOverlapExpected(t *testing.T) {
	var none SoakOptions
	for f, want := range map[Fault]bool{RestartEmpty: true, ClockJump: true, Restart: false, PauseHolder: false, Stall: false} {
		if got := none.overlapExpected(f); got != want {
			t.Errorf("without a Matrix, overlapExpected(%s) = %v, want %v", f, got, want)
		}
	}
	o := SoakOptions{Matrix: Matrix{Stall: {Outcome: Held | LossDetected | Fenced}, RestartEmpty: {Outcome: LossDetected}}}
	for f, want := range map[Fault]bool{Stall: true, RestartEmpty: false, ClockJump: false} {
		if got := o.overlapExpected(f); got != want {
			t.Errorf("with a Matrix, overlapExpected(%s) = %v, want %v", f, got, want)
		}
	}
}

// A soak locker reports each lease's end with when it called Release, when
// it saw Done closed, and the Deadline last in effect, which the parent needs
// to end the lease at its Deadline when it was lost.
func TestSoakLockerReportsLeaseEnd(t *testing.T) {
	childIn, parentOut := io.Pipe()
	parentIn, childOut := io.Pipe()
	c := newChildConn(childIn, childOut)
	spec := childSpec{Name: "p", DSN: "mem://" + sanitize(t.Name()), Keys: []string{"k"}, TTL: time.Second,
		Interval: time.Millisecond, Think: time.Millisecond}
	errc := make(chan error, 1)
	go func() {
		errc <- soakLocker(c, spec, 0)
		childOut.Close()
	}()
	dec, enc := json.NewDecoder(parentIn), json.NewEncoder(parentOut)
	var grant, end msg
	for end.T == "" {
		var m msg
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("reading the child's messages: %v", err)
		}
		switch {
		case m.T == "op":
			if err := enc.Encode(msg{ID: m.ID, OK: true}); err != nil {
				t.Fatal(err)
			}
		case m.T == "grant" && grant.T == "":
			grant = m
		case m.T == "end" && m.Lease == grant.Lease:
			end = m
		}
	}
	parentOut.Close() // stop
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_, _ = io.Copy(io.Discard, parentIn)
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	<-drained

	if grant.Deadline <= grant.At-int64(spec.TTL) || grant.Deadline > grant.At+int64(spec.TTL) {
		t.Errorf("grant at %s reports Deadline %s, want within a TTL after it", wallString(grant.At), wallString(grant.Deadline))
	}
	if end.Released == 0 || end.At < end.Released || end.Lost {
		t.Errorf("end reports Release called %s, Done %s, lost %v (%s); want a Release, then Done, not lost",
			wallString(end.Released), wallString(end.At), end.Lost, end.Err)
	}
	if end.Deadline < grant.Deadline-int64(time.Millisecond) { // the wall clock may be slewed between the two readings
		t.Errorf("end reports Deadline %s, before the granted one, %s", wallString(end.Deadline), wallString(grant.Deadline))
	}
	l := soakLease{ended: true, deadline: end.Deadline, done: end.At, released: end.Released, lost: end.Lost}
	if at, how := l.until(); at != end.Released {
		t.Errorf("until = %s (%s), want the Release call, %s", wallString(at), how, wallString(end.Released))
	}
}
