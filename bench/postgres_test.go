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
