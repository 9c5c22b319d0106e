package redlock_test

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// quiet drops go-redis's log lines ("failed to dial ..."): the tests kill
// nodes on purpose, and the driver reports what matters in its errors.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	goredis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}
