package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
)

// memResource is an in-process resource: a value behind a fencing.Guard.
type memResource struct {
	guard fencing.Guard
	mu    sync.Mutex
	v     string
}

// memTarget is a GuardTarget on a memResource; with twoSteps it is broken on
// purpose: it checks the token, lets others run, then writes, so the check
// and the write are not one atomic step.
type memTarget struct {
	r        *memResource
	twoSteps bool
}

func (m memTarget) Write(_ context.Context, tok dlock.Token, v string) error {
	if !m.twoSteps {
		return m.r.guard.Do("mem", tok, func() error {
			m.r.mu.Lock()
			defer m.r.mu.Unlock()
			m.r.v = v
			return nil
		})
	}
	if hi := m.r.guard.Highest("mem"); tok < hi {
		return &fencing.StaleTokenError{Resource: "mem", Token: tok, Highest: hi}
	}
	time.Sleep(200 * time.Microsecond) // another writer checks meanwhile
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	m.r.v = v
	return m.r.guard.Do("mem", tok, nil) // records the token if still the highest
}

func (m memTarget) Read(context.Context) (string, error) {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	return m.r.v, nil
}

func (memTarget) Close() error { return nil }

// memGuardSuite is the suite on in-process resources, one per resource name.
func memGuardSuite(twoSteps bool) *guardSuite {
	var mu sync.Mutex
	res := map[string]*memResource{}
	return &guardSuite{cfg: GuardConfig{Guard: "mem", Writers: 8, OpsPerWriter: 25},
		open: func(_ context.Context, _, resource string) (GuardTarget, error) {
			mu.Lock()
			defer mu.Unlock()
			if res[resource] == nil {
				res[resource] = &memResource{}
			}
			return memTarget{r: res[resource], twoSteps: twoSteps}, nil
		}}
}

// TestGuardSuiteOnGuard: fencing.Guard passes the in-process cases of the
// guard suite (a child process cannot share its memory, and it keeps nothing
// across a restart).
func TestGuardSuiteOnGuard(t *testing.T) {
	g := memGuardSuite(false)
	t.Run("StaleRejectedEqualAccepted", g.testStaleRejected)
	t.Run("RejectedChangesNothing", g.testRejectedChangesNothing)
	t.Run("Atomic", g.testAtomic)
}

// TestGuardSuiteCatchesTwoStepGuard: a guard that checks the token and
// writes in two steps fails the atomicity case: porcupine finds the history
// not linearizable.
func TestGuardSuiteCatchesTwoStepGuard(t *testing.T) {
	g := memGuardSuite(true)
	ctx := context.Background()
	for attempt := 1; ; attempt++ {
		targets := make([]GuardTarget, g.cfg.Writers)
		for i := range targets {
			tg, _ := g.open(ctx, "", "broken")
			targets[i] = tg
		}
		hist, err := guardHistory(ctx, targets, g.cfg.OpsPerWriter, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkGuardHistory(t, hist, false); err != nil {
			t.Logf("attempt %d: %v", attempt, err)
			return
		}
		if attempt == 3 {
			t.Fatalf("the two-step guard passed the atomicity check %d times", attempt)
		}
	}
}

// TestGuardSuiteRecords: each case the suite runs writes one record of its
// outcome, guard and server to $DLOCK_SAFETY_OUT; a skipped case says why.
func TestGuardSuiteRecords(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("DLOCK_SAFETY_OUT", dir)
	g := memGuardSuite(false)
	g.cfg.Server, g.cfg.NotDurable = "process memory", "kept in memory"
	cases := g.cases()
	if got := GuardCases(); len(got) != len(cases) || got[0] != cases[0].name {
		t.Fatalf("GuardCases() = %q", got)
	}
	var run []guardCase
	for _, c := range cases {
		if c.name != "PausedHolder" { // needs a child process and a lock service
			run = append(run, c)
		}
	}
	t.Run("suite", func(t *testing.T) { g.runCases(t, run) })
	b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%d.jsonl", os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Record{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		got[r.Case] = r
	}
	if len(got) != len(run) {
		t.Fatalf("%d records for %d cases:\n%s", len(got), len(run), b)
	}
	for _, c := range run {
		r := got[c.name]
		wantSkip := ""
		if c.name == "SurvivesRestart" {
			wantSkip = "not durable: kept in memory"
		}
		if r.Kind != "guard" || r.Guard != "mem" || r.Deployment != "process memory" || r.Failed || r.Skip != wantSkip {
			t.Errorf("record of %s = %+v, want a guard record of mem on process memory, skip %q", c.name, r, wantSkip)
		}
	}
}
