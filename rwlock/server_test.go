package rwlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/mysql" // mysql://
	_ "github.com/dlock-go/dlock/redis" // redis://
	"github.com/dlock-go/dlock/rwlock"
)

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

type rlocked struct {
	h   *rwlock.Hold
	err error
}

// A waiting RLock in the portable layout rides out a link to the server cut
// for 300 ms while it waits for a read slot, as Acquire does, and is granted
// once a reader leaves: on Redis in fair mode (whose keys outlast the cut)
// and on MySQL (whose sessions, the waiter's write lock's among them, end
// with it).
func TestRLockRidesOutACutLink(t *testing.T) {
	for _, c := range []struct {
		name  string
		start func(t *testing.T) (addr string, dsn func(addr string) string)
	}{
		{"redis-fair", func(t *testing.T) (string, func(string) string) {
			return testenv.StartRedis(t).Addr(), func(addr string) string {
				return "redis://" + addr + "/0?fair=true&checks=off&dial_timeout=1s"
			}
		}},
		{"mysql", func(t *testing.T) (string, func(string) string) {
			return testenv.StartMariaDB(t).Addr(), func(addr string) string { return "mysql://root@" + addr + "/mysql?timeout=5s" }
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			addr, dsn := c.start(t)
			proxy := testenv.StartProxy(t, addr)
			direct, linked := openDSN(t, dsn(addr)), openDSN(t, dsn(proxy.Addr()))
			const name = "rw/cut"
			readers, _ := rwlock.New(direct, name)
			waiter, _ := rwlock.New(linked, name)
			if readers.Shared() {
				t.Fatal("the lock is the backend's own shared lock, not the portable layout")
			}
			var holds []*rwlock.Hold
			defer func() {
				for _, h := range holds {
					_ = h.Release(context.Background())
				}
			}()
			for range rwlock.Readers {
				h, err := readers.TryRLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				holds = append(holds, h)
			}
			got := make(chan rlocked, 1)
			go func() { h, err := waiter.RLock(ctx); got <- rlocked{h, err} }()
			queue := name + "/read/permits/queue"
			for {
				if in, err := dlock.Inspect(ctx, direct, queue); err == nil && in.Held {
					break // the waiter waits at the head of the read slots' queue
				}
				select {
				case <-ctx.Done():
					t.Fatal("the waiter never queued for a read slot")
				case <-time.After(10 * time.Millisecond):
				}
			}
			proxy.Cut(t)
			time.Sleep(300 * time.Millisecond) // the fault's length, not a synchronisation
			proxy.Heal(t)
			select {
			case r := <-got:
				if r.h != nil {
					_ = r.h.Release(ctx)
				}
				t.Fatalf("RLock returned (%v, %v) while every read slot was held", r.h != nil, r.err)
			default:
			}
			if err := holds[0].Release(ctx); err != nil {
				t.Fatal(err)
			}
			holds = holds[1:]
			var r rlocked
			select {
			case r = <-got:
			case <-time.After(15 * time.Second):
				t.Fatal("the waiter was not granted within 15 s of a reader's release")
			}
			if r.err != nil {
				t.Fatalf("RLock after a cut of 300 ms: %v", r.err)
			}
			holds = append(holds, r.h)
			if err := r.h.Err(); err != nil {
				t.Fatalf("the read hold granted is lost: %v", err)
			}
		})
	}
}
