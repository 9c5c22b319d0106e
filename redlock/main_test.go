package redlock_test

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/conformance"
)

// quiet drops go-redis's log lines ("failed to dial ..."): the tests kill
// nodes on purpose, and the driver reports what matters in its errors.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	conformance.Main(m) // in a child process of the fault suite, runs the child and exits
	goredis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}
