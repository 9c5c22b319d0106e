package semaphore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/postgres"
	"github.com/dlock-go/dlock/semaphore"
	_ "github.com/dlock-go/dlock/sqltable" // pgtable://
)

// serverCtx bounds a test on real servers.
func serverCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// openDSN opens a Locker on dsn, closed in t.Cleanup.
func openDSN(t *testing.T, dsn string) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("dlock.Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// waitFor polls cond every 10 ms until it holds; it fails the test if ctx
// ends first.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting until %s: %v", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// heldSlots counts the held slots of the semaphore name.
func heldSlots(ctx context.Context, l dlock.Locker, name string) int {
	infos, err := dlock.List(ctx, l, name+"/permits/")
	if err != nil {
		return -1
	}
	n := 0
	for _, in := range infos {
		if _, err := strconv.Atoi(strings.TrimPrefix(in.Key, name+"/permits/")); err == nil && in.Held {
			n++
		}
	}
	return n
}

type permits struct {
	ps  []*semaphore.Permit
	err error
}

func releaseAll(ps []*semaphore.Permit) {
	for _, p := range ps {
		_ = p.Release(context.Background())
	}
}

// The head waiter of an AcquireN that loses its queue lock (broken here;
// a session's end or a failover elsewhere) gives back what it gathered and
// queues again: else the waiter that takes the queue after it gathers too,
// and each holds part of what the other needs. n = 3: X holds one permit, A
// waits at the head for 3 holding 2, B waits in the queue for 2; the queue
// lock is broken; one of them must be granted within 5 s (B, with A's 2),
// and the other, still waiting, once the winner and X give theirs back.
func TestAcquireNHeadWaiterLosesTheQueue(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx := serverCtx(t, 6*time.Minute)
	x, a, b, breaker := openDSN(t, pg.URL()), openDSN(t, pg.URL()), openDSN(t, pg.URL()), openDSN(t, pg.URL())
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	const rounds = 20
	for round := range rounds {
		name := fmt.Sprintf("sem/head-loses-queue-%d", round)
		queue := name + "/permits/queue"
		opts := semaphore.WithPollInterval(100 * time.Millisecond)
		semX, _ := semaphore.New(x, name, 3, opts)
		semA, _ := semaphore.New(a, name, 3, opts)
		semB, _ := semaphore.New(b, name, 3, opts)
		px, err := semX.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		gotA, gotB := make(chan permits, 1), make(chan permits, 1)
		go func() { ps, err := semA.AcquireN(rctx, 3); gotA <- permits{ps, err} }()
		waitFor(ctx, t, "A waits at the head of the queue holding 2 permits", func() bool {
			in, err := dlock.Inspect(ctx, breaker, queue)
			return err == nil && in.Held && heldSlots(ctx, breaker, name) == 3
		})
		go func() { ps, err := semB.AcquireN(rctx, 2); gotB <- permits{ps, err} }()
		classid, objid, objsubid := postgres.Options{}.AdvisoryKey(queue).PgLocks()
		waitFor(ctx, t, "B waits for the queue lock", func() bool {
			var waiting bool
			err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
				AND classid = $1 AND objid = $2 AND objsubid = $3 AND NOT granted)`,
				int64(classid), int64(objid), objsubid).Scan(&waiting)
			return err == nil && waiting
		})
		if _, err := dlock.Break(ctx, breaker, queue); err != nil {
			t.Fatalf("round %d: break the queue lock: %v", round, err)
		}

		var won, other permits
		var otherC chan permits
		select {
		case won = <-gotA:
			otherC = gotB
		case won = <-gotB:
			otherC = gotA
		case <-time.After(5 * time.Second):
			held := heldSlots(ctx, breaker, name)
			cancel()
			releaseAll((<-gotA).ps)
			releaseAll((<-gotB).ps)
			_ = px.Release(ctx)
			t.Fatalf("round %d: neither A nor B was granted within 5 s (%d of 3 slots held, X's among them)", round, held)
		}
		if won.err != nil {
			cancel()
			releaseAll((<-otherC).ps)
			_ = px.Release(ctx)
			t.Fatalf("round %d: %v", round, won.err)
		}
		for _, p := range won.ps {
			if err := p.Err(); err != nil {
				t.Errorf("round %d: a permit granted lost: %v", round, err)
			}
		}
		// The other still waits, its ctx live: it is granted once the
		// winner and X give their permits back.
		releaseAll(won.ps)
		_ = px.Release(ctx)
		late := false
		select {
		case other = <-otherC:
		case <-time.After(5 * time.Second):
			late = true
			cancel()
			other = <-otherC
		}
		cancel()
		releaseAll(other.ps)
		if late {
			t.Fatalf("round %d: the other waiter was not granted within 5 s of the others' release (then: %v)", round, other.err)
		}
		if other.err != nil {
			t.Fatalf("round %d: the other waiter: %v", round, other.err)
		}
	}
}

// A waiting Acquire rides out a link to the server cut for 300 ms, as
// Acquire does, and is granted once the holder releases: in the layout of
// PostgreSQL's advisory locks (whose sessions, the waiter's queue lock's
// among them, end with the link) and of the table lock (whose rows
// outlast it).
func TestAcquireRidesOutACutLink(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.WithPostgresSetting("synchronous_commit", "on")) // as pgtable:// requires
	for _, scheme := range []string{"postgres", "pgtable"} {
		t.Run(scheme, func(t *testing.T) {
			ctx := serverCtx(t, 2*time.Minute)
			proxy := testenv.StartProxy(t, pg.Addr())
			direct := openDSN(t, scheme+"://postgres@"+pg.Addr()+"/postgres?sslmode=disable")
			linked := openDSN(t, scheme+"://postgres@"+proxy.Addr()+"/postgres?sslmode=disable&connect_timeout=5")
			name := "sem/cut-" + scheme
			opts := semaphore.WithPollInterval(50 * time.Millisecond)
			semH, _ := semaphore.New(direct, name, 1, opts)
			semW, _ := semaphore.New(linked, name, 1, opts)
			held, err := semH.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan permits, 1)
			go func() {
				p, err := semW.Acquire(ctx)
				if err != nil {
					got <- permits{err: err}
					return
				}
				got <- permits{ps: []*semaphore.Permit{p}}
			}()
			waitFor(ctx, t, "the waiter queues", func() bool {
				in, err := dlock.Inspect(ctx, direct, name+"/permits/queue")
				return err == nil && in.Held
			})
			proxy.Cut(t)
			time.Sleep(300 * time.Millisecond) // the fault's length, not a synchronisation
			proxy.Heal(t)
			select {
			case r := <-got:
				releaseAll(r.ps)
				t.Fatalf("Acquire returned (%d permits, %v) while the slot was held", len(r.ps), r.err)
			default:
			}
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			var r permits
			select {
			case r = <-got:
			case <-time.After(15 * time.Second):
				t.Fatal("the waiter was not granted within 15 s of the release")
			}
			if r.err != nil {
				t.Fatalf("Acquire after a cut of 300 ms: %v", r.err)
			}
			defer releaseAll(r.ps)
			if err := r.ps[0].Err(); err != nil {
				t.Fatalf("the permit granted is lost: %v", err)
			}
			if r.ps[0].Token() <= held.Token() {
				t.Errorf("token %d granted after the holder's %d", r.ps[0].Token(), held.Token())
			}
		})
	}
}
