package schedule_test

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/memlock"
	_ "github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/schedule/scheduletest"
	_ "github.com/dlock-go/dlock/sqltable" // pgtable://
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pgtableDSN starts a PostgreSQL that makes commits durable, as pgtable://
// requires, and returns its pgtable:// DSN.
func pgtableDSN(t *testing.T) string {
	pg := testenv.StartPostgres(t, testenv.WithPostgresSetting("synchronous_commit", "on"))
	return "pgtable" + strings.TrimPrefix(pg.URL(), "postgres")
}

// TestOnServers runs the suite on Redis and on the table locks of
// PostgreSQL and MariaDB; etcd's run is in the etcd module.
func TestOnServers(t *testing.T) {
	t.Run("redis", func(t *testing.T) { scheduletest.Test(t, testenv.StartRedis(t).URL()) })
	t.Run("pgtable", func(t *testing.T) { scheduletest.Test(t, pgtableDSN(t)) })
	t.Run("mysqltable", func(t *testing.T) { scheduletest.Test(t, testenv.StartMariaDB(t).URL("mysqltable")) })
}

// TestSkewed runs the skew tests with child processes on Redis and on the
// table locks of PostgreSQL and MariaDB.
func TestSkewed(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		scheduletest.TestSkewed(t, testenv.StartRedis(t).URL(), 200*time.Millisecond, time.Second)
	})
	t.Run("pgtable", func(t *testing.T) { scheduletest.TestSkewed(t, pgtableDSN(t), 200*time.Millisecond, time.Second) })
	t.Run("mysqltable", func(t *testing.T) {
		scheduletest.TestSkewed(t, testenv.StartMariaDB(t).URL("mysqltable"), 200*time.Millisecond, time.Second)
	})
}

// TestSkewChild is a node of TestSkewed when run as its child process.
func TestSkewChild(t *testing.T) { scheduletest.Child(t) }
