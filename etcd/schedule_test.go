package etcd_test

import (
	"testing"

	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/schedule/scheduletest"
)

// TestSchedule runs package schedule's suite on etcd, whose Orphan moves a
// record's key to a lease of its own that nobody renews.
func TestSchedule(t *testing.T) {
	srv := testenv.StartEtcd(t)
	scheduletest.Test(t, newHarness(t, []string{srv.Endpoint()}).dsn())
}
