package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock/conformance"
)

// BenchmarkPostgres measures the driver against one private PostgreSQL
// cluster, in one run:
//
//   - RawFloor: the least any session advisory lock costs with pgx alone, on
//     one connection: pg_advisory_lock, then pg_advisory_unlock — two round
//     trips, no fencing token.
//   - RawFencedFloor: the two statements the driver sends, on one
//     connection, with nothing around them: the lock and the fence counter's
//     increment in one statement (a durable write: the commit waits for the
//     WAL), then the unlock. The difference to RawFloor is the price of a
//     durable token; the difference to AcquireRelease is dlock's own.
//   - AcquireRelease (conformance): TryAcquire + Release through dlock,
//     uncontended: also two round trips — the lock, the counter's increment
//     and the session's idle timeout in one statement; the unlock and the
//     timeout's reset in another.
//   - RawHandoff8: 8 pgx connections loop pg_advisory_lock →
//     pg_advisory_unlock on one key (conformance.MeasureHandoff), no token.
//   - Handoff8 (conformance): 8 lockers, each with its own pool, loop
//     Acquire → Release on one key; the waits are in the server.
func BenchmarkPostgres(b *testing.B) {
	h := newHarness(b)
	b.Run("RawFloor", func(b *testing.B) {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, h.srv.URL())
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		const key = int64(424242)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
				b.Fatal(err)
			}
			var ok bool
			if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil || !ok {
				b.Fatalf("unlock: %v %v", ok, err)
			}
		}
	})
	b.Run("RawFencedFloor", func(b *testing.B) {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, h.srv.URL())
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `SET synchronous_commit = local;
			CREATE TABLE IF NOT EXISTS dlock_fence (key text PRIMARY KEY, token bigint NOT NULL)`); err != nil {
			b.Fatal(err)
		}
		const key = int64(434343)
		b.ReportAllocs()
		for b.Loop() {
			var token int64
			if err := conn.QueryRow(ctx, `WITH l AS (SELECT pg_try_advisory_lock($1::int8) AS ok)
				INSERT INTO dlock_fence AS f (key, token) SELECT 'bench/raw', 1 FROM l WHERE l.ok
				ON CONFLICT (key) DO UPDATE SET token = f.token + 1 RETURNING f.token`, key).Scan(&token); err != nil {
				b.Fatal(err)
			}
			var ok bool
			if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil || !ok {
				b.Fatalf("unlock: %v %v", ok, err)
			}
		}
	})
	b.Run("RawHandoff8", func(b *testing.B) {
		ctx := context.Background()
		conns := make([]*pgx.Conn, 8)
		for i := range conns {
			c, err := pgx.Connect(ctx, h.srv.URL())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(ctx)
			conns[i] = c
		}
		const key = int64(454545)
		conformance.MeasureHandoff(b, len(conns), func(ctx context.Context, i int) (func() error, error) {
			if _, err := conns[i].Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
				return nil, err
			}
			return func() error {
				_, err := conns[i].Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
				return err
			}, nil
		})
	})
	conformance.RunBenchmarks(b, h)
}
