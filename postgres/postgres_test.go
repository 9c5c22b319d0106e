package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/postgres"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func openLocker(t *testing.T, dsn string, opts ...dlock.Option) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), dsn, opts...)
	if err != nil {
		t.Fatalf("dlock.Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func newPool(t *testing.T, dsn string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// advisoryLocks returns the advisory locks in pg_locks as "pid:granted" strings.
func advisoryLocks(t *testing.T, ctx context.Context, conn *pgx.Conn, k postgres.AdvisoryKey) []string {
	t.Helper()
	classid, objid, objsubid := k.PgLocks()
	rows, err := conn.Query(ctx, `SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory'
		AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = $3 ORDER BY pid`,
		int64(classid), int64(objid), objsubid)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var pid int
		var granted bool
		if err := rows.Scan(&pid, &granted); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d:%v", pid, granted))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestServerRestartWhileHeld: a restart ends every session, so every lease's
// Done closes (at once: the idle watcher sees the connection end); tokens
// after the restart are higher than before (the counter is durable, even
// across SIGKILL).
func TestServerRestartWhileHeld(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "fast shutdown", true: "SIGKILL"}[kill], func(t *testing.T) {
			srv := testenv.StartPostgres(t)
			ctx := testCtx(t)
			a, b := openLocker(t, srv.URL()), openLocker(t, srv.URL())
			keys := []string{"restart/1", "restart/2", "restart/3"}
			var leases []*dlock.Lease
			before := map[string]dlock.Token{}
			for i, k := range keys {
				l := []dlock.Locker{a, b}[i%2]
				lease, err := l.Acquire(ctx, k, dlock.WithTTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, lease)
				before[k] = lease.Token()
			}
			if kill {
				srv.Kill()
			}
			srv.Restart()
			for _, lease := range leases {
				select {
				case <-lease.Done():
				case <-time.After(10 * time.Second):
					t.Fatalf("lease %q: Done not closed 10s after the restart (TTL 1m)", lease.Key())
				}
				if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
					t.Fatalf("lease %q: Err() = %v, want ErrLeaseLost", lease.Key(), lease.Err())
				}
			}
			for i, k := range keys {
				l := []dlock.Locker{b, a}[i%2]
				lease, err := l.TryAcquire(ctx, k)
				if err != nil {
					t.Fatalf("TryAcquire(%q) after the restart: %v", k, err)
				}
				if lease.Token() <= before[k] {
					t.Errorf("key %q: token %d after the restart, %d before", k, lease.Token(), before[k])
				}
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestLossIsPerSession: the end of a session ends the leases it holds, at
// once, and no other: leases of one Locker with one TTL share a session (and
// end together); a lease of another TTL is in another.
func TestLossIsPerSession(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	l := openLocker(t, srv.URL())
	victim, err := l.Acquire(ctx, "per-session/victim", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	sharer, err := l.Acquire(ctx, "per-session/sharer", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	bystander, err := l.Acquire(ctx, "per-session/bystander", dlock.WithTTL(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	pid := holderPID(t, srv, postgres.Options{}.AdvisoryKey(victim.Key()))
	if other := holderPID(t, srv, postgres.Options{}.AdvisoryKey(sharer.Key())); other != pid {
		t.Fatalf("two leases of one TTL are held by sessions %d and %d, want one", pid, other)
	}
	srv.TerminateBackend(t, pid)
	for _, lease := range []*dlock.Lease{victim, sharer} {
		select {
		case <-lease.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("lease %q, whose session was terminated, is still held (TTL 1m)", lease.Key())
		}
		if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("lease %q: Err() = %v, want ErrLeaseLost", lease.Key(), lease.Err())
		}
	}
	if err := bystander.Refresh(ctx); err != nil {
		t.Fatalf("the lease of another session: %v", err)
	}
	if err := bystander.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSilentClientLosesLock: a client that stops pinging — the driver used
// directly, with no keepalive — loses the lock on the server after about a
// TTL, and not before; the next holder's token is higher, and the silent
// client hears of its loss (OnLost) when the server ends its session.
func TestSilentClientLosesLock(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	silent, err := postgres.NewDriver(ctx, newPool(t, srv.URL(), nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	const ttl = time.Second
	start := time.Now()
	lost := make(chan error, 1)
	g, err := silent.Acquire(ctx, backend.AcquireRequest{Key: "silent", Owner: backend.NewOwnerID(), TTL: ttl, Wait: true,
		OnLost: func(err error) { lost <- err }})
	if err != nil {
		t.Fatal(err)
	}
	deadline := g.Start.Add(g.Validity)

	next := openLocker(t, srv.URL())
	lease, err := next.Acquire(ctx, "silent")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	granted := time.Now()
	if granted.Before(deadline) {
		t.Fatalf("granted %v before the silent holder's deadline", deadline.Sub(granted))
	}
	if late := granted.Sub(start); late > ttl+3*time.Second {
		t.Errorf("granted %v after the silent holder's acquire (TTL %v)", late, ttl)
	} else {
		t.Logf("granted %v after the silent holder's acquire (TTL %v)", late, ttl)
	}
	if lease.Token() <= dlock.Token(g.Token) {
		t.Fatalf("next token %d, silent holder's %d", lease.Token(), g.Token)
	}
	select {
	case err := <-lost:
		t.Logf("the silent holder was told: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the silent holder was not told of its loss (OnLost) 5s after its session was ended")
	}
	if _, err := silent.Refresh(ctx, g, ttl); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Refresh after the session ended: %v, want ErrNotHeld", err)
	}
	if err := silent.Release(ctx, g); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release after the session ended: %v, want ErrNotHeld", err)
	}
}

// TestCancelLeavesNoLock: a cancelled Acquire leaves nothing in pg_locks —
// neither a waiting entry nor, when the grant races the cancellation, a held
// lock.
func TestCancelLeavesNoLock(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	admin := connect(t, ctx, srv)
	defer admin.Close(ctx)
	holder, waiter := openLocker(t, srv.URL()), openLocker(t, srv.URL())
	const key = "cancel"
	k := postgres.Options{}.AdvisoryKey(key)

	lease, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	holderLocks := advisoryLocks(t, ctx, admin, k)
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = waiter.Acquire(wctx, key)
	cancel()
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	if got := advisoryLocks(t, ctx, admin, k); strings.Join(got, ",") != strings.Join(holderLocks, ",") {
		t.Fatalf("pg_locks after the cancelled Acquire returned: %v, want only the holder's %v", got, holderLocks)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Races: the holder releases about when the waiter's ctx ends.
	raced := 0
	for i := range 30 {
		lease, err := holder.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		delay := 20*time.Millisecond + time.Duration(i%6)*time.Millisecond
		wctx, cancel := context.WithTimeout(ctx, delay)
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(delay - 3*time.Millisecond + time.Duration(i%7)*time.Millisecond)
			if err := lease.Release(ctx); err != nil {
				t.Error(err)
			}
		})
		got, err := waiter.Acquire(wctx, key)
		cancel()
		if err == nil {
			raced++
			if err := got.Release(ctx); err != nil {
				t.Fatal(err)
			}
		} else if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("round %d: %v", i, err)
		}
		wg.Wait()
		if locks := advisoryLocks(t, ctx, admin, k); len(locks) != 0 {
			t.Fatalf("round %d: pg_locks after both returned: %v", i, locks)
		}
	}
	t.Logf("30 rounds, %d granted before the deadline", raced)
}

// TestTimeoutsAndIsolation: the acquire works whatever the session defaults
// say — in a caller's pool and in the driver's own (DSN parameters): a short
// lock_timeout or statement_timeout does not cut a wait short, and a
// SERIALIZABLE default isolation does not break the counter update, whose
// snapshot predates the lock wait.
func TestTimeoutsAndIsolation(t *testing.T) {
	srv := testenv.StartPostgres(t)
	hostile := map[string]string{
		"lock_timeout":                  "50ms",
		"statement_timeout":             "100ms",
		"default_transaction_isolation": "serializable",
		"synchronous_commit":            "off",
	}
	t.Run("caller's pool", func(t *testing.T) {
		ctx := testCtx(t)
		contend(t, ctx, func() dlock.Locker {
			pool := newPool(t, srv.URL(), func(cfg *pgxpool.Config) {
				for k, v := range hostile {
					cfg.ConnConfig.RuntimeParams[k] = v
				}
			})
			l, err := postgres.New(ctx, pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l
		})
	})
	t.Run("DSN", func(t *testing.T) {
		dsn := srv.URL()
		for k, v := range hostile {
			dsn += "&" + k + "=" + v
		}
		contend(t, testCtx(t), func() dlock.Locker { return openLocker(t, dsn) })
	})
}

// contend has two lockers wait for a third's lock past every short timeout,
// and checks their tokens.
func contend(t *testing.T, ctx context.Context, newLocker func() dlock.Locker) {
	lockers := []dlock.Locker{newLocker(), newLocker(), newLocker()}
	first, err := lockers[0].Acquire(ctx, "hostile")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	tokens := make(chan dlock.Token, 2)
	for _, l := range lockers[1:] {
		wg.Go(func() {
			lease, err := l.Acquire(ctx, "hostile")
			if err != nil {
				t.Error(err)
				return
			}
			tokens <- lease.Token()
			time.Sleep(150 * time.Millisecond) // the other waiter outlasts every timeout
			if err := lease.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // the waiters outlast lock_timeout and statement_timeout
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(tokens)
	for tok := range tokens {
		if tok <= first.Token() {
			t.Errorf("waiter's token %d is not above the first holder's %d", tok, first.Token())
		}
	}
}

// TestWaitedGrantValidity: a grant that waited in the server is valid for a
// TTL from the grant, not from the start of the wait.
func TestWaitedGrantValidity(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	a, b := openLocker(t, srv.URL()), openLocker(t, srv.URL())
	const ttl = 2 * time.Second
	held, err := a.Acquire(ctx, "waited")
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(1500*time.Millisecond, func() { _ = held.Release(ctx) })
	lease, err := b.Acquire(ctx, "waited", dlock.WithTTL(ttl), dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	if left := lease.Deadline().Sub(granted); left < ttl/2 {
		t.Fatalf("a grant after a 1.5s wait is valid for %v more (TTL %v): the wait was counted against it", left, ttl)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPoolHygiene: a connection goes back to a caller's pool only with its
// lock released (shared or exclusive) and its idle_session_timeout
// restored; TryAcquire on a held key does not cost a connection.
func TestPoolHygiene(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	pool := newPool(t, srv.URL(), func(c *pgxpool.Config) { c.MaxConns = 2 })
	l, err := postgres.New(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	other := openLocker(t, srv.URL())
	held, err := other.Acquire(ctx, "hygiene")
	if err != nil {
		t.Fatal(err)
	}
	// Every lease below has one TTL, so one shared session serves them all:
	// with two TTLs, a second session would pin the other connection until
	// its linger (shareLinger, 1s) ran out, and the second reader's
	// TryAcquire, which waits for a connection at most poolWait (1s too),
	// would race it (seen failing under load).
	ttl := dlock.WithTTL(3 * time.Second)
	for range 5 { // more than MaxConns: a failed attempt gives its connection back
		if _, err := l.TryAcquire(ctx, "hygiene", ttl); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a held key: %v", err)
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		lease, err := l.Acquire(ctx, "hygiene/"+strconv.Itoa(i), ttl)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Two shared leases of one key: one in the shared session, one on a
	// connection of its own; both unlocked in their mode on release.
	var readers []*dlock.Lease
	for range 2 {
		r, err := l.TryAcquire(ctx, "hygiene/shared", mode.WithShared(), ttl)
		if err != nil {
			t.Fatalf("shared TryAcquire: %v", err)
		}
		if err := r.Refresh(ctx); err != nil {
			t.Fatalf("Refresh of a shared lease: %v", err)
		}
		readers = append(readers, r)
	}
	for _, r := range readers {
		if err := r.Release(ctx); err != nil {
			t.Fatalf("Release of a shared lease: %v", err)
		}
	}
	for range 2 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		var timeout string
		var locks int
		if err := c.QueryRow(ctx, `SELECT current_setting('idle_session_timeout'),
			(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())`).Scan(&timeout, &locks); err != nil {
			t.Fatal(err)
		}
		if timeout != "0" || locks != 0 {
			t.Fatalf("pooled connection after leases: idle_session_timeout = %s, %d advisory locks", timeout, locks)
		}
	}
}

// TestKeyForms: HashKey matches its SQL definition, and the two-int4 form is
// what the server sees with a class id.
func TestKeyForms(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	admin := connect(t, ctx, srv)
	defer admin.Close(ctx)
	for _, c := range [][2]string{{"dlock", "jobs/nightly"}, {"", "k"}, {"ns", "ключ 🔒"}, {"x", strings.Repeat("k", 1024)}} {
		var got int64
		if err := admin.QueryRow(ctx, `SELECT ('x' || encode(substr(sha256(convert_to($1, 'UTF8') || '\x00'::bytea
			|| convert_to($2, 'UTF8')), 1, 8), 'hex'))::bit(64)::bigint`, c[0], c[1]).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := postgres.HashKey(c[0], c[1]); got != want {
			t.Errorf("SQL hash of %.20q = %d, HashKey = %d", c, got, want)
		}
	}

	l := openLocker(t, srv.URL()+"&classid=4242&namespace=app1")
	lease, err := l.Acquire(ctx, "pair")
	if err != nil {
		t.Fatal(err)
	}
	k := postgres.Options{Int4Pair: true, ClassID: 4242, Namespace: "app1"}.AdvisoryKey("pair")
	if got := advisoryLocks(t, ctx, admin, k); len(got) != 1 {
		t.Fatalf("pg_locks for %+v: %v", k, got)
	}
	// Another namespace is another lock.
	other, err := openLocker(t, srv.URL()+"&classid=4242&namespace=app2").TryAcquire(ctx, "pair")
	if err != nil {
		t.Fatalf("same key, other namespace: %v", err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFenceTable: the driver creates its table on first use, in the schema
// and under the name given, and tokens are the table's counter.
func TestFenceTable(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	admin := connect(t, ctx, srv)
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE SCHEMA locks`); err != nil {
		t.Fatal(err)
	}
	// Several lockers opening at once all find or create the table.
	var wg sync.WaitGroup
	lockers := make([]dlock.Locker, 4)
	for i := range lockers {
		wg.Go(func() { lockers[i] = openLocker(t, srv.URL()+"&table=locks.My_Fence") })
	}
	wg.Wait()
	lease, err := lockers[0].Acquire(ctx, "fenced")
	if err != nil {
		t.Fatal(err)
	}
	var token int64
	if err := admin.QueryRow(ctx, `SELECT token FROM locks."My_Fence" WHERE key = 'fenced'`).Scan(&token); err != nil {
		t.Fatal(err)
	}
	if dlock.Token(token) != lease.Token() {
		t.Fatalf("table token %d, lease token %d", token, lease.Token())
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Without its table the driver cannot fence: the acquire fails, and the
	// lock it took in the failed statement is released before it returns.
	if _, err := admin.Exec(ctx, `DROP TABLE locks."My_Fence"`); err != nil {
		t.Fatal(err)
	}
	if _, err := lockers[1].TryAcquire(ctx, "fenced"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("TryAcquire without the fence table: %v", err)
	}
	if got := advisoryLocks(t, ctx, admin, postgres.Options{}.AdvisoryKey("fenced")); len(got) != 0 {
		t.Fatalf("pg_locks after the failed acquire: %v", got)
	}
}

func TestOpenErrors(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	port := testenv.FreePort(t)
	for _, tc := range []struct {
		dsn, want string
	}{
		{srv.URL() + "&tll=10s", `"tll"`},
		{srv.URL() + "&classid=x", "classid"},
		{srv.URL() + "&table=a.b.c", "table"},
		{srv.URL() + "&namespace=a%00b", "namespace"},
		{"postgres://app:s3cret@127.0.0.1:" + strconv.Itoa(port) + "/db?sslmode=disable&connect_timeout=2", "connect"},
		{"postgresql://app:s3cret@127.0.0.1:" + strconv.Itoa(port) + "/db?sslmode=bogus", "sslmode"},
		{"postgres://app:s3cret@127.0.0.1:" + strconv.Itoa(port) + "/db?pool_max_conns=zero", "pool_max_conns"},
		{strings.Replace(srv.URL(), "postgres@", "nobody:s3cret@", 1), "nobody"},
	} {
		l, err := dlock.Open(ctx, tc.dsn)
		if err == nil {
			l.Close()
			t.Errorf("Open(%q) succeeded", tc.dsn)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%q): error leaks the password: %v", tc.dsn, err)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want it to mention %s", tc.dsn, err, tc.want)
		}
	}
	if _, err := postgres.NewDriver(ctx, nil, nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("NewDriver(nil pool): %v", err)
	}
}

// TestPgBouncer: behind PgBouncer in transaction or statement pooling mode
// the driver refuses to open; in session mode it works.
func TestPgBouncer(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	for _, mode := range []string{"transaction", "statement"} {
		t.Run(mode, func(t *testing.T) {
			bouncer := testenv.StartPgBouncer(t, srv, mode)
			l, err := dlock.Open(ctx, bouncer.URL())
			if err == nil {
				l.Close()
				t.Fatal("Open through a transaction-pooling PgBouncer succeeded")
			}
			if !errors.Is(err, postgres.ErrTransactionPooling) {
				t.Fatalf("Open: %v, want ErrTransactionPooling", err)
			}
			t.Log(err)
		})
	}
	t.Run("session", func(t *testing.T) {
		bouncer := testenv.StartPgBouncer(t, srv, "session")
		a, b := openLocker(t, bouncer.URL()), openLocker(t, bouncer.URL())
		lease, err := a.Acquire(ctx, "bouncer", dlock.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.TryAcquire(ctx, "bouncer"); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a held key: %v", err)
		}
		time.Sleep(1500 * time.Millisecond) // the keepalive pings through the bouncer
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		next, err := b.TryAcquire(ctx, "bouncer")
		if err != nil {
			t.Fatal(err)
		}
		if next.Token() <= lease.Token() {
			t.Fatalf("token %d after %d", next.Token(), lease.Token())
		}
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}

		// Shared locks through the bouncer: two readers share, a writer is
		// refused.
		if !a.Capabilities().Shared {
			t.Fatal("Capabilities().Shared is false through a session-pooling PgBouncer")
		}
		ra, err := a.TryAcquire(ctx, "bouncer/shared", mode.WithShared())
		if err != nil {
			t.Fatal(err)
		}
		rb, err := b.TryAcquire(ctx, "bouncer/shared", mode.WithShared())
		if err != nil {
			t.Fatalf("second shared TryAcquire through the bouncer: %v", err)
		}
		if _, err := a.TryAcquire(ctx, "bouncer/shared"); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("exclusive TryAcquire of a key held shared: %v", err)
		}
		for _, r := range []*dlock.Lease{ra, rb} {
			if err := r.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestRelabelSharedSession: a lease's label is its session's
// application_name, so a lease that shares its session with another is not
// relabelled (ErrLabelShared, both labels unchanged); alone in it, it is, and
// a later lease with the old label gets a session of its own.
func TestRelabelSharedSession(t *testing.T) {
	srv := testenv.StartPostgres(t)
	l := openLocker(t, srv.URL())
	viewer := openLocker(t, srv.URL())
	ctx := testCtx(t)
	label := func(key string) string {
		t.Helper()
		info, err := dlock.Inspect(ctx, viewer, key)
		if err != nil {
			t.Fatal(err)
		}
		return info.Label
	}
	a, err := l.Acquire(ctx, "relabel/a", dlock.WithLabel("x"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctx, "relabel/b", dlock.WithLabel("x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetLabel(ctx, "y"); !errors.Is(err, postgres.ErrLabelShared) {
		t.Fatalf("SetLabel of a lease sharing its session: %v, want ErrLabelShared", err)
	}
	if la, lb := label("relabel/a"), label("relabel/b"); la != "x" || lb != "x" {
		t.Fatalf("after a refused SetLabel: labels %q and %q, want x and x", la, lb)
	}
	if a.Err() != nil {
		t.Fatalf("a refused SetLabel ended the lease: %v", a.Err())
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.SetLabel(ctx, "y"); err != nil {
		t.Fatalf("SetLabel of a lease alone in its session: %v", err)
	}
	c, err := l.Acquire(ctx, "relabel/c", dlock.WithLabel("x"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := l.Acquire(ctx, "relabel/d", dlock.WithLabel("y"))
	if err != nil {
		t.Fatal(err)
	}
	if la, lc, ld := label("relabel/a"), label("relabel/c"), label("relabel/d"); la != "y" || lc != "x" || ld != "y" {
		t.Fatalf("labels a=%q c=%q d=%q, want y, x, y", la, lc, ld)
	}
	for _, lease := range []*dlock.Lease{a, c, d} {
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWaitedGrantPingsOnlyAfterALongWait: a waiting Acquire's validity counts
// from when its blocking statement was sent (the server's idle timer starts
// later, when the statement ends). After a wait shorter than a quarter of
// the TTL the grant is returned as it is, with no ping: its deadline is less
// than the holder's release plus the validity, since the statement was sent
// before. After a longer wait a ping restarts the clock, once the lock is
// this session's: the deadline is at least the release plus the validity.
func TestWaitedGrantPingsOnlyAfterALongWait(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	holder, waiter := openLocker(t, srv.URL()), openLocker(t, srv.URL())
	for _, c := range []struct {
		name string
		ttl  time.Duration // the waiter's
		wait time.Duration // how long the holder keeps the lock once the waiter waits
		ping bool
	}{
		{"short", 10 * time.Second, 500 * time.Millisecond, false},
		{"long", 2 * time.Second, time.Second, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := "waited/" + c.name
			held, err := holder.Acquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *dlock.Lease, 1)
			go func() { // owned by the test: ends with the waiter's Acquire
				l, err := waiter.Acquire(ctx, key, dlock.WithTTL(c.ttl))
				if err != nil {
					t.Error(err)
				}
				got <- l
			}()
			deadline := time.Now().Add(10 * time.Second)
			for waiters(t, srv, key) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the waiter is not waiting in the server after 10s")
				}
				time.Sleep(5 * time.Millisecond) // polling pg_locks: no signal exists
			}
			time.Sleep(c.wait) // the wait being measured, not a synchronisation
			released := time.Now()
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			l := <-got
			if l == nil {
				t.FailNow()
			}
			defer l.Release(ctx)
			validity := c.ttl - backend.DriftAllowance(c.ttl)
			pinged := !l.Deadline().Before(released.Add(validity))
			if pinged != c.ping {
				t.Errorf("TTL %v, waited ≥ %v: deadline %v after the release, validity %v: pinged = %v, want %v",
					c.ttl, c.wait, l.Deadline().Sub(released), validity, pinged, c.ping)
			}
		})
	}
}

// TestReleaseRestoresApplicationName: a lease's label is its session's
// application_name while it holds the lock; once it has let go, the
// connection goes back to the driver's pool with the application_name it
// started with (the DSN's), whether the lease waited on a connection of its
// own or was held by the shared session.
func TestReleaseRestoresApplicationName(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	l := openLocker(t, srv.URL()+"&application_name=restored-app")
	other := openLocker(t, srv.URL()+"&application_name=other-app", dlock.WithLabel("other-holder"))
	admin := connect(t, ctx, srv)
	defer admin.Close(ctx)
	// names lists the application_names of the client sessions but admin's.
	names := func() []string {
		rows, err := admin.Query(ctx, `SELECT application_name FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	// A lease that waited holds its own connection, and its release resets it.
	held, err := other.Acquire(ctx, "appname/waited")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() { // owned by the test: ends with the Acquire
		lease, err := l.Acquire(ctx, "appname/waited", dlock.WithLabel("waiter-label"))
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	deadline := time.Now().Add(10 * time.Second)
	for waiters(t, srv, "appname/waited") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter is not waiting in the server after 10s")
		}
		time.Sleep(5 * time.Millisecond) // polling pg_locks: no signal exists
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waited := <-got
	if waited == nil {
		t.FailNow()
	}
	if n := names(); !slices.Contains(n, "waiter-label") {
		t.Fatalf("while the waiter holds the lock, sessions are named %q, want one named waiter-label", n)
	}
	if err := waited.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A session that just closed (waiters' queries) can still be listed, with
	// no name, for a moment: what is checked is what lasts.
	settled := func(what string, ok func([]string) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for n := names(); !ok(n); n = names() {
			if time.Now().After(deadline) {
				t.Fatalf("10s after %s, sessions are named %q", what, n)
			}
			time.Sleep(20 * time.Millisecond) // polling pg_stat_activity: no signal exists
		}
	}
	settled("the waiter's release (want none named waiter-label or unnamed)", func(n []string) bool {
		return !slices.Contains(n, "waiter-label") && !slices.Contains(n, "")
	})

	// A lease of the shared session: its session is reset when it retires,
	// shareLinger after its last release.
	lease, err := l.TryAcquire(ctx, "appname/shared", dlock.WithLabel("shared-label"))
	if err != nil {
		t.Fatal(err)
	}
	if n := names(); !slices.Contains(n, "shared-label") {
		t.Fatalf("while the shared session holds the lock, sessions are named %q, want one named shared-label", n)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	settled("the shared lease's release (want none named shared-label or unnamed, and restored-app)", func(n []string) bool {
		return !slices.Contains(n, "shared-label") && !slices.Contains(n, "") && slices.Contains(n, "restored-app")
	})
}
