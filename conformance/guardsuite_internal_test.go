package conformance

import (
	"context"
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
		hist, err := guardHistory(ctx, targets, g.cfg.OpsPerWriter)
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
