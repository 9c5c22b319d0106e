package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestObservability runs the example on mem:// and checks what it prints:
// the scraped counters of the workload, and the lost lease in the log.
func TestObservability(t *testing.T) {
	var out, logs bytes.Buffer
	if err := run(context.Background(), "mem://observability-test", &out, &logs); err != nil {
		t.Fatal(err)
	}
	t.Logf("scraped:\n%s\nlog:\n%s", out.String(), logs.String())
	for _, want := range []string{
		`dlock_acquire_duration_seconds_count{dlock_backend="mem",dlock_mode="wait",dlock_outcome="granted"`,
		`dlock_releases_total{dlock_backend="mem",dlock_outcome="ok"`,
		`dlock_leases_lost_total{dlock_backend="mem",dlock_cause="backend-reported"`,
		`dlock_leases_held{dlock_backend="mem"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the scrape lacks %s", want)
		}
	}
	if !strings.Contains(logs.String(), "lease lost") || !strings.Contains(logs.String(), "jobs/stuck") {
		t.Errorf("the log lacks the lost lease:\n%s", logs.String())
	}
}
