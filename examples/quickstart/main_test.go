package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain checks that the quickstart, embedded etcd server included, leaves
// no goroutine running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The quickstart's own invariants (a stale write rejected, no deposit lost)
// are checked by run; this runs it as `cd examples && go run ./quickstart` would —
// on its embedded etcd server, and on the in-process mem:// backend — with
// short TTLs.
func TestQuickstart(t *testing.T) {
	t.Run("embedded etcd", func(t *testing.T) {
		if err := run("", time.Second); err != nil { // the embedded server's shortest lease
			t.Fatal(err)
		}
	})
	t.Run("mem", func(t *testing.T) {
		if err := run("mem://quickstart-test", 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	})
}
