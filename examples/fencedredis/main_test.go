package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/testenv"
)

// TestMain checks that the program leaves no goroutine running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFencedRedis runs the program against a real Redis with a 1s TTL; run
// checks that alice's late write was refused and the value is bob's.
func TestFencedRedis(t *testing.T) {
	r := testenv.StartRedis(t)
	if err := run(r.URL(), time.Second); err != nil {
		t.Fatal(err)
	}
}
