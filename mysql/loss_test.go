package mysql_test

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/sockstate"
	"github.com/dlock-go/dlock/mysql"
)

// lossBound is how soon after its session ends a lease must end, with a
// watcher that looks every 50ms.
const lossBound = 200 * time.Millisecond

// TestLossWatch runs the loss watcher's tests on one server.
func TestLossWatch(t *testing.T) {
	if !sockstate.Supported {
		t.Skip("no loss notification on this platform")
	}
	h := newHarness(t)
	t.Run("StalledRenewal", func(t *testing.T) { testStalledRenewal(t, h) })
	// Last: it restarts the server.
	t.Run("ReusedSessionID", func(t *testing.T) { testReusedSessionID(t, h) })
}

// testStalledRenewal: while one lease's renewal is stuck in its statement
// (the lease's mutex held), another lease whose session is killed still
// ends within lossBound.
func testStalledRenewal(t *testing.T, h *harness) {
	ctx := testCtx(t)
	l := h.NewLocker(t)
	ka, kb := "loss/stalled", "loss/killed"
	a, err := l.Acquire(ctx, ka, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	b, err := l.Acquire(ctx, kb, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)

	nameA := mysql.LockName(mysql.DefaultNamespace, ka)
	entered, unblock := make(chan struct{}), make(chan struct{})
	var enterOnce, unblockOnce sync.Once
	restoreRefresh := mysql.SetRefreshHook(func(name string) {
		if name == nameA {
			enterOnce.Do(func() { close(entered) })
			<-unblock
		}
	})
	rounds := make(chan struct{}, 1)
	restoreWatch := mysql.SetWatchHook(func() {
		select {
		case rounds <- struct{}{}:
		default:
		}
	})
	refreshed := make(chan error, 1)
	go func() { refreshed <- a.Refresh(ctx) }()
	unstall := func() {
		unblockOnce.Do(func() {
			close(unblock)
			if err := <-refreshed; err != nil {
				t.Errorf("the held renewal of lease A, let go: %v", err)
			}
			restoreRefresh()
			restoreWatch()
		})
	}
	defer unstall()
	<-entered

	// Let the watcher pass by lease A: a round that began after A's renewal
	// stalled, then the start of the next one. A watcher that waits for A's
	// mutex finishes no round; the test goes on after a second anyway.
	select {
	case <-rounds:
	default:
	}
	wait := time.NewTimer(time.Second)
	defer wait.Stop()
passed:
	for range 2 {
		select {
		case <-rounds:
		case <-wait.C:
			t.Logf("the watcher finished no round in 1s while lease A's renewal was held")
			break passed
		}
	}

	id := h.holder(t, kb)
	start := time.Now()
	if _, err := h.admin.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatInt(id, 10)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Done():
		t.Logf("lease B ended %v after the KILL of its session, with lease A's renewal held", time.Since(start))
	case <-time.After(lossBound - time.Since(start)):
		t.Fatalf("lease B is not Done %v after the KILL of its session %d, while lease A's renewal is held", time.Since(start), id)
	}
	if err := b.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("lease B's Err: %v, want ErrLeaseLost", err)
	}
	unstall()
	if err := a.Err(); err != nil {
		t.Fatalf("lease A, whose session lives, ended: %v", err)
	}
}

// testReusedSessionID: the server restarts, and a new session of the same
// driver gets the id of a held lease's dead session before the watcher
// looks. The held lease still ends within lossBound of the watcher's next
// look, and the new session's lease is not taken for the old one.
func testReusedSessionID(t *testing.T, h *harness) {
	ctx := testCtx(t)
	connID := func() int64 {
		t.Helper()
		var id int64
		if err := h.admin.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// Every connection of the driver gets an id well above those the
	// restarted server starts from (the admin pool keeps no connection: each
	// statement opens a new session).
	for connID() < 40 {
	}
	l := h.NewLocker(t)
	ka, kb := "loss/old-session", "loss/new-session"
	a, err := l.Acquire(ctx, ka, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	n := h.holder(t, ka)

	// Park the watcher at the start of its next round.
	parked, resume := make(chan struct{}, 1), make(chan struct{})
	var resumeOnce sync.Once
	restoreWatch := mysql.SetWatchHook(func() {
		select {
		case parked <- struct{}{}:
		default:
		}
		<-resume
	})
	unpark := func() {
		resumeOnce.Do(func() { close(resume) })
		restoreWatch()
	}
	defer unpark()
	<-parked

	h.srv.Kill()
	h.srv.Restart()
	for {
		id := connID()
		if id == n-1 {
			break
		}
		if id >= n-1 {
			t.Fatalf("the restarted server gave session id %d, past %d: no new session can get lease A's id %d", id, n-1, n)
		}
	}
	// The driver's idle sessions died with the server: this acquire dials
	// the next session, whose id is lease A's.
	b, err := l.Acquire(ctx, kb, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if got := h.holder(t, kb); got != n {
		t.Fatalf("lease B's session got id %d, not lease A's %d", got, n)
	}

	start := time.Now()
	unpark()
	select {
	case <-a.Done():
		t.Logf("lease A ended %v after the watcher resumed (its session %d died with the server; lease B's session has its id)", time.Since(start), n)
	case <-time.After(lossBound):
		t.Fatalf("lease A is not Done %v after the watcher resumed: its session %d died with the server, and lease B's new session %d was taken for it",
			time.Since(start), n, n)
	}
	if err := a.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("lease A's Err: %v, want ErrLeaseLost", err)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatalf("lease B, whose session has the old session's id: %v", err)
	}
	if err := b.Err(); err != nil {
		t.Fatalf("lease B ended: %v", err)
	}
}
