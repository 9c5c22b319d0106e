//go:build unix

package main

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain runs the candidate processes the example starts (it re-executes
// its own binary, this test binary here), and checks that the example leaves
// no goroutine running.
func TestMain(m *testing.M) {
	if name := os.Getenv(envName); name != "" {
		if err := candidate(name); err != nil {
			fmt.Fprintln(os.Stderr, name+":", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestLeader runs the example as `cd examples && go run ./leader` would, on
// its embedded etcd server, with a 1s TTL: two processes, the leader frozen
// past its TTL, its stale write rejected and the new leader's accepted
// (run checks each).
func TestLeader(t *testing.T) {
	if err := run(os.Args[0], "", time.Second); err != nil {
		t.Fatal(err)
	}
}
