package postgres_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/postgres"
)

// TestSequenceTokensSurviveCrash: with tokens=sequence, a burst of grants
// and then a crash — of one backend (the postmaster reinitializes shared
// memory and replays the WAL, without a restart) or of the whole server —
// loses the sequence's unflushed WAL, and the sequence may go back; the
// first grant after recovery must still get a token above every token
// granted before.
func TestSequenceTokensSurviveCrash(t *testing.T) {
	for _, crash := range []string{"backend", "server"} {
		t.Run(crash, func(t *testing.T) {
			// The WAL writer writes at most every 10s: the burst's
			// sequence records are still in the server's memory when it
			// crashes, and the sequence goes back in recovery.
			srv := testenv.StartPostgres(t, testenv.WithPostgresSetting("wal_writer_delay", "10000"))
			dsn := srv.URL() + "&tokens=sequence"
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			l, err := dlock.Open(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			var highest dlock.Token
			for range 2000 {
				lease, err := l.TryAcquire(ctx, "burst")
				if err != nil {
					t.Fatal(err)
				}
				highest = max(highest, lease.Token())
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			switch crash {
			case "backend":
				conn, watch := connect(t, ctx, srv), connect(t, ctx, srv)
				var pid int
				if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					t.Fatal(err)
				}
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				_ = conn.Close(context.Background())
				// The postmaster ends every other session, then recovers:
				// wait for it to have ended watch's.
				for watch.Ping(ctx) == nil {
					time.Sleep(10 * time.Millisecond) // the postmaster tells no client
				}
				_ = watch.Close(context.Background())
			case "server":
				srv.Kill()
				srv.Restart()
			}
			lease := grantAfterRecovery(t, ctx, l, "burst")
			defer lease.Release(ctx)
			t.Logf("highest token before the crash %d (epoch %d, sequence %d); first after %d (epoch %d, sequence %d)",
				highest, highest>>44, highest&(1<<44-1), lease.Token(), lease.Token()>>44, lease.Token()&(1<<44-1))
			if lease.Token() <= highest {
				t.Fatalf("first token after the crash %d ≤ the highest before %d", lease.Token(), highest)
			}
			// Whether or not the sequence went back this time, the crash
			// emptied the markers, so the epoch was bumped: what keeps
			// tokens increasing when it does go back.
			if lease.Token()>>44 <= highest>>44 {
				t.Fatalf("epoch after the crash %d, want above %d: a marker outlived the crash", lease.Token()>>44, highest>>44)
			}
		})
	}
}

// TestSequenceEpochBumpSurvivesACrash: the first grant after a crash (or on
// a new database) bumps the epoch, and the server crashes again at once,
// three times. Grants commit with synchronous_commit off, and the WAL writer
// writes at most every 10s: only the bump's own commit, at least local,
// brings it through the next crash. TestSequenceTokensSurviveCrash does not
// show that: its burst of grants fills WAL pages, which the WAL writer then
// writes anyway. (A bump committed with synchronous_commit off fails here at
// the first crash, the token equal to the one before.)
func TestSequenceEpochBumpSurvivesACrash(t *testing.T) {
	srv := testenv.StartPostgres(t, testenv.WithPostgresSetting("wal_writer_delay", "10000"))
	ctx := testCtx(t)
	l := openLocker(t, srv.URL()+"&tokens=sequence")
	grant := func() dlock.Token {
		t.Helper()
		lease := grantAfterRecovery(t, ctx, l, "bump")
		defer lease.Release(ctx)
		return lease.Token()
	}
	prev := grant()
	for i := range 3 {
		srv.Kill()
		srv.Restart()
		tok := grant()
		t.Logf("crash %d: token before %d (epoch %d), first after %d (epoch %d)", i+1, prev, prev>>44, tok, tok>>44)
		if tok>>44 <= prev>>44 || tok <= prev {
			t.Fatalf("crash %d: first token after it %d (epoch %d), the last before %d (epoch %d): the epoch bump was lost",
				i+1, tok, tok>>44, prev, prev>>44)
		}
		prev = tok
	}
}

// TestSequenceObjectsSurviveACrashAtOpen: the objects sequence mode creates
// when a driver opens survive a crash that comes before any grant, although
// the driver's sessions commit with synchronous_commit off (the WAL writer
// is slowed to every 10s, so nothing else writes them out first). A lost
// object would fail every grant until the driver is opened again.
func TestSequenceObjectsSurviveACrashAtOpen(t *testing.T) {
	srv := testenv.StartPostgres(t, testenv.WithPostgresSetting("wal_writer_delay", "10000"))
	ctx := testCtx(t)
	l := openLocker(t, srv.URL()+"&tokens=sequence")
	srv.Kill()
	srv.Restart()
	lease := grantAfterRecovery(t, ctx, l, "after")
	defer lease.Release(ctx)
	if lease.Token()>>44 == 0 {
		t.Fatalf("token %d: want a sequence-mode token (epoch above 0)", lease.Token())
	}
}

// grantAfterRecovery takes key with l, trying again until the server has
// finished its crash recovery (it announces the end to no client) or ctx
// ends.
func grantAfterRecovery(t *testing.T, ctx context.Context, l dlock.Locker, key string) *dlock.Lease {
	t.Helper()
	for {
		lease, err := l.TryAcquire(ctx, key)
		if err == nil {
			return lease
		}
		if ctx.Err() != nil {
			t.Fatalf("TryAcquire after the crash: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // recovery announces its end to no one
	}
}

// TestTokenModesDoNotMix: a counter-mode client refuses a database that
// sequence mode has used (its tokens would go backwards), with an error that
// says what to do; an unknown mode is refused.
func TestTokenModesDoNotMix(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	seq, err := dlock.Open(ctx, srv.URL()+"&tokens=sequence")
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	if _, err := dlock.Open(ctx, srv.URL()); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("counter mode on a database sequence mode used: %v, want ErrInvalidOption", err)
	}
	if _, err := dlock.Open(ctx, srv.URL()+"&tokens=clock"); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("tokens=clock: %v, want ErrInvalidOption", err)
	}
	if got := seq.Capabilities().Fencing; got != dlock.FencingStrict {
		t.Errorf("sequence mode claims %v fencing, want strict", got)
	}
}

// TestSequenceEpochOutrunsARegressedSequence: what crash recovery can do to
// the sequence mode's objects — empty the unlogged marker table, reset the
// unlogged marker sequence, and send the sequence back (values handed out
// under a WAL record that was lost) — is done here by hand; the next grant,
// in a new session (a crash ends them all: here, a new Locker), must still
// get a higher token, from a new epoch.
func TestSequenceEpochOutrunsARegressedSequence(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	l, err := dlock.Open(ctx, srv.URL()+"&tokens=sequence")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var before dlock.Token
	for range 100 {
		lease, err := l.TryAcquire(ctx, "regress")
		if err != nil {
			t.Fatal(err)
		}
		before = lease.Token()
		_ = lease.Release(ctx)
	}
	conn := connect(t, ctx, srv)
	defer conn.Close(ctx)
	for _, stmt := range []string{
		"DELETE FROM dlock_fence_live",
		"ALTER SEQUENCE dlock_fence_mark RESTART", // "never called", as after a crash
		"ALTER SEQUENCE dlock_fence_seq RESTART WITH 1",
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	l, err = dlock.Open(ctx, srv.URL()+"&tokens=sequence")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, "regress")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	t.Logf("before: %d (epoch %d); after the markers were emptied and the sequence sent back: %d (epoch %d)",
		before, before>>44, lease.Token(), lease.Token()>>44)
	if lease.Token() <= before {
		t.Fatalf("token after the sequence went back %d ≤ %d before", lease.Token(), before)
	}
}

// TestSequenceMarkCopiesTheTable: on PostgreSQL 15 and later a grant reads
// the epoch in use from the unlogged marker sequence, a copy of the marker
// table. A grant that finds the copy reset but the table marked (the copy
// was not made, or an earlier driver version, which reads the table, marked
// it first) takes the table's epoch and makes the copy, without bumping the
// epoch; so does the first grant on a database whose sequence-mode objects
// an earlier version created. Each grant is the first of a new Locker: a
// session's later grants keep the epoch of its first (the marker changes
// only in crash recovery or a promotion, which end every session).
func TestSequenceMarkCopiesTheTable(t *testing.T) {
	srv, conn := withUnloggedSequences(t)
	ctx := context.Background()
	grant := func() dlock.Token {
		t.Helper()
		l, err := dlock.Open(ctx, srv.URL()+"&tokens=sequence")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		lease, err := l.TryAcquire(ctx, "mark")
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
		return lease.Token()
	}
	mark := func() *int64 {
		t.Helper()
		var epoch *int64
		if err := conn.QueryRow(ctx, "SELECT pg_sequence_last_value('dlock_fence_mark')").Scan(&epoch); err != nil {
			t.Fatal(err)
		}
		return epoch
	}
	first := grant()
	if m := mark(); m == nil || *m != int64(first>>44) {
		t.Fatalf("marker sequence after the first grant: %v, want the token's epoch %d", m, first>>44)
	}
	// The table names another epoch than the copy: a grant that reads the
	// copy keeps the copy's.
	if _, err := conn.Exec(ctx, "UPDATE dlock_fence_live SET epoch = epoch + 5"); err != nil {
		t.Fatal(err)
	}
	if got := grant(); got>>44 != first>>44 {
		t.Fatalf("grant with the copy in place: epoch %d, want the copy's %d", got>>44, first>>44)
	}
	// The copy reset, the table marked: its epoch, copied, and no bump.
	if _, err := conn.Exec(ctx, "ALTER SEQUENCE dlock_fence_mark RESTART"); err != nil {
		t.Fatal(err)
	}
	want := first>>44 + 5
	if got := grant(); got>>44 != want {
		t.Fatalf("grant with the copy reset: epoch %d, want the table's %d", got>>44, want)
	}
	if m := mark(); m == nil || *m != int64(want) {
		t.Fatalf("marker sequence after that grant: %v, want %d", m, want)
	}
	var durable int64
	if err := conn.QueryRow(ctx, "SELECT epoch FROM dlock_fence_epoch").Scan(&durable); err != nil {
		t.Fatal(err)
	}
	if durable != int64(first>>44) {
		t.Fatalf("durable epoch %d after the copy was made again, want %d (no bump)", durable, first>>44)
	}
}

// TestSequenceMarkMustBeUnlogged: a marker sequence that a crash would not
// reset (made LOGGED by hand) is refused when the driver opens, with an
// error that says what to do.
func TestSequenceMarkMustBeUnlogged(t *testing.T) {
	srv, conn := withUnloggedSequences(t)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "CREATE SEQUENCE dlock_fence_mark"); err != nil {
		t.Fatal(err)
	}
	l, err := dlock.Open(ctx, srv.URL()+"&tokens=sequence")
	if err == nil {
		l.Close()
		t.Fatal("opened with a LOGGED marker sequence")
	}
	if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), "UNLOGGED") {
		t.Fatalf("open with a LOGGED marker sequence: %v, want ErrInvalidOption naming UNLOGGED", err)
	}
	if _, err := conn.Exec(ctx, "DROP SEQUENCE dlock_fence_mark"); err != nil {
		t.Fatal(err)
	}
	l, err = dlock.Open(ctx, srv.URL()+"&tokens=sequence")
	if err != nil {
		t.Fatalf("open once it was dropped: %v", err)
	}
	l.Close()
}

// withUnloggedSequences starts a server and connects to it, or skips t on a
// server before PostgreSQL 15, whose grants read the marker table (no
// unlogged sequences); t's cleanup closes the connection.
func withUnloggedSequences(t *testing.T) (*testenv.Postgres, *pgx.Conn) {
	t.Helper()
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	conn := connect(t, ctx, srv)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 150000 {
		t.Skipf("PostgreSQL %d has no unlogged sequences: grants read the marker table", version)
	}
	return srv, conn
}

// TestSequenceGrantsDoNotWaitForWAL: a sequence-mode grant commits without
// waiting for the WAL to be flushed — nextval writes WAL once per 32 values,
// and the epoch, not the sequence, keeps tokens increasing across a crash
// (TestSequenceTokensSurviveCrash) — in the driver's own pool and in a
// caller's pool whose sessions commit synchronously. Counter mode, the
// control, flushes the WAL at every grant. Counted in pg_stat_wal, which a
// backend adds its figures to when it exits: each locker is closed, and its
// sessions gone, before the count is read.
func TestSequenceGrantsDoNotWaitForWAL(t *testing.T) {
	// fsync on, or the server counts no WAL syncs; the WAL writer idle, so
	// that no sync but a commit's is counted.
	srv := testenv.StartPostgres(t, testenv.WithPostgresSetting("fsync", "on"),
		testenv.WithPostgresSetting("wal_writer_delay", "10000"))
	ctx := testCtx(t)
	admin := connect(t, ctx, srv)
	syncs := func() int64 {
		t.Helper()
		for { // until every other session has exited, and reported its WAL figures
			var others int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&others); err != nil {
				t.Fatal(err)
			}
			if others == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond) // the server signals no session's exit
		}
		var n int64
		if err := admin.QueryRow(ctx, "SELECT wal_sync FROM pg_stat_wal").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// grants opens a locker with open, makes n grants of one key, closes it
	// and returns the WAL syncs they cost.
	grants := func(n int, open func() (dlock.Locker, error)) int64 {
		t.Helper()
		before := syncs()
		l, err := open()
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			lease, err := l.TryAcquire(ctx, "wal")
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return syncs() - before
	}
	sequenceDSN := srv.URL() + "&tokens=sequence&table=wal_seq_fence"
	for _, tc := range []struct {
		name     string
		n        int
		open     func() (dlock.Locker, error)
		min, max int64 // WAL syncs expected
	}{
		{"counter mode (the control)", 64, func() (dlock.Locker, error) {
			return dlock.Open(ctx, srv.URL()+"&table=wal_counter_fence")
		}, 64, 64 + 4},
		{"sequence mode, own pool", 640, func() (dlock.Locker, error) {
			return dlock.Open(ctx, sequenceDSN)
		}, 0, 4},
		{"sequence mode, caller's pool committing synchronously", 640, func() (dlock.Locker, error) {
			pool := newPool(t, srv.URL(), func(cfg *pgxpool.Config) {
				cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
			})
			l, err := postgres.New(ctx, pool, &postgres.Options{Tokens: postgres.TokensSequence, Table: "wal_seq_fence"})
			if err != nil {
				return nil, err // newPool's cleanup closes the pool
			}
			return closeAlso{l, pool.Close}, nil
		}, 0, 4},
	} {
		grants(1, tc.open) // uncounted: makes the token mode's objects and its epoch
		got := grants(tc.n, tc.open)
		t.Logf("%s: %d grants, %d WAL syncs", tc.name, tc.n, got)
		if got < tc.min || got > tc.max {
			t.Errorf("%s: %d grants cost %d WAL syncs, want %d to %d", tc.name, tc.n, got, tc.min, tc.max)
		}
	}
}

// closeAlso is a Locker whose Close also calls also (a pool to close).
type closeAlso struct {
	dlock.Locker
	also func()
}

func (c closeAlso) Close() error {
	err := c.Locker.Close()
	c.also()
	return err
}
