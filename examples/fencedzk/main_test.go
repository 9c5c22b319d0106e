package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/testenv"
)

// TestMain checks that the program, its proxy included, leaves no goroutine
// running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFencedZK runs the program against a real ZooKeeper with a short
// session; run checks that alice's late write was refused and the value is
// bob's.
func TestFencedZK(t *testing.T) {
	z := testenv.StartZooKeeper(t)
	if err := run(z.Addr(), time.Second); err != nil {
		t.Fatal(err)
	}
}
