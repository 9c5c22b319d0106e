package schedule

import (
	"context"
	"testing"
	"time"
)

// WithClock returns a ctx under which Every reads the time from now.
func WithClock(ctx context.Context, now func() time.Time) context.Context {
	return context.WithValue(ctx, clockKey{}, now)
}

// BreakRecordCheck makes Run and Once ignore records until t ends.
func BreakRecordCheck(t testing.TB) {
	breakRecordCheck = true
	t.Cleanup(func() { breakRecordCheck = false })
}

// SetBreakRecordCheck sets the broken record check for a child process.
func SetBreakRecordCheck(on bool) { breakRecordCheck = on }
