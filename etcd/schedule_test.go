package etcd_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/schedule/scheduletest"
)

// TestSchedule runs package schedule's suite on etcd, whose Orphan moves a
// record's key to a lease of its own that nobody renews.
func TestSchedule(t *testing.T) {
	srv := testenv.StartEtcd(t)
	scheduletest.Test(t, newHarness(t, []string{srv.Endpoint()}).dsn())
}

// TestScheduleSkewed runs the skew tests with child processes on etcd,
// without AtLeast and with an AtMost of 2 s: etcd's TTLs are whole seconds,
// 2 at least.
func TestScheduleSkewed(t *testing.T) {
	srv := testenv.StartEtcd(t)
	scheduletest.TestSkewed(t, newHarness(t, []string{srv.Endpoint()}).dsn(), 0, 2*time.Second)
}

// TestSkewChild is a node of TestScheduleSkewed when run as its child.
func TestSkewChild(t *testing.T) { scheduletest.Child(t) }
