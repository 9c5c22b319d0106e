package sqltable_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/sqltable"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestRefusesAsyncCommit: a server that commits asynchronously could lose a
// grant and its token in a crash: Open refuses it, naming the setting.
func TestRefusesAsyncCommit(t *testing.T) {
	srv := testenv.StartPostgres(t) // the test environment's default: synchronous_commit=off
	_, err := dlock.Open(testCtx(t), dsn(srv.URL()))
	if !errors.Is(err, sqltable.ErrAsyncCommit) {
		t.Fatalf("Open on a server with synchronous_commit=off: %v, want ErrAsyncCommit", err)
	}
	t.Log(err)
}

// TestOpenErrors: bad parameters of the driver's are refused with
// ErrInvalidOption before anything is opened.
func TestOpenErrors(t *testing.T) {
	for _, q := range []string{"table=a%3Bdrop", "poll=0.5ms", "max_conns=0", "table=1x"} {
		_, err := dlock.Open(testCtx(t), "pgtable://postgres@127.0.0.1:1/postgres?"+q)
		if !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("Open with %s: %v, want ErrInvalidOption", q, err)
		}
	}
}

// TestTokensSurviveARestart: the row's counter is committed with the grant,
// so the first grant after a crash (SIGKILL, crash recovery) has a higher
// token than the last one before it.
func TestTokensSurviveARestart(t *testing.T) {
	h := newHarness(t)
	tokensSurviveARestart(t, h.NewLocker(t), func() { h.srv.Kill(); h.srv.Restart() })
}

// tokensSurviveARestart takes and releases a key three times on l, crashes
// and restarts the server, and checks the next grant's token is higher.
func tokensSurviveARestart(t *testing.T, l dlock.Locker, crash func()) {
	t.Helper()
	ctx := testCtx(t)
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
	crash()
	lease, err := l.Acquire(ctx, "restart/tokens")
	if err != nil {
		t.Fatalf("Acquire after the restart: %v", err)
	}
	defer lease.Release(ctx)
	if lease.Token() <= last {
		t.Fatalf("token after the crash %d, not above the last before it %d", lease.Token(), last)
	}
}

// TestOpenConcurrentlyOnAFreshDatabase: processes that start together on a
// database without the lock table all open; PostgreSQL's CREATE TABLE IF NOT
// EXISTS lets all but one fail on its catalog (duplicate type or key) while
// the first is creating it.
func TestOpenConcurrentlyOnAFreshDatabase(t *testing.T) {
	srv := startPostgres(t)
	ctx := testCtx(t)
	const rounds, openers = 10, 8
	for round := range rounds {
		table := fmt.Sprintf("fresh_%d", round)
		start := make(chan struct{})
		errs := make(chan error, openers)
		lockers := make(chan dlock.Locker, openers)
		var wg sync.WaitGroup
		for range openers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				l, err := dlock.Open(ctx, dsn(srv.URL())+"&table="+table)
				if err != nil {
					errs <- err
					return
				}
				lockers <- l
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		close(lockers)
		for l := range lockers {
			_ = l.Close()
		}
		for err := range errs {
			t.Errorf("round %d: Open on a database without table %s: %v", round, table, err)
		}
		if t.Failed() {
			return
		}
	}
}
