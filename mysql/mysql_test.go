package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/mysql"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, dsn string) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("dlock.Open(%q): %v", dsn, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// TestDriver runs the driver's own tests on one server.
func TestDriver(t *testing.T) {
	h := newHarness(t)
	t.Run("LockNameInSQL", func(t *testing.T) { testLockNameInSQL(t, h) })
	t.Run("RawGetLockBothWays", func(t *testing.T) { testRawGetLock(t, h) })
	t.Run("CancelKillsOnlyTheWait", func(t *testing.T) { testCancelKillsOnlyTheWait(t, h) })
	t.Run("PoolExhausted", func(t *testing.T) { testPoolExhausted(t, h) })
	t.Run("SessionTimeoutIsTheTTL", func(t *testing.T) { testSessionTimeout(t, h) })
	t.Run("DSN", func(t *testing.T) { testDSN(t, h) })
	t.Run("RefusesAsyncCommit", func(t *testing.T) { testRefusesAsyncCommit(t, h) })
	// Last: it restarts the server.
	t.Run("TokensSurviveARestart", func(t *testing.T) { testTokensSurviveARestart(t, h) })
}

// testLockNameInSQL: LockName's documented SQL gives the same names.
func testLockNameInSQL(t *testing.T, h *harness) {
	ctx := testCtx(t)
	for _, c := range []struct{ ns, key string }{
		{"dlock", "jobs/nightly"}, {"dlock", "ключ/ü"}, {"app-1.x", strings.Repeat("k", 1024)},
		{strings.Repeat("n", 32), "k"}, {"dlock", "Jobs/Nightly"},
	} {
		var got string
		err := h.admin.QueryRowContext(ctx, "SELECT LEFT(CONCAT(?, ':', SHA2(CONCAT(?, CHAR(0), ?), 256)), 64)", c.ns, c.ns, c.key).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if want := mysql.LockName(c.ns, c.key); got != want || len(want) != 64 {
			t.Errorf("LockName(%q, %q) = %q; SQL gives %q", c.ns, c.key, want, got)
		}
	}
	if mysql.LockName("dlock", "a") == mysql.LockName("dlock", "A") {
		t.Error("keys that differ only in case share a lock name")
	}
}

// testRawGetLock: dlock and a program calling GET_LOCK on the same name
// exclude each other, both ways, and Inspect reports the other program's
// hold.
func testRawGetLock(t *testing.T, h *harness) {
	ctx := testCtx(t)
	l := h.NewLocker(t)
	k := "interop/" + t.Name()
	name := mysql.LockName(mysql.DefaultNamespace, k)
	raw, err := h.admin.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	getLock := func() int64 {
		var got sql.NullInt64
		if err := raw.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got.Int64
	}

	lease, err := l.TryAcquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if got := getLock(); got != 0 {
		t.Fatalf("GET_LOCK of a name dlock holds: %d, want 0", got)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := getLock(); got != 1 {
		t.Fatalf("GET_LOCK after dlock released: %d, want 1", got)
	}
	if _, err := l.TryAcquire(ctx, k); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a name another program holds: %v, want ErrNotAcquired", err)
	}
	info, err := dlock.Inspect(ctx, l, k)
	if err != nil || !info.Held || info.Token != 0 {
		t.Fatalf("Inspect of a name another program holds: %+v, %v; want held, no token", info, err)
	}
	if _, err := raw.ExecContext(ctx, "DO RELEASE_LOCK(?)", name); err != nil {
		t.Fatal(err)
	}
	lease, err = l.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire after the other program released: %v", err)
	}
	_ = lease.Release(ctx)
}

// testCancelKillsOnlyTheWait: a cancelled wait leaves the server at once
// (KILL QUERY, not the end of GET_LOCK's timeout), and the locker's other
// leases keep their sessions.
func testCancelKillsOnlyTheWait(t *testing.T, h *harness) {
	ctx := testCtx(t)
	a, b := h.NewLocker(t), h.NewLocker(t)
	k := "cancel/" + t.Name()
	held, err := a.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	other, err := b.Acquire(ctx, k+"/other")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(ctx)
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(wctx, k)
		errc <- err
	}()
	for h.Waiters(t, k) != 1 {
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v, want context.Canceled", err)
	}
	for h.Waiters(t, k) != 0 {
		if time.Since(start) > 900*time.Millisecond {
			t.Fatalf("the cancelled GET_LOCK still waits in the server %v after the cancel", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the server stopped waiting %v after the cancel", time.Since(start))
	if err := other.Refresh(ctx); err != nil {
		t.Fatalf("another lease of the locker after the cancel: %v", err)
	}
}

// testPoolExhausted: with every connection pinned, TryAcquire of a free key
// says so within conn_wait, and is not ErrNotAcquired.
func testPoolExhausted(t *testing.T, h *harness) {
	ctx := testCtx(t)
	l := open(t, h.srv.URL("mysql")+"?max_conns=2&conn_wait=200ms")
	k := "pool/" + t.Name()
	for i := range 2 {
		lease, err := l.Acquire(ctx, k+"/"+string(rune('a'+i)))
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
	}
	start := time.Now()
	_, err := l.TryAcquire(ctx, k+"/free")
	took := time.Since(start)
	if !errors.Is(err, mysql.ErrNoConnection) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire with the pool exhausted: %v, want ErrNoConnection", err)
	}
	if took > 2*time.Second {
		t.Fatalf("TryAcquire with the pool exhausted took %v (conn_wait 200ms)", took)
	}
	t.Logf("%v after %v", err, took)
}

// testSessionTimeout: the lease's session has the TTL, rounded up to a
// second, as its wait_timeout, so the server ends it when its holder falls
// silent (here: a link that drops every byte), never before the holder's
// deadline.
func testSessionTimeout(t *testing.T, h *harness) {
	ctx := testCtx(t)
	p := testenv.StartProxy(t, h.srv.Addr())
	l := open(t, "mysql://root@"+p.Addr()+"/mysql?timeout=5s")
	k := "timeout/" + t.Name()
	lease, err := l.Acquire(ctx, k, dlock.WithTTL(2500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	id := h.holder(t, k)
	start := time.Now()
	p.Blackhole(t)
	defer p.Heal(t)
	for h.holder(t, k) == id {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the silent session still holds the lock 10s later")
		}
		time.Sleep(20 * time.Millisecond)
	}
	freed := time.Now()
	<-lease.Done()
	t.Logf("the server ended the silent session %v after the link went silent (TTL 2.5s, wait_timeout 3s); the holder's deadline was %v after it",
		freed.Sub(start), lease.Deadline().Sub(start))
	if freed.Before(lease.Deadline()) {
		t.Fatalf("the server freed the lock %v before the holder's deadline", lease.Deadline().Sub(freed))
	}
	if took := freed.Sub(start); took > 3*time.Second+500*time.Millisecond {
		t.Fatalf("the server freed the lock %v after the holder fell silent; wait_timeout is 3s", took)
	}
}

// testDSN: parameters nobody reads, and bad values, are refused before any
// connection is made.
func testDSN(t *testing.T, h *harness) {
	ctx := testCtx(t)
	for _, q := range []string{"?nosuch=1", "?namespace=a:b", "?namespace=" + strings.Repeat("n", 33), "?table=x-y", "?table=a;b", "?max_conns=0", "?conn_wait=-1s"} {
		_, err := dlock.Open(ctx, h.srv.URL("mysql")+q)
		if !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("Open with %s: %v, want ErrInvalidOption", q, err)
		}
	}
	l := open(t, h.srv.URL("mysql")+"?namespace=other&table=other_fence&tls=false")
	lease, err := l.TryAcquire(ctx, "dsn/"+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(ctx)
}

// testRefusesAsyncCommit: with innodb_flush_log_at_trx_commit=0 a crash
// loses the last second of commits: Open refuses the server.
func testRefusesAsyncCommit(t *testing.T, h *harness) {
	ctx := testCtx(t)
	if _, err := h.admin.ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = 0"); err != nil {
		t.Fatal(err)
	}
	defer h.admin.ExecContext(context.Background(), "SET GLOBAL innodb_flush_log_at_trx_commit = 1")
	_, err := dlock.Open(ctx, h.DSN(t))
	if !errors.Is(err, mysql.ErrAsyncCommit) {
		t.Fatalf("Open with innodb_flush_log_at_trx_commit=0: %v, want ErrAsyncCommit", err)
	}
}

// testTokensSurviveARestart: the counter is committed with the grant, so
// the first grant after a SIGKILL and InnoDB's crash recovery has a higher
// token than the last one before it.
func testTokensSurviveARestart(t *testing.T, h *harness) {
	ctx := testCtx(t)
	l := h.NewLocker(t)
	var last dlock.Token
	for range 3 {
		lease, err := l.Acquire(ctx, "restart/tokens")
		if err != nil {
			t.Fatal(err)
		}
		last = lease.Token()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	h.srv.Kill()
	h.srv.Restart()
	lease, err := l.Acquire(ctx, "restart/tokens")
	if err != nil {
		t.Fatalf("Acquire after the restart: %v", err)
	}
	defer lease.Release(ctx)
	if lease.Token() <= last {
		t.Fatalf("token after the crash %d, not above the last before it %d", lease.Token(), last)
	}
}
