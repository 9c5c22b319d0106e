package postgres

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
)

// Many leases held at once share one session per TTL: a pool of four
// connections holds 500 of them, each a real advisory lock another client
// cannot take, and every connection is back in the pool once they are
// released.
func TestSharedSessionHoldsManyLeases(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, pool := poolDriver(t, srv, "&pool_max_conns=4")
	other, _ := poolDriver(t, srv, "")

	const n = 500
	grants := make([]*backend.Grant, n)
	for i := range grants {
		ttl := 10 * time.Second
		if i%2 == 1 {
			ttl = 20 * time.Second // a second session
		}
		g, err := d.Acquire(ctx, backend.AcquireRequest{Key: "many/" + strconv.Itoa(i), Owner: backend.NewOwnerID(), TTL: ttl})
		if err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
		grants[i] = g
	}
	if got := pool.Stat().AcquiredConns(); got != 2 {
		t.Errorf("%d leases of two TTLs hold %d connections, want 2", n, got)
	}
	for _, i := range []int{0, 1, n / 2, n - 1} {
		if _, err := other.Acquire(ctx, backend.AcquireRequest{Key: "many/" + strconv.Itoa(i), Owner: backend.NewOwnerID(), TTL: time.Second}); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("another client's TryAcquire of held key %d: %v, want ErrHeld", i, err)
		}
	}
	// Renewing them all at once costs a few pings, and keeps them.
	var wg sync.WaitGroup
	for i, g := range grants {
		wg.Go(func() {
			ttl := 10 * time.Second
			if i%2 == 1 {
				ttl = 20 * time.Second
			}
			if _, err := d.Refresh(ctx, g, ttl); err != nil {
				t.Errorf("refresh %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	for _, g := range grants {
		if err := d.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	// The shared sessions go back to the pool shareLinger after their last
	// lease.
	waitIdlePool(t, pool, 2*shareLinger+2*time.Second)
}

// A shared session is asked for a lock it already holds never: advisory
// locks are re-entrant within a session, so it would grant it twice. The
// second lease of a key waits, on a connection of its own, until the first
// is released.
func TestSharedSessionIsNotReentrant(t *testing.T) {
	srv := testenv.StartPostgres(t)
	d, _ := poolDriver(t, srv, "")
	ctx := context.Background()
	req := func(wait bool) backend.AcquireRequest {
		return backend.AcquireRequest{Key: "same", Owner: backend.NewOwnerID(), TTL: 10 * time.Second, Wait: wait}
	}
	first, err := d.Acquire(ctx, req(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Acquire(ctx, req(false)); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("a second TryAcquire of a key the driver holds: %v, want ErrHeld", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = d.Acquire(wctx, req(true))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a waiting Acquire of a key the driver holds: %v, want it to wait until its ctx ends", err)
	}
	got := make(chan error, 1)
	var second *backend.Grant
	go func() {
		var err error
		second, err = d.Acquire(ctx, req(true))
		got <- err
	}()
	for d.waiting(t, "same") == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	if err := d.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if second.Token <= first.Token {
		t.Errorf("second token %d after first %d", second.Token, first.Token)
	}
	if err := d.Release(ctx, second); err != nil {
		t.Fatal(err)
	}
}

// When every connection of the pool is in use, TryAcquire says so within
// poolWait instead of waiting out its ctx, and not as ErrHeld.
func TestTryAcquireReportsPoolExhausted(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	d, pool := poolDriver(t, srv, "&pool_max_conns=1")
	busy, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = d.Acquire(tctx, backend.AcquireRequest{Key: "free", Owner: backend.NewOwnerID(), TTL: 10 * time.Second})
	took := time.Since(start)
	t.Logf("after %v: %v", took, err)
	if !errors.Is(err, ErrPoolExhausted) || errors.Is(err, backend.ErrHeld) {
		t.Fatalf("TryAcquire with the pool exhausted: %v, want ErrPoolExhausted", err)
	}
	if took > poolWait+time.Second {
		t.Errorf("TryAcquire with the pool exhausted took %v; poolWait is %v", took, poolWait)
	}
}

// A second shared TryAcquire of a key the shared session holds shared needs
// a connection of its own: with the pool's only connection taken by the
// shared session, it reports ErrPoolExhausted within poolWait too.
func TestSharedTryAcquireReportsPoolExhausted(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	d, _ := poolDriver(t, srv, "&pool_max_conns=1")
	req := backend.AcquireRequest{Key: "read", Owner: backend.NewOwnerID(), TTL: 10 * time.Second, Shared: true}
	first, err := d.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	req.Owner = backend.NewOwnerID()
	_, err = d.Acquire(tctx, req)
	took := time.Since(start)
	t.Logf("after %v: %v", took, err)
	if !errors.Is(err, ErrPoolExhausted) || errors.Is(err, backend.ErrHeld) {
		t.Fatalf("second shared TryAcquire with the pool exhausted: %v, want ErrPoolExhausted", err)
	}
	if took > poolWait+time.Second {
		t.Errorf("second shared TryAcquire with the pool exhausted took %v; poolWait is %v", took, poolWait)
	}
	if err := d.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
}

// poolDriver opens a driver on a pool of its own (the server's URL plus
// params), both closed with the test.
func poolDriver(t *testing.T, srv *testenv.Postgres, params string) (*Driver, *pgxpool.Pool) {
	t.Helper()
	return poolDriverAt(t, srv.URL()+params, nil)
}

// poolDriverAt is a driver with opts over a pool of its own to url; t's
// cleanup closes both.
func poolDriverAt(t *testing.T, url string, opts *Options) (*Driver, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDriver(ctx, pool, opts)
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Close()
		pool.Close()
	})
	return d, pool
}

// waitIdlePool fails t unless every connection of pool is back within bound.
func waitIdlePool(t *testing.T, pool *pgxpool.Pool, bound time.Duration) {
	t.Helper()
	for end := time.Now().Add(bound); pool.Stat().AcquiredConns() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d connections still acquired %v after every lease was released", pool.Stat().AcquiredConns(), bound)
		}
	}
}

// The statements of a busy shared session are bounded by a deadline on its
// connection (pin.hot), not by a context. The deadline must not outlive
// them: the idle watcher hears of the session's end however long after the
// last statement it comes, and the connection goes back to the pool
// without it.
func TestHotDeadlineDoesNotOutliveTheStatements(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const past = cleanupTimeout + cleanupTimeout/8 + watchDelay // the latest deadline hot sets, and then some

	// An idle session ends long after its last statement's deadline.
	d, _ := poolDriver(t, srv, "")
	lost := make(chan error, 1)
	g, err := d.Acquire(ctx, backend.AcquireRequest{Key: "hot/held", Owner: backend.NewOwnerID(), TTL: time.Minute,
		OnLost: func(err error) { lost <- err }})
	if err != nil {
		t.Fatal(err)
	}
	p := g.Data.(*sharedLease).s.p
	p.mu <- struct{}{}
	if p.watch == nil && p.hotUntil.IsZero() {
		t.Error("the acquire left no deadline on the busy session's connection")
	}
	pid := p.pid
	p.startWatchLater() // as the acquire's own unlock did: the watcher may have skipped its turn
	<-p.mu
	time.Sleep(past) // what is tested: time passing, idle, beyond the deadline
	srv.TerminateBackend(t, int(pid))
	select {
	case err := <-lost:
		t.Logf("lost: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("the session was terminated %v after its last statement, and 10s later its lease is not lost (TTL 1m, no refresh)", past)
	}

	// A connection back in the pool keeps no deadline: the pool's check of
	// a connection idle for a while (a ping) would fail on it, and the pool
	// replace it with another session.
	d2, pool := poolDriver(t, srv, "&pool_max_conns=1")
	g, err = d2.Acquire(ctx, backend.AcquireRequest{Key: "hot/released", Owner: backend.NewOwnerID(), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p = g.Data.(*sharedLease).s.p
	p.mu <- struct{}{}
	pid = p.pid
	<-p.mu
	if err := d2.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	waitIdlePool(t, pool, 2*shareLinger+2*time.Second)
	time.Sleep(time.Until(released.Add(past)))
	var now uint32
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	if now != pid {
		t.Fatalf("%v after the driver gave session %d back to the pool, the pool's only connection is session %d", past, pid, now)
	}
}
