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

// TestFencedSQL runs the program against a real PostgreSQL with a 1s TTL;
// run checks that alice's late write was refused and the value is bob's.
func TestFencedSQL(t *testing.T) {
	pg := testenv.StartPostgres(t)
	if err := run(pg.URL(), time.Second); err != nil {
		t.Fatal(err)
	}
}
