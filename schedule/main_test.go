package schedule_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/memlock"
	_ "github.com/dlock-go/dlock/redis"
	_ "github.com/dlock-go/dlock/sqltable" // pgtable://
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backend opens Lockers on one real server.
type backend struct {
	name string
	dsn  string
}

// backends starts a Redis and a PostgreSQL (for pgtable://, which needs
// durable commits), the servers whose locks outlive their holder; etcd's
// tests are in the etcd module.
func backends(t *testing.T) []backend {
	t.Helper()
	r := testenv.StartRedis(t)
	pg := testenv.StartPostgres(t, testenv.WithPostgresSetting("synchronous_commit", "on"))
	return []backend{
		{"redis", r.URL()},
		{"pgtable", "pgtable" + strings.TrimPrefix(pg.URL(), "postgres")},
	}
}

// open opens a Locker on dsn, closed in t.Cleanup.
func open(t *testing.T, dsn string) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("dlock.Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// testCtx bounds a test.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// onServers are the tests that run on every server of backends.
var onServers = []struct {
	name string
	f    func(t *testing.T, dsn string)
}{
	{"RunOncePerRun", testRunOncePerRun},
	{"AtLeastKeepsOthersOut", testAtLeastKeepsOthersOut},
	{"AtMostBreaksHungJob", testAtMostBreaksHungJob},
	{"NodeDiesMidRun", testNodeDiesMidRun},
	{"OnceStatuses", testOnceStatuses},
	{"OnceRetention", testOnceRetention},
}

// TestOnServers runs each test of onServers on each server, started once.
func TestOnServers(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, tc := range onServers {
				t.Run(tc.name, func(t *testing.T) { tc.f(t, b.dsn) })
			}
		})
	}
}
