package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/postgres"
)

// waitWaiting waits until n sessions wait in the server for key's advisory
// lock.
func waitWaiting(t *testing.T, srv *testenv.Postgres, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for waiters(t, srv, key) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions do not wait for %q after 10s", n, key)
		}
		time.Sleep(5 * time.Millisecond) // polling pg_locks: no signal exists
	}
}

// rawTry runs pg_try_advisory_lock or pg_try_advisory_lock_shared (fn) for
// k on conn.
func rawTry(t *testing.T, ctx context.Context, conn *pgx.Conn, fn string, k postgres.AdvisoryKey) bool {
	t.Helper()
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT "+fn+"($1)", k.Int8).Scan(&ok); err != nil {
		t.Fatalf("%s: %v", fn, err)
	}
	return ok
}

// rawExec runs fn (pg_advisory_lock, pg_advisory_unlock_shared, ...) for k
// on conn.
func rawExec(t *testing.T, ctx context.Context, conn *pgx.Conn, fn string, k postgres.AdvisoryKey) {
	t.Helper()
	if _, err := conn.Exec(ctx, "SELECT "+fn+"($1)", k.Int8); err != nil {
		t.Fatalf("%s: %v", fn, err)
	}
}

// rawLockWaiting opens a connection and runs fn (pg_advisory_lock, say) for
// k on it in a goroutine, whose error the channel returns. The connection is
// the caller's once the channel has answered; the test's cleanup cancels the
// statement if it still runs, waits for the goroutine and closes the
// connection.
func rawLockWaiting(t *testing.T, ctx context.Context, srv *testenv.Postgres, fn string, k postgres.AdvisoryKey) (*pgx.Conn, <-chan error) {
	t.Helper()
	conn := connect(t, ctx, srv)
	qctx, cancel := context.WithCancel(ctx)
	res, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		_, err := conn.Exec(qctx, "SELECT "+fn+"($1)", k.Int8)
		res <- err
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	})
	return conn, res
}

func mustNotAcquire(t *testing.T, ctx context.Context, l dlock.Locker, key, what string, opts ...dlock.AcquireOption) {
	t.Helper()
	lease, err := l.TryAcquire(ctx, key, opts...)
	if err == nil {
		_ = lease.Release(context.Background())
		t.Fatalf("%s: TryAcquire succeeded", what)
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("%s: TryAcquire: %v, want ErrNotAcquired", what, err)
	}
}

// TestSharedInterop: dlock's shared and exclusive locks are PostgreSQL's own
// pg_advisory_lock_shared and pg_advisory_lock on the key's advisory lock,
// so raw SQL clients of the same key interoperate both ways. It also checks
// the server behaviour the driver's writer-first guarantee rests on: a
// pg_try_advisory_lock_shared from a new session fails while an exclusive
// request waits behind a shared holder.
func TestSharedInterop(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	l := openLocker(t, srv.URL())
	raw1, raw3 := connect(t, ctx, srv), connect(t, ctx, srv)
	defer raw1.Close(ctx)
	defer raw3.Close(ctx)
	const key = "interop/shared"
	k := postgres.Options{}.AdvisoryKey(key)

	// The server: a shared holder (raw1), an exclusive waiter (raw2); a new
	// shared request (raw3, then dlock's) is refused, not let in ahead.
	rawExec(t, ctx, raw1, "pg_advisory_lock_shared", k)
	raw2, waited := rawLockWaiting(t, ctx, srv, "pg_advisory_lock", k)
	waitWaiting(t, srv, key, 1)
	if rawTry(t, ctx, raw3, "pg_try_advisory_lock_shared", k) {
		t.Fatal("server: pg_try_advisory_lock_shared succeeded while pg_advisory_lock waits behind a shared holder")
	}
	mustNotAcquire(t, ctx, l, key, "shared, while a raw exclusive request waits behind a raw shared holder", mode.WithShared())
	rawExec(t, ctx, raw1, "pg_advisory_unlock_shared", k)
	if err := <-waited; err != nil {
		t.Fatalf("raw pg_advisory_lock: %v", err)
	}

	// A raw exclusive holder excludes dlock's shared request.
	mustNotAcquire(t, ctx, l, key, "shared, while a raw session holds the lock exclusively", mode.WithShared())
	rawExec(t, ctx, raw2, "pg_advisory_unlock", k)

	// A raw shared holder and dlock's shared holder coexist; neither a raw
	// exclusive request nor dlock's is granted meanwhile.
	rawExec(t, ctx, raw1, "pg_advisory_lock_shared", k)
	r, err := l.TryAcquire(ctx, key, mode.WithShared())
	if err != nil {
		t.Fatalf("dlock shared TryAcquire while a raw session holds the lock shared: %v", err)
	}
	if rawTry(t, ctx, raw2, "pg_try_advisory_lock", k) {
		t.Fatal("raw pg_try_advisory_lock succeeded while dlock and a raw session hold the lock shared")
	}
	mustNotAcquire(t, ctx, openLocker(t, srv.URL()), key, "exclusive, while held shared")
	info, err := dlock.Inspect(ctx, l, key)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Shared != 2 || info.Token != 0 {
		t.Errorf("Inspect with a raw and a dlock shared holder: Held %v, Shared %d, Token %v; want true, 2, 0", info.Held, info.Shared, info.Token)
	}
	rawExec(t, ctx, raw1, "pg_advisory_unlock_shared", k)

	// dlock's shared holder alone: a raw exclusive request is refused, a raw
	// shared one granted.
	if rawTry(t, ctx, raw2, "pg_try_advisory_lock", k) {
		t.Fatal("raw pg_try_advisory_lock succeeded while dlock holds the lock shared")
	}
	if !rawTry(t, ctx, raw2, "pg_try_advisory_lock_shared", k) {
		t.Fatal("raw pg_try_advisory_lock_shared refused while dlock holds the lock shared")
	}
	rawExec(t, ctx, raw2, "pg_advisory_unlock_shared", k)
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// dlock's exclusive holder excludes a raw shared request.
	w, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if w.Token() <= r.Token() {
		t.Errorf("exclusive token %v after shared %v", w.Token(), r.Token())
	}
	if rawTry(t, ctx, raw2, "pg_try_advisory_lock_shared", k) {
		t.Fatal("raw pg_try_advisory_lock_shared succeeded while dlock holds the lock exclusively")
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := advisoryLocks(t, ctx, raw3, k); len(got) != 0 {
		t.Fatalf("pg_locks at the end: %v", got)
	}
}

// TestSharedSameSession: a second shared lease of a key that the Locker's
// shared session holds shared is asked for on a connection of its own — so
// a TryAcquire of it succeeds while nobody waits, and is refused while an
// exclusive request waits (the shared session would have been granted it
// at once: PostgreSQL does not queue a session for a lock it holds). The
// lease on a connection of its own is refreshed and relabelled in its mode.
func TestSharedSameSession(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	l := openLocker(t, srv.URL())
	raw := connect(t, ctx, srv)
	defer raw.Close(ctx)
	const key = "same/shared"
	k := postgres.Options{}.AdvisoryKey(key)

	r1, err := l.TryAcquire(ctx, key, mode.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.TryAcquire(ctx, key, mode.WithShared()) // same TTL and label: same shared session
	if err != nil {
		t.Fatalf("a second shared TryAcquire of a key the Locker holds shared: %v", err)
	}
	if r2.Token() <= r1.Token() {
		t.Errorf("second shared token %v after %v", r2.Token(), r1.Token())
	}
	if got := advisoryLocks(t, ctx, raw, k); len(got) != 2 {
		t.Fatalf("pg_locks with two shared leases of one Locker: %v, want two sessions", got)
	}
	if err := r2.Refresh(ctx); err != nil {
		t.Fatalf("Refresh of the shared lease with a connection of its own: %v", err)
	}
	if err := r2.SetLabel(ctx, "relabelled"); err != nil {
		t.Fatalf("SetLabel of the shared lease with a connection of its own: %v", err)
	}
	if err := r2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r1.Refresh(ctx); err != nil {
		t.Fatal(err)
	}

	// An exclusive request waits behind r1: no further shared lease of the
	// same Locker gets in ahead of it, tried or waited for.
	other, waited := rawLockWaiting(t, ctx, srv, "pg_advisory_lock", k)
	waitWaiting(t, srv, key, 1)
	mustNotAcquire(t, ctx, l, key, "shared, same Locker, while an exclusive request waits", mode.WithShared())
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	lease, err := l.Acquire(wctx, key, mode.WithShared())
	cancel()
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatal("a waiting shared Acquire of the same Locker got in ahead of a waiting exclusive request")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting shared Acquire: %v, want DeadlineExceeded", err)
	}
	// Relabelled last: that moves r1's session out of the default label's.
	if err := r1.SetLabel(ctx, "alone"); err != nil {
		t.Fatalf("SetLabel of the shared lease alone in the shared session: %v", err)
	}
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("raw pg_advisory_lock: %v", err)
	}
	rawExec(t, ctx, other, "pg_advisory_unlock", k)
	if got := advisoryLocks(t, ctx, raw, k); len(got) != 0 {
		t.Fatalf("pg_locks at the end: %v", got)
	}
}

// TestSharedBreakAndAnnounce: Break of a key held shared ends every shared
// holder's session and reports how many held it; the next grant's token is
// above theirs. A shared grant acquired WithAnnounce is announced to Watch.
func TestSharedBreakAndAnnounce(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	a, b, viewer := openLocker(t, srv.URL()), openLocker(t, srv.URL()), openLocker(t, srv.URL())
	const key = "break/shared"

	changed := make(chan struct{}, 16)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := dlock.Watch(wctx, viewer, key, func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	ra, err := a.Acquire(ctx, key, mode.WithShared(), dlock.WithAnnounce())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("Watch was not told of a shared grant acquired WithAnnounce")
	}
	rb, err := b.Acquire(ctx, key, mode.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	info, err := dlock.Break(ctx, viewer, key)
	if err != nil {
		t.Fatalf("Break of a key held shared: %v", err)
	}
	if !info.Held || info.Shared != 2 {
		t.Errorf("Break reported Held %v, Shared %d; want true, 2", info.Held, info.Shared)
	}
	for _, r := range []*dlock.Lease{ra, rb} {
		select {
		case <-r.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a broken shared holder's lease did not end")
		}
	}
	w, err := viewer.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if w.Token() <= ra.Token() || w.Token() <= rb.Token() {
		t.Errorf("token %v after the broken shared holders' %v and %v", w.Token(), ra.Token(), rb.Token())
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Break returns once the broken holders' sessions have ended: the key is
// free at once, exclusive or shared (pg_terminate_backend alone returns
// when the signal is sent, before the session lets go of its locks).
func TestBreakFreesTheKeyAtOnce(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := testCtx(t)
	viewer, next := openLocker(t, srv.URL()), openLocker(t, srv.URL())
	for i := range 20 {
		holder := openLocker(t, srv.URL())
		key := fmt.Sprintf("break/at-once/%d", i)
		var opts []dlock.AcquireOption
		if i%2 == 1 {
			opts = append(opts, mode.WithShared())
		}
		if _, err := holder.Acquire(ctx, key, opts...); err != nil {
			t.Fatal(err)
		}
		if _, err := dlock.Break(ctx, viewer, key); err != nil {
			t.Fatalf("Break #%d: %v", i, err)
		}
		lease, err := next.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("TryAcquire right after Break #%d (shared %v): %v", i, i%2 == 1, err)
		}
		_ = lease.Release(ctx)
	}
}
