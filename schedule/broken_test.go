package schedule_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule"
	"github.com/dlock-go/dlock/schedule/scheduletest"
)

// TestRunBrokenRecordCheckRunsTwice: with the record check broken on
// purpose, the late node runs the run again: the RunOncePerRun test's assertion
// is the one that catches it.
func TestRunBrokenRecordCheckRunsTwice(t *testing.T) {
	scheduletest.BreakRecordCheck(t)
	l, err := dlock.Open(context.Background(), "mem://"+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	job := schedule.Job{Name: "report", AtMost: 5 * time.Second}
	at := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	var runs atomic.Int32
	fn := func(context.Context, *dlock.Lease) error { runs.Add(1); return nil }
	for range 2 {
		if _, err := schedule.Run(context.Background(), l, job, at, fn); err != nil {
			t.Fatal(err)
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("with the record check broken, the run ran %d times; want 2 (the check is what stops the second)", n)
	}
}
