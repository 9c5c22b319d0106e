package bench

import (
	"context"
	"testing"

	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/rwlock"
	"github.com/dlock-go/dlock/semaphore"
)

// semLocker takes a permit of a semaphore of 4 named by the key.
type semLocker struct {
	l       dlock.Locker
	checked bool
}

func (s semLocker) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	sem, err := semaphore.New(s.l, key, 4, semaphore.WithSizeCheck(s.checked))
	if err != nil {
		return nil, err
	}
	var p *semaphore.Permit
	if wait {
		p, err = sem.Acquire(ctx)
	} else {
		p, err = sem.TryAcquire(ctx)
	}
	if err != nil {
		return nil, err
	}
	return func() error { return p.Release(context.Background()) }, nil
}

// rwLocker takes the read/write lock named by the key, for reading or
// writing.
type rwLocker struct {
	l     dlock.Locker
	write bool
}

func (r rwLocker) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	m, err := rwlock.New(r.l, key)
	if err != nil {
		return nil, err
	}
	var h *rwlock.Hold
	switch {
	case r.write && wait:
		h, err = m.Lock(ctx)
	case r.write:
		h, err = m.TryLock(ctx)
	case wait:
		h, err = m.RLock(ctx)
	default:
		h, err = m.TryRLock(ctx)
	}
	if err != nil {
		return nil, err
	}
	return func() error { return h.Release(context.Background()) }, nil
}

// recipeRW is etcd's experimental recipes RWMutex on one session.
type recipeRW struct {
	s     *concurrency.Session
	write bool
}

func (r recipeRW) lock(_ context.Context, key string, _ bool) (func() error, error) {
	m := recipe.NewRWMutex(r.s, key)
	if r.write {
		if err := m.Lock(); err != nil {
			return nil, err
		}
		return m.Unlock, nil
	}
	if err := m.RLock(); err != nil {
		return nil, err
	}
	return m.RUnlock, nil
}

// primitiveImpls returns, for one backend at dsn, dlock's lock (the
// reference), a semaphore of 4 (with and without the size check), a read and
// a write of a read/write lock, and the backend's floor.
func primitiveImpls(dsn string, floor impl) []impl {
	with := func(name string, mk func(l dlock.Locker) locker) impl {
		return impl{name: name, canWait: true, reqs: floor.reqs, newLocker: func(tb testing.TB) locker {
			return mk(openDlock(tb, dsn, benchTTL))
		}}
	}
	return []impl{
		dlockImpl("dlock", dsn, floor.reqs),
		with("semaphore", func(l dlock.Locker) locker { return semLocker{l, true} }),
		with("semaphore-unchecked", func(l dlock.Locker) locker { return semLocker{l, false} }),
		with("rw-read", func(l dlock.Locker) locker { return rwLocker{l, false} }),
		with("rw-write", func(l dlock.Locker) locker { return rwLocker{l, true} }),
		floor,
	}
}

func floorOf(tb testing.TB, impls []impl) impl {
	for _, im := range impls {
		if im.name == "floor" {
			return im
		}
	}
	tb.Fatal("no floor")
	return impl{}
}

// BenchmarkPrimitives: uncontended cycles of a semaphore permit and of a
// read and a write hold of a read/write lock, interleaved round by round
// with a lock cycle and the backend's floor, on each backend; on etcd also
// the recipes RWMutex (the only Go peer of either on these backends), on
// PostgreSQL a raw pg_advisory_lock_shared (a read's floor).
func BenchmarkPrimitives(b *testing.B) {
	backends := []struct {
		name string
		// impls starts the backend and returns what runs on it.
		impls func(tb testing.TB) []impl
	}{
		{"Redis", func(tb testing.TB) []impl {
			e := startRedisEnv(tb)
			return primitiveImpls(e.single.URL(), floorOf(tb, e.impls))
		}},
		{"Etcd", func(tb testing.TB) []impl {
			e := startEtcdEnv(tb)
			impls := primitiveImpls(e.srv.URL()+"/dlock", floorOf(tb, e.impls))
			return append(impls, recipeImpl(e, false), recipeImpl(e, true))
		}},
		{"ZooKeeper", func(tb testing.TB) []impl {
			e := startZooKeeperEnv(tb)
			return primitiveImpls(e.srv.URL("/dlock")+"?session=10s", floorOf(tb, e.impls))
		}},
		{"Postgres", func(tb testing.TB) []impl {
			e := startPostgresEnv(tb)
			url := e.srv.URL()
			return append(primitiveImpls(url, floorOf(tb, e.impls)),
				impl{name: "pg-advisory-shared", canWait: true, reqs: e.reqs, oneSessionPerWaiter: true,
					newLocker: func(tb testing.TB) locker { return pgAdvisoryShared{newPgConn(tb, url)} }})
		}},
		{"MySQL", func(tb testing.TB) []impl {
			e := startMySQLEnv(tb)
			return primitiveImpls(e.srv.URL("mysql"), floorOf(tb, e.impls))
		}},
	}
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			impls := be.impls(b)
			b.Run("Uncontended", func(b *testing.B) { reportUncontended(b, runUncontended(b, impls, b.N)) })
		})
	}
}

// recipeImpl is etcd's recipes RWMutex, reading or writing, on a session
// per client.
func recipeImpl(e *etcdEnv, write bool) impl {
	name := "recipes-rw-read"
	if write {
		name = "recipes-rw-write"
	}
	return impl{name: name, canWait: true, reqs: e.reqs, newLocker: func(tb testing.TB) locker {
		s, err := concurrency.NewSession(newEtcdClient(tb, e.srv.Endpoint()), concurrency.WithTTL(int(benchTTL.Seconds())))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = s.Close() })
		return recipeRW{s, write}
	}}
}

// TestSmokePrimitives runs BenchmarkPrimitives's implementations a few
// rounds on Redis and etcd (the one with a peer), as TestSmoke does the
// others.
func TestSmokePrimitives(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers: not in -short")
	}
	r := startRedisEnv(t)
	e := startEtcdEnv(t)
	for _, impls := range [][]impl{
		primitiveImpls(r.single.URL(), floorOf(t, r.impls)),
		append(primitiveImpls(e.srv.URL()+"/dlock", floorOf(t, e.impls)), recipeImpl(e, false), recipeImpl(e, true)),
	} {
		for _, res := range runUncontended(t, impls, 3) {
			if res.errors > 0 || len(res.samples) != 3 {
				t.Errorf("%s: %d errors, %d cycles", res.name, res.errors, len(res.samples))
			}
		}
	}
}
