// Package scheduletest is package schedule's test suite, for the tests of a
// backend whose locks can be orphaned (dlock.Lease.Orphan): Test runs every
// guarantee of Run and Once on Lockers opened from a DSN, TestSkewed runs
// them across processes whose clocks are skewed. Servers are the caller's
// (see internal/testenv).
package scheduletest

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule/internal/hook"
)

// Test runs every test of Run, Every and Once on Lockers opened from dsn,
// as subtests: RunOncePerRun, AtLeastKeepsOthersOut, AtMostBreaksHungJob,
// NodeDiesMidRun, EveryWaitsOutABusyJob, OnceStatuses and OnceRetention.
// Each uses keys of its own; run it once per server.
func Test(t *testing.T, dsn string) {
	for _, tc := range []struct {
		name string
		f    func(t *testing.T, dsn string)
	}{
		{"RunOncePerRun", testRunOncePerRun},
		{"AtLeastKeepsOthersOut", testAtLeastKeepsOthersOut},
		{"AtMostBreaksHungJob", testAtMostBreaksHungJob},
		{"NodeDiesMidRun", testNodeDiesMidRun},
		{"EveryWaitsOutABusyJob", testEveryWaitsOutABusyJob},
		{"OnceStatuses", testOnceStatuses},
		{"OnceRetention", testOnceRetention},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, dsn) })
	}
}

// BreakRecordCheck makes package schedule ignore the records it finds until
// t ends, to show that a test catches a run made twice. Tests that call it
// must not run in parallel with others.
func BreakRecordCheck(t testing.TB) {
	hook.BreakRecordCheck = true
	t.Cleanup(func() { hook.BreakRecordCheck = false })
}

// open opens a Locker on dsn, closed in t.Cleanup.
func open(t *testing.T, dsn string) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("dlock.Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// testCtx bounds a test.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
