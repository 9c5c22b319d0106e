//go:build unix

package main

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain runs job A's process when the example re-executes its own binary
// (this test binary here), and checks that the example leaves no goroutine
// running.
func TestMain(m *testing.M) {
	if os.Getenv(envDSN) != "" {
		if err := jobA(); err != nil {
			fmt.Fprintln(os.Stderr, "job A:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestFencedJob runs the example as `cd examples && go run ./fencedjob`
// would, on its embedded etcd server, with a 1s TTL: job A frozen past its
// TTL, its late write refused by the bucket and by the HTTP service, job B's
// data in both (run checks each).
func TestFencedJob(t *testing.T) {
	if err := run(os.Args[0], "", time.Second); err != nil {
		t.Fatal(err)
	}
}
