package redis_test

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/conformance"
)

// quiet drops go-redis's own log lines (Sentinel "new master" chatter), which
// would bury the test output; failures are reported through errors anyway.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	conformance.Main(m) // in a child process of the fault suite, runs the child and exits
	goredis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}
