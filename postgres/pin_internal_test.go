package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
)

// A release whose ctx ends while a refresh holds the lease's connection must
// not leave the connection to that refresh for good: once the refresh is done
// the connection is destroyed (its session, and so its lock, ends) and the
// pool's slot comes back. Repeated, the leak would shrink the pool until every
// Acquire blocks.
func TestReleaseBehindSlowRefreshFreesConnection(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	d, pool := poolDriver(t, srv, "")

	for round := range 3 {
		g := waitedGrant(t, d, "k")
		p := g.Data.(*pin)
		entered, proceed := make(chan struct{}), make(chan struct{})
		p.refreshing = func() { close(entered); <-proceed }
		refreshed := make(chan error, 1)
		go func() {
			_, err := d.Refresh(ctx, g, 10*time.Second)
			refreshed <- err
		}()
		<-entered // the refresh holds the connection

		rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := d.Release(rctx, g)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("round %d: Release behind a held refresh = %v, want its ctx's deadline", round, err)
		}
		close(proceed)
		if err := <-refreshed; err != nil {
			t.Fatalf("round %d: the refresh itself failed: %v", round, err)
		}

		// The connection is given up, so the lock is free for another owner at
		// once (not after its idle timeout) and the pool has its slot back.
		// (It waits for the server to end the closed session: well within
		// the 10s idle timeout.)
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		g2, err := d.Acquire(wctx, backend.AcquireRequest{Key: "k", Owner: backend.NewOwnerID(), TTL: 10 * time.Second, Wait: true})
		cancel()
		if err != nil {
			t.Fatalf("round %d: the next owner could not take the lock: %v", round, err)
		}
		if err := d.Release(ctx, g2); err != nil {
			t.Fatal(err)
		}
		waitIdlePool(t, pool, 2*shareLinger+2*time.Second)
	}
}

// waitedGrant returns a grant of key that waited for another holder, so
// that it holds a connection of its own (a pin), not a place in a shared
// session.
func waitedGrant(t *testing.T, d *Driver, key string) *backend.Grant {
	t.Helper()
	ctx := context.Background()
	first, err := d.Acquire(ctx, backend.AcquireRequest{Key: key, Owner: backend.NewOwnerID(), TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := first.Data.(*sharedLease); !ok {
		t.Fatalf("an uncontended grant is a %T, want a place in a shared session", first.Data)
	}
	got := make(chan *backend.Grant, 1)
	go func() {
		g, err := d.Acquire(ctx, backend.AcquireRequest{Key: key, Owner: backend.NewOwnerID(), TTL: 10 * time.Second, Wait: true})
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	for d.waiting(t, key) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	if err := d.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	g := <-got
	if g == nil {
		t.FailNow()
	}
	if _, ok := g.Data.(*pin); !ok {
		t.Fatalf("a grant after a wait is a %T, want a connection of its own", g.Data)
	}
	return g
}

// waiting counts the sessions waiting for key's advisory lock.
func (d *Driver) waiting(t *testing.T, key string) int {
	t.Helper()
	classid, objid, objsubid := d.opts.AdvisoryKey(key).PgLocks()
	var n int
	err := d.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = $3 AND NOT granted`,
		int64(classid), int64(objid), objsubid).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
