package conformance

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// Two increments from the same value, both accepted, are a lost update:
// porcupine must reject the history and leave its visualisation behind.
func TestRegisterLostUpdateNotLinearizable(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("DLOCK_ARTIFACTS", dir)
	reg := newRegister()
	a := leaseRef{Label: "a", Token: 5, Granted: 1}
	b := leaseRef{Label: "b", Token: 5, Granted: 2} // the same token twice: the Guard cannot tell them apart
	va, _ := reg.op("k", a, false, 0)
	vb, _ := reg.op("k", b, false, 0)
	if _, ok := reg.op("k", b, true, vb+1); !ok {
		t.Fatal("b's write rejected")
	}
	if _, ok := reg.op("k", a, true, va+1); !ok {
		t.Fatal("a's write rejected")
	}
	err := reg.checkLinearizable(t)
	if err == nil {
		t.Fatal("a lost update passed the linearizability check")
	}
	if !strings.Contains(err.Error(), `"k" is 1 after 2 increments accepted`) {
		t.Errorf("error does not count the lost update: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "porcupine-*.html"))
	if len(files) != 1 || !strings.Contains(err.Error(), files[0]) {
		t.Fatalf("want one visualisation named in the error; files %v, error %v", files, err)
	}
}

// Fenced increments interleaved across two holders stay linearizable: the
// older holder's write after the newer holder's read is rejected.
func TestRegisterFencedIncrementsLinearizable(t *testing.T) {
	reg := newRegister()
	a := leaseRef{Label: "a", Token: 5, Granted: 1}
	b := leaseRef{Label: "b", Token: 6, Granted: 2}
	va, _ := reg.op("k", a, false, 0)
	vb, _ := reg.op("k", b, false, 0)
	if _, ok := reg.op("k", a, true, va+1); ok {
		t.Fatal("the older holder's write after the newer holder's read was accepted")
	}
	if _, ok := reg.op("k", b, true, vb+1); !ok {
		t.Fatal("the newer holder's write was rejected")
	}
	if v, ok := reg.op("k", b, false, 0); !ok || v != 1 {
		t.Fatalf("read = %d, %v; want 1, true", v, ok)
	}
	if err := reg.checkLinearizable(t); err != nil {
		t.Fatal(err)
	}
	if acc, rej, stale, _ := reg.counts(); acc != 4 || rej != 1 || stale != 0 {
		t.Fatalf("accepted %d rejected %d stale %d; want 4 1 0", acc, rej, stale)
	}
	// The rejection names the lease whose write it was, and the token that
	// made it stale.
	if ev := reg.rejectedEvidence(); len(ev) != 1 || !strings.Contains(ev[0], a.Label+"'s write (token 5") || !strings.Contains(ev[0], "token 6 was already accepted") {
		t.Fatalf("rejections %q; want one naming %s's write", ev, a.Label)
	}
}

// A token that goes backwards (the newer grant has the lower token) lets the
// older holder write after the newer one reached the resource: a stale write
// accepted.
func TestRegisterCountsStaleWrites(t *testing.T) {
	reg := newRegister()
	old := leaseRef{Label: "old", Token: 9, Granted: 1}
	newer := leaseRef{Label: "new", Token: 3, Granted: 2}
	reg.op("k", old, false, 0)
	if _, ok := reg.op("k", newer, false, 0); ok {
		t.Fatal("the lower token was accepted")
	}
	reg.op("k", old, true, 1)
	_, _, stale, ev := reg.counts()
	if stale != 1 || len(ev) != 1 || !strings.Contains(ev[0], "old (token 9") {
		t.Fatalf("stale = %d, evidence %q; want 1 naming the old lease", stale, ev)
	}
}

// Two leases whose acquires overlap in time are not ordered by when they
// returned: after Redis's restart-empty, a waiter granted before the wipe
// (the lower token) can return after a holder granted on the empty server.
// Its request is rejected, and the holder's later writes are not stale. With
// the same returns and acquires that did not overlap, they would be.
func TestRegisterOrdersOnlyAcquiresThatDoNotOverlap(t *testing.T) {
	for _, tc := range []struct {
		name      string
		late      leaseRef // returned after holder, with the lower token
		wantStale int
	}{
		{"overlapping", leaseRef{Label: "late", Token: 3, Called: 1, Granted: 30}, 0},
		{"after", leaseRef{Label: "late", Token: 3, Called: 21, Granted: 30}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegister()
			holder := leaseRef{Label: "holder", Token: 9, Called: 10, Granted: 20}
			reg.op("k", holder, false, 0)
			if _, ok := reg.op("k", tc.late, false, 0); ok {
				t.Fatal("the lower token was accepted")
			}
			reg.op("k", holder, true, 1)
			if _, _, stale, ev := reg.counts(); stale != tc.wantStale {
				t.Fatalf("stale = %d (%q), want %d", stale, ev, tc.wantStale)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name           string
		lost           bool
		until, grantAt int64
		unsafe         bool
		want           Outcome
	}{
		{"released, then granted", false, 10, 11, false, Held},
		{"granted the moment Release was called", false, 10, 10, false, Held},
		{"released, never granted", false, 10, 0, false, Held},
		{"granted while the holder still believed", false, 10, 5, false, Fenced},
		{"granted, the holder never ended", false, 0, 5, false, Fenced},
		{"lost before the grant", true, 8, 9, false, LossDetected},
		{"lost at the grant", true, 9, 9, false, LossDetected},
		{"lost after the grant", true, 10, 9, false, Fenced},
		{"lost, never granted", true, 10, 0, false, LossDetected},
		{"stale write accepted", true, 8, 9, true, Unsafe},
	} {
		if got := classify(tc.lost, tc.until, tc.grantAt, tc.unsafe); got != tc.want {
			t.Errorf("%s: classify = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestTokenRegressed(t *testing.T) {
	for _, tc := range []struct {
		holder, contender dlock.Token
		want              bool
	}{
		{5, 6, false},
		{5, 5, true},
		{5, 4, true},
		{5, 0, false}, // the contender was never granted
		{0, 3, false}, // the holder was never granted
	} {
		if got := tokenRegressed(tc.holder, tc.contender); got != tc.want {
			t.Errorf("tokenRegressed(%d, %d) = %v, want %v", tc.holder, tc.contender, got, tc.want)
		}
	}
}

func TestOrderedFaultsAndStrings(t *testing.T) {
	m := Matrix{"zzz": {}, ClockJump: {}, Partition: {}, "aaa": {}, Stall: {}}
	got := orderedFaults(m)
	want := []Fault{Partition, Stall, ClockJump, "aaa", "zzz"}
	if len(got) != len(want) {
		t.Fatalf("orderedFaults = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("orderedFaults = %v, want %v", got, want)
		}
	}
	if s := (LossDetected | Fenced).String(); s != "loss-detected|safe-with-fencing" {
		t.Fatalf("String = %q", s)
	}
	p50, max := latencyStats([]time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond})
	if p50 != 2 || max != 3 {
		t.Fatalf("latencyStats = %v, %v; want 2, 3", p50, max)
	}
}

func TestWriteRecord(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("DLOCK_SAFETY_OUT", dir)
	WriteRecord(t, Record{Kind: "fault", Deployment: "d", Fault: "f", Observed: "held"})
	b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(os.Getpid())+".jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"deployment":"d"`) || !strings.HasSuffix(string(b), "\n") {
		t.Fatalf("record file %q", b)
	}
}

// memFaultHarness runs RunFaults end to end on the in-process driver, with
// the one fault it can take: a lock expired behind the holder's back.
type memFaultHarness struct{ name string }

func (h memFaultHarness) NewLocker(t testing.TB) dlock.Locker {
	l, err := dlock.New(memlock.Shared(h.name).NewDriver())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (h memFaultHarness) Expire(t testing.TB, key string) {
	if !memlock.Shared(h.name).Expire(key) {
		t.Fatalf("Expire(%q): not held", key)
	}
}

func (memFaultHarness) ShortTTL() time.Duration               { return 300 * time.Millisecond }
func (memFaultHarness) Deployment() string                    { return "mem" }
func (h memFaultHarness) LinkedDSN(testing.TB) (string, Link) { return "mem://" + h.name, nil }

func (h memFaultHarness) ServerFaults() map[Fault]Injector {
	return map[Fault]Injector{ClockJump: func(t testing.TB, key string) func() {
		h.Expire(t, key)
		return func() {}
	}}
}

func TestRunFaultsMem(t *testing.T) {
	t.Setenv("DLOCK_SAFETY_OUT", "") // the reference driver is no deployment for docs/SAFETY.md
	RunFaults(t, memFaultHarness{name: "faults-" + t.Name()}, Matrix{
		ClockJump:  {Outcome: LossDetected | Fenced, Why: "the store tells the holder when it expires the lock"},
		Partition:  {Outcome: Held, Why: "never runs: no Link"},
		KillLeader: {Skip: "no leader"},
	})
}
