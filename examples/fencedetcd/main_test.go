package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain checks that the program, embedded etcd server included, leaves no
// goroutine running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFencedEtcd runs the program as `go run ./fencedetcd` would, with the
// embedded server's shortest lease; run checks that alice's late write was
// refused and the value is bob's.
func TestFencedEtcd(t *testing.T) {
	if err := run(time.Second); err != nil {
		t.Fatal(err)
	}
}
