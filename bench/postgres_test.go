package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/postgres" // postgres://
)

type pgEnv struct {
	srv   *testenv.Postgres
	reqs  func() (float64, error)
	impls []impl
}

func startPostgresEnv(tb testing.TB) *pgEnv {
	// fsync on, as on a production server: counter-mode tokens flush the
	// WAL per grant, and what that costs is part of the comparison.
	e := &pgEnv{srv: testenv.StartPostgres(tb,
		testenv.WithPostgresSetting("shared_preload_libraries", "pg_stat_statements"),
		testenv.WithPostgresSetting("fsync", "on"))}
	url := e.srv.URL()
	e.reqs = pgStatements(tb, url)
	e.impls = []impl{
		dlockImpl("dlock", url, e.reqs),
		// tokens=sequence on its own table: a database holds one token mode.
		dlockImpl("dlock-seq", url+"&tokens=sequence&table=dlock_seq_fence", e.reqs),
		{name: "pg-advisory", newLocker: func(tb testing.TB) locker { return pgAdvisory{newPgConn(tb, url), false} }, canWait: true, reqs: e.reqs, oneSessionPerWaiter: true},
		{name: "floor", newLocker: func(tb testing.TB) locker { return pgAdvisory{newPgConn(tb, url), true} }, reqs: e.reqs},
	}
	return e
}

// pgStatements returns a reader of the statements the server has executed
// (sum of calls in pg_stat_statements, without the reader's own queries).
func pgStatements(tb testing.TB, url string) func() (float64, error) {
	c := newPgConn(tb, url)
	if _, err := c.Exec(context.Background(), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		tb.Fatalf("postgres: pg_stat_statements: %v", err)
	}
	return func() (float64, error) {
		var n float64
		err := c.QueryRow(context.Background(),
			"SELECT coalesce(sum(calls), 0)::float8 FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'").Scan(&n)
		if err != nil {
			return 0, fmt.Errorf("postgres: reading pg_stat_statements: %w", err)
		}
		return n, nil
	}
}

func newPgConn(tb testing.TB, url string) *pgx.Conn {
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		tb.Fatalf("postgres: connect: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// pgAdvisory is a session-level advisory lock on one pgx connection:
// pg_advisory_lock (the peer: it blocks in the server while the lock is held)
// or, for the floor, pg_try_advisory_lock; then pg_advisory_unlock. The key is
// a 64-bit FNV-1a hash of the name.
type pgAdvisory struct {
	c   *pgx.Conn
	try bool
}

func pgKey(key string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return int64(h.Sum64())
}

func (p pgAdvisory) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	k := pgKey(key)
	if p.try {
		if wait {
			return nil, fmt.Errorf("floor: cannot wait")
		}
		var ok bool
		if err := p.c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", k).Scan(&ok); err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("floor: %q is held", key)
		}
	} else if _, err := p.c.Exec(ctx, "SELECT pg_advisory_lock($1)", k); err != nil {
		return nil, err
	}
	return func() error {
		var ok bool
		if err := p.c.QueryRow(context.Background(), "SELECT pg_advisory_unlock($1)", k).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("pg_advisory_unlock(%q): not held", key)
		}
		return nil
	}, nil
}

// pgAdvisoryShared takes a raw pg_advisory_lock_shared on one connection.
type pgAdvisoryShared struct{ c *pgx.Conn }

func (p pgAdvisoryShared) lock(ctx context.Context, key string, _ bool) (func() error, error) {
	k := pgKey(key)
	if _, err := p.c.Exec(ctx, "SELECT pg_advisory_lock_shared($1)", k); err != nil {
		return nil, err
	}
	return func() error {
		var ok bool
		if err := p.c.QueryRow(context.Background(), "SELECT pg_advisory_unlock_shared($1)", k).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("pg_advisory_unlock_shared(%q): not held", key)
		}
		return nil
	}, nil
}

// BenchmarkPostgres compares dlock's PostgreSQL driver, a raw pg_advisory_lock
// with pgx and the floor (pg_try_advisory_lock) on one server; the scenarios
// are BenchmarkRedis's.
func BenchmarkPostgres(b *testing.B) {
	e := startPostgresEnv(b)
	benchBackend(b, e.impls)
}

// BenchmarkPostgresSteps takes the uncontended cycle of dlock with
// tokens=sequence apart, step by step from the floor, all interleaved round by
// round on one server (docs/BENCHMARKS.md explains the sequence-mode target with
// it):
//
//   - floor: pg_try_advisory_lock / pg_advisory_unlock, as in BenchmarkPostgres;
//   - sql: the two statements the driver sends for a lease of its shared session
//     (the acquire, which takes the lock and draws the token from the epoch
//     marker and the sequence, and the unlock), on a pgx connection, under
//     context.Background — the SQL alone;
//   - sql+ctx: the same under a cancellable context, made once: pgx watches
//     every context that can end (a context.AfterFunc per statement), as it
//     must for any statement with a bound or a cancel; the driver's busy
//     shared session avoids it (a deadline on the connection bounds its
//     statements instead), so this step is what that saves;
//   - driver: the postgres driver itself (backend.Driver's Acquire and Release,
//     as the Locker calls them), with its pool, its shared session and its
//     statements' deadline, but no Locker;
//   - dlock-seq: dlock.Open with tokens=sequence: the Locker and its lease on
//     that driver.
func BenchmarkPostgresSteps(b *testing.B) {
	srv := testenv.StartPostgres(b, testenv.WithPostgresSetting("fsync", "on"))
	dsn := srv.URL() + stepsParams
	// Opening the driver creates the sequence mode's objects.
	drv := func(tb testing.TB) locker { return openDriver(tb, dsn) }
	acquire := stepsAcquireSQL(stepsTable)
	sql := func(cancellable bool) func(tb testing.TB) locker {
		return func(tb testing.TB) locker {
			ctx := context.Background()
			if cancellable {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				tb.Cleanup(cancel)
			}
			return pgDriverSQL{c: newPgConn(tb, srv.URL()), acquire: acquire, ctx: ctx}
		}
	}
	impls := []impl{
		{name: "floor", newLocker: func(tb testing.TB) locker { return pgAdvisory{newPgConn(tb, srv.URL()), true} }},
		{name: "driver", newLocker: drv}, // before sql: it creates the objects sql uses
		{name: "sql", newLocker: sql(false)},
		{name: "sql+ctx", newLocker: sql(true)},
		dlockImpl("dlock-seq", dsn, nil),
	}
	b.Run("Uncontended", func(b *testing.B) {
		reportUncontended(b, runUncontended(b, impls, b.N))
	})
}

// stepsTable is the sequence mode's table of BenchmarkPostgresSteps, and
// stepsParams the DSN parameters of its driver.
const (
	stepsTable  = "dlock_steps_fence"
	stepsParams = "&tokens=sequence&table=" + stepsTable
)

// stepsAcquireSQL is the driver's acquire statement for a later lease of its
// shared session in tokens=sequence mode with table (postgres/statements.go:
// sequenceTokens, next), copied so that
// BenchmarkPostgresSteps' sql steps make the server plan and run the same.
// TestStepsSQLIsTheDriversSQL fails when the copy drifts.
func stepsAcquireSQL(table string) string {
	return fmt.Sprintf(`SELECT CASE WHEN pg_try_advisory_lock($1::int8) THEN nextval('%s') END, pg_backend_pid()`,
		pgx.Identifier{table + "_seq"}.Sanitize())
}

// stepsUnlockSQL is the driver's unlock statement for a lease of its shared
// session (statements.go: sharedUnlock).
const stepsUnlockSQL = "SELECT pg_backend_pid(), pg_advisory_unlock($1::int8)"

// TestStepsSQLIsTheDriversSQL: the statements BenchmarkPostgresSteps' sql
// steps send are, to the byte, the ones the driver sends for a later lease of
// its shared session, as the server shows them in pg_stat_activity.
func TestStepsSQLIsTheDriversSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server: not in -short")
	}
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	c := newPgConn(t, srv.URL())
	d := openDriver(t, srv.URL()+stepsParams)
	// The first grant of a shared session also sets its TTL and label; the
	// steps copy the later grants' statement.
	unlock, err := d.lock(ctx, "steps-key", false)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := c.QueryRow(ctx, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted").Scan(&pid); err != nil {
		t.Fatalf("the driver's session: %v", err)
	}
	// last is the statement the driver's session ran last.
	last := func() string {
		t.Helper()
		var q string
		if err := c.QueryRow(ctx, "SELECT query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&q); err != nil {
			t.Fatal(err)
		}
		return q
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	if unlock, err = d.lock(ctx, "steps-key", false); err != nil {
		t.Fatal(err)
	}
	if got, want := last(), stepsAcquireSQL(stepsTable); got != want {
		t.Errorf("the driver's acquire is\n%s\nBenchmarkPostgresSteps' sql steps send\n%s\n(copy it again from postgres/statements.go)", got, want)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	if got := last(); got != stepsUnlockSQL {
		t.Errorf("the driver's unlock is\n%s\nBenchmarkPostgresSteps' sql steps send\n%s", got, stepsUnlockSQL)
	}
}

// pgDriverSQL sends the driver's acquire and unlock statements on one pgx
// connection, under ctx (BenchmarkPostgresSteps).
type pgDriverSQL struct {
	c       *pgx.Conn
	acquire string
	ctx     context.Context
}

func (p pgDriverSQL) lock(_ context.Context, key string, _ bool) (func() error, error) {
	k := pgKey(key)
	var token *int64
	var pid uint32
	if err := p.c.QueryRow(p.ctx, p.acquire, k).Scan(&token, &pid); err != nil {
		return nil, err
	}
	if token == nil || *token <= 0 {
		return nil, fmt.Errorf("sql: token %v for %q", token, key)
	}
	*token += 1 << 44 // the epoch of the session's first grant, as the driver adds it
	return func() error {
		var held bool
		if err := p.c.QueryRow(p.ctx, stepsUnlockSQL, k).Scan(&pid, &held); err != nil {
			return err
		}
		if !held {
			return fmt.Errorf("pg_advisory_unlock(%q): not held", key)
		}
		return nil
	}, nil
}
