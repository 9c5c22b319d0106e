package conformance

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Record is one line of the safety results that RunFaults (per cell), Soak
// (per run) and RunGuardSuite (per guard and case) append under
// $DLOCK_SAFETY_OUT, from which conformance/cmd/safety-report writes
// docs/SAFETY.md.
type Record struct {
	Kind         string  `json:"kind"`               // "fault", "soak" or "guard"
	Deployment   string  `json:"deployment"`         // FaultHarness.Deployment; for a guard, GuardConfig.Server
	Guard        string  `json:"guard,omitempty"`    // guard: GuardConfig.Guard
	Case         string  `json:"case,omitempty"`     // guard: the guard suite's case (its subtest's name)
	Fault        string  `json:"fault,omitempty"`    // the Fault; for a soak, the faults injected
	Expected     string  `json:"expected,omitempty"` // Expect.Outcome, as Outcome.String
	Observed     string  `json:"observed,omitempty"` // the union of the trials' outcomes ("" if skipped); for a soak, its shape
	Why          string  `json:"why,omitempty"`      // Expect.Why
	Skip         string  `json:"skip,omitempty"`     // why the cell was skipped
	Trials       int     `json:"trials"`             // trials run (soak: faults injected)
	LatencyP50Ms float64 `json:"latency_p50_ms"`     // detection latency, median; -1 if none
	LatencyMaxMs float64 `json:"latency_max_ms"`     // detection latency, maximum; -1 if none
	Stale        int     `json:"stale_accepted"`     // stale writes accepted
	Overlaps     int     `json:"overlaps"`           // trials (soak: lease pairs) where two holders overlapped
	Ops          int     `json:"ops,omitempty"`      // soak: register requests accepted
	Duration     string  `json:"duration,omitempty"` // soak: how long it ran
	Failed       bool    `json:"failed,omitempty"`   // the cell or soak failed
	Test         string  `json:"test"`               // the test's name
	Time         string  `json:"time"`               // when the record was written (RFC 3339, UTC)
}

var recordMu sync.Mutex

// WriteRecord fills in rec's Test and Time and appends it as one JSON line
// to $DLOCK_SAFETY_OUT/<pid>.jsonl; it does nothing when that is unset.
func WriteRecord(t testing.TB, rec Record) {
	dir := os.Getenv("DLOCK_SAFETY_OUT")
	if dir == "" {
		return
	}
	rec.Test = t.Name()
	rec.Time = time.Now().UTC().Format(time.RFC3339)
	b, err := json.Marshal(rec)
	if err != nil {
		t.Errorf("safety record: %v", err)
		return
	}
	recordMu.Lock()
	defer recordMu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("safety record: %v", err)
		return
	}
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%d.jsonl", os.Getpid())), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("safety record: %v", err)
		return
	}
	defer f.Close()
	if _, err := f.Write(append(b, '\n')); err != nil {
		t.Errorf("safety record: %v", err)
	}
}
