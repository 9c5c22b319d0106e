package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
	pool, err := pgxpool.New(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := NewDriver(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	for round := range 3 {
		g, err := d.Acquire(ctx, backend.AcquireRequest{Key: "k", Owner: backend.NewOwnerID(), TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
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
		err = d.Release(rctx, g)
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
		g2, err := d.Acquire(ctx, backend.AcquireRequest{Key: "k", Owner: backend.NewOwnerID(), TTL: 10 * time.Second})
		if err != nil {
			t.Fatalf("round %d: the next owner could not take the lock: %v", round, err)
		}
		if err := d.Release(ctx, g2); err != nil {
			t.Fatal(err)
		}
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Fatalf("round %d: %d connections still acquired from the pool after every lease ended", round, n)
		}
	}
}
