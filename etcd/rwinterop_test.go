package etcd_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/internal/testenv"
)

// spyClient returns a client that reports on watched the key of every watch
// it asks the server to create: a waiter (dlock's, a recipe's,
// concurrency.Mutex's) creates a watch once it has read the keys ahead of it
// and decided to wait, so the report tells a test that the waiter is past
// the point where a wrong implementation would have taken the lock.
func spyClient(t *testing.T, endpoint string) (cli *clientv3.Client, watched <-chan string) {
	t.Helper()
	ch := make(chan string, 1000)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				cs, err := streamer(ctx, desc, cc, method, opts...)
				if err != nil {
					return nil, err
				}
				return watchSpy{cs, ch}, nil
			}),
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli, ch
}

// watchSpy reports the key of each watch creation request sent on its stream.
type watchSpy struct {
	grpc.ClientStream
	watched chan<- string
}

func (s watchSpy) SendMsg(m any) error {
	if req, ok := m.(*etcdserverpb.WatchRequest); ok {
		if cr := req.GetCreateRequest(); cr != nil {
			select {
			case s.watched <- string(cr.Key):
			default:
			}
		}
	}
	return s.ClientStream.SendMsg(m)
}

// awaitWatch waits until watched reports a watch of a key under key's lock
// name, or got delivers (the waiter returned: it did not wait).
func awaitWatch(t *testing.T, watched <-chan string, key string, got <-chan func()) {
	t.Helper()
	name := etcd.LockName(testPrefix, key) + "/"
	timeout := time.After(10 * time.Second)
	for {
		select {
		case k := <-watched:
			if strings.HasPrefix(k, name) {
				return
			}
		case rel := <-got:
			rel()
			t.Fatal("the waiter got the lock while the holder held it")
		case <-timeout:
			t.Fatalf("the waiter did not start waiting on %s within 10s", name)
		}
	}
}

// waitsFor checks that wait does not get key's lock while hold's hold is
// kept, and gets it once hold's hold is released. The waiter's client
// reports on watched the watches it creates: once it watches a key under
// the lock's name it has decided to wait, and the test checks it has not
// returned, releases the holder and waits for the waiter. A waiter that
// returns before the holder's release began fails the test whenever it
// returns. keys is the number of keys under the lock's name with the waiter
// queued, checked on the server too.
func waitsFor(t *testing.T, raw *clientv3.Client, key string, keys int64, watched <-chan string, hold func() (release func()), wait func() (release func())) {
	t.Helper()
	release := hold()
	var releasing atomic.Bool
	got := make(chan func(), 1)
	go func() {
		rel := wait()
		if !releasing.Load() {
			t.Error("the waiter got the lock while the holder held it")
		}
		got <- rel
	}()
	awaitWatch(t, watched, key, got)
	waitQueued(t, raw, key, keys)
	select {
	case rel := <-got:
		rel()
		t.Fatal("the waiter got the lock while the holder held it")
	default:
	}
	releasing.Store(true)
	release()
	select {
	case rel := <-got:
		rel()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the lock within 10s of the holder's release")
	}
	if n := countKeys(t, raw, key); n != 0 {
		t.Errorf("%d keys left under the lock's name", n)
	}
}

// countKeys returns the number of keys under key's lock name.
func countKeys(t *testing.T, raw *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := raw.Get(context.Background(), etcd.LockName(testPrefix, key)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// TestSharedInterop: dlock's shared and exclusive holds and etcd's recipes
// RWMutex readers and writers on the same lock name exclude each other in
// both directions, readers of both share it, and concurrency.Mutex and
// `etcdctl lock` wait for a dlock reader (and a dlock reader for them).
func TestSharedInterop(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix) // holds
	ctx := testCtx(t)
	raw := rawClient(t, []string{srv.Endpoint()})
	// Waiters: a dlock Locker and a recipes/Mutex session on clients that
	// report the watches they create.
	wcli, dlockWatched := spyClient(t, srv.Endpoint())
	wl, err := etcd.New(ctx, wcli, &etcd.Options{Prefix: testPrefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wl.Close() })
	scli, sessionWatched := spyClient(t, srv.Endpoint())
	s, err := concurrency.NewSession(scli, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	dlockHold := func(key string, opts ...dlock.AcquireOption) func() func() {
		return func() func() {
			lease, err := l.Acquire(ctx, key, opts...)
			if err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := lease.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}
	}
	dlockWait := func(key string, opts ...dlock.AcquireOption) func() func() {
		return func() func() {
			lease, err := wl.Acquire(ctx, key, opts...)
			if err != nil {
				t.Error(err)
				return func() {}
			}
			return func() {
				if err := lease.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}
	}
	recipeLock := func(key string, read bool) func() func() {
		return func() func() {
			m := recipe.NewRWMutex(s, etcd.LockName(testPrefix, key))
			lock, unlock := m.Lock, m.Unlock
			if read {
				lock, unlock = m.RLock, m.RUnlock
			}
			if err := lock(); err != nil {
				t.Error(err)
				return func() {}
			}
			return func() {
				if err := unlock(); err != nil {
					t.Error(err)
				}
			}
		}
	}

	t.Run("recipe reader waits for dlock writer", func(t *testing.T) {
		k := "rw/1"
		waitsFor(t, raw, k, 2, sessionWatched, dlockHold(k), recipeLock(k, true))
	})
	t.Run("recipe writer waits for dlock reader", func(t *testing.T) {
		k := "rw/2"
		waitsFor(t, raw, k, 2, sessionWatched, dlockHold(k, mode.WithShared()), recipeLock(k, false))
	})
	t.Run("dlock reader waits for recipe writer", func(t *testing.T) {
		k := "rw/3"
		waitsFor(t, raw, k, 2, dlockWatched, recipeLock(k, false), dlockWait(k, mode.WithShared()))
	})
	t.Run("dlock writer waits for recipe reader", func(t *testing.T) {
		k := "rw/4"
		waitsFor(t, raw, k, 2, dlockWatched, recipeLock(k, true), dlockWait(k))
	})
	t.Run("dlock reader waits behind recipe writer waiting for dlock reader", func(t *testing.T) {
		// Writers are not starved across clients: a recipe writer queued
		// behind a dlock reader holds back a later dlock reader until it
		// has written.
		k := "rw/5"
		release := dlockHold(k, mode.WithShared())()
		wrote := make(chan func(), 1)
		go func() { wrote <- recipeLock(k, false)() }()
		awaitWatch(t, sessionWatched, k, wrote)
		var written atomic.Bool
		got := make(chan func(), 1)
		go func() {
			rel := dlockWait(k, mode.WithShared())()
			if !written.Load() {
				t.Error("the later dlock reader got in before the recipe writer queued ahead of it")
			}
			got <- rel
		}()
		awaitWatch(t, dlockWatched, k, got)
		waitQueued(t, raw, k, 3)
		release()
		var unlock func()
		select {
		case unlock = <-wrote:
		case <-time.After(10 * time.Second):
			t.Fatal("the recipe writer did not get the lock within 10s of the dlock reader's release")
		}
		select {
		case rel := <-got:
			rel()
			t.Fatal("the later dlock reader got in while the recipe writer held the lock")
		default:
		}
		written.Store(true)
		unlock()
		select {
		case rel := <-got:
			rel()
		case <-time.After(10 * time.Second):
			t.Fatal("the dlock reader did not get the lock within 10s of the recipe writer's release")
		}
	})
	t.Run("readers of both hold together", func(t *testing.T) {
		k := "rw/6"
		r := dlockHold(k, mode.WithShared())()
		rr := make(chan func(), 1)
		go func() { rr <- recipeLock(k, true)() }()
		var recipeRelease func()
		select {
		case recipeRelease = <-rr:
		case <-time.After(10 * time.Second):
			t.Fatal("recipe RLock did not get the lock held shared by dlock within 10s")
		}
		in, err := dlock.Inspect(ctx, l, k)
		if err != nil {
			t.Fatal(err)
		}
		if !in.Held || in.Shared != 2 || in.Waiters != 0 {
			t.Errorf("Inspect with a dlock and a recipe reader: %+v, want Held, Shared 2, no waiters", in)
		}
		tryNotAcquired(t, ctx, l, k)
		r()
		// The recipe reader alone: a dlock reader joins it at once.
		lease, err := l.TryAcquire(ctx, k, mode.WithShared())
		if err != nil {
			t.Fatalf("shared TryAcquire while a recipe reader holds: %v", err)
		}
		tryNotAcquired(t, ctx, l, k)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		recipeRelease()
	})
	t.Run("Mutex waits for dlock reader", func(t *testing.T) {
		k := "rw/mutex"
		m := concurrency.NewMutex(s, etcd.LockName(testPrefix, k))
		waitsFor(t, raw, k, 2, sessionWatched, func() func() {
			release := dlockHold(k, mode.WithShared())()
			if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
				t.Fatalf("Mutex.TryLock while a dlock reader holds: %v, want ErrLocked", err)
			}
			return release
		}, func() func() {
			if err := m.Lock(ctx); err != nil {
				t.Error(err)
				return func() {}
			}
			return func() {
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	})
	t.Run("dlock reader waits for Mutex", func(t *testing.T) {
		// concurrency.Mutex's keys (NAME/<lease hex>) are exclusive holders.
		k := "rw/mutex2"
		m := concurrency.NewMutex(s, etcd.LockName(testPrefix, k))
		waitsFor(t, raw, k, 2, dlockWatched, func() func() {
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if lease, err := l.TryAcquire(ctx, k, mode.WithShared()); err == nil {
				_ = lease.Release(ctx)
				t.Fatal("shared TryAcquire succeeded while a concurrency.Mutex holds")
			}
			return func() {
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
				}
			}
		}, dlockWait(k, mode.WithShared()))
	})
	t.Run("etcdctl lock waits for dlock reader", func(t *testing.T) {
		k := "rw/etcdctl"
		lease, err := l.Acquire(ctx, k, mode.WithShared())
		if err != nil {
			t.Fatal(err)
		}
		cmd, lines := etcdctlLock(t, srv.Endpoint(), etcd.LockName(testPrefix, k), `echo "$ETCD_LOCK_KEY"`, "")
		waitQueued(t, raw, k, 2)
		select {
		case line := <-lines:
			t.Fatalf("etcdctl lock ran its command while a dlock reader holds: %q", line)
		default:
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if held := recv(t, lines, 10*time.Second, "etcdctl lock"); !strings.HasPrefix(held, etcd.LockName(testPrefix, k)+"/") {
			t.Errorf("etcdctl held %q", held)
		}
		waitEtcdctl(t, cmd, lines)
	})
}

// TestSharedLayout: an exclusive hold is the key NAME/write/<lease hex>, a
// shared one NAME/read/<lease hex>; a Locker holding a key shared gets a
// second shared hold of it on a lease of its own, and its exclusive request
// for that key waits (TryAcquire refuses, a re-entrant one under the shared
// hold's ctx is ErrUpgrade).
func TestSharedLayout(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	ctx := testCtx(t)
	raw := rawClient(t, []string{srv.Endpoint()})
	const k = "layout"
	name := etcd.LockName(testPrefix, k) + "/"
	keys := func() []string {
		resp, err := raw.Get(ctx, name, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, kv := range resp.Kvs {
			ks = append(ks, strings.TrimPrefix(string(kv.Key), name))
		}
		return ks
	}

	w, err := l.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if ks := keys(); len(ks) != 1 || !strings.HasPrefix(ks[0], "write/") {
		t.Errorf("an exclusive hold's keys: %q, want one under write/", ks)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}

	r1, err := l.Acquire(ctx, k, mode.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.TryAcquire(ctx, k, mode.WithShared())
	if err != nil {
		t.Fatalf("a second shared hold from the same Locker: %v", err)
	}
	ks := keys()
	if len(ks) != 2 || !strings.HasPrefix(ks[0], "read/") || !strings.HasPrefix(ks[1], "read/") || ks[0] == ks[1] {
		t.Errorf("two shared holds' keys: %q, want two under read/", ks)
	}
	if r2.Token() <= r1.Token() {
		t.Errorf("second shared token %v not above the first's %v", r2.Token(), r1.Token())
	}
	tryNotAcquired(t, ctx, l, k)
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if lease, err := l.Acquire(wctx, k); err == nil {
		_ = lease.Release(ctx)
		t.Error("an exclusive Acquire by the shared holders' own Locker was granted")
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("exclusive Acquire under the Locker's own shared holds: %v, want it to wait until ctx ends", err)
	}
	cancel()
	if _, err := l.Acquire(dlock.ContextWithLease(ctx, r1), k, dlock.WithReentrant()); !errors.Is(err, dlock.ErrUpgrade) {
		t.Errorf("re-entrant exclusive Acquire under a shared hold: %v, want ErrUpgrade", err)
	}
	if ks := keys(); len(ks) != 2 {
		t.Errorf("keys after the refused exclusive acquires: %q, want the two shared holds only", ks)
	}
	for _, r := range []*dlock.Lease{r1, r2} {
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ks := keys(); len(ks) != 0 {
		t.Errorf("keys left: %q", ks)
	}
}

// TestSharedInspectBreak: Inspect counts the read keys older than the oldest
// other key as shared holders and describes the newest; Break ends every one
// of them and the exclusive waiter behind them gets the lock.
func TestSharedInspectBreak(t *testing.T) {
	srv := testenv.StartEtcd(t)
	dsn := srv.URL() + testPrefix
	a := openLocker(t, dsn, dlock.WithLabel("a"))
	b := openLocker(t, dsn, dlock.WithLabel("b"))
	c := openLocker(t, dsn, dlock.WithLabel("c"))
	ctx := testCtx(t)
	raw := rawClient(t, []string{srv.Endpoint()})
	const k = "shared/break"

	ra, err := a.Acquire(ctx, k, mode.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Acquire(ctx, k, mode.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan *dlock.Lease, 1)
	go func() {
		lease, err := c.Acquire(ctx, k)
		if err != nil {
			t.Error(err)
		}
		wrote <- lease
	}()
	waitQueued(t, raw, k, 3)
	// A shared waiter behind the exclusive one.
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	readDone := make(chan error, 1)
	go func() {
		lease, err := a.Acquire(rctx, k, mode.WithShared())
		if err == nil {
			_ = lease.Release(ctx)
		}
		readDone <- err
	}()
	waitQueued(t, raw, k, 4)

	in, err := dlock.Inspect(ctx, c, k)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Held || in.Shared != 2 || in.Waiters != 2 || in.Token != uint64(rb.Token()) || in.Label != "b" || in.Expires.IsZero() {
		t.Errorf("Inspect: %+v, want Held, Shared 2, Waiters 2, token %v, label b, an expiry", in, rb.Token())
	}
	list, err := dlock.List(ctx, c, "shared/")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Key != k || list[0].Shared != 2 || list[0].Waiters != 2 || list[0].Token != uint64(rb.Token()) {
		t.Errorf("List: %+v, want %q held by 2 shared holders, 2 waiters", list, k)
	}

	broke, err := dlock.Break(ctx, c, k)
	if err != nil {
		t.Fatal(err)
	}
	if broke.Shared != 2 {
		t.Errorf("Break reported %+v, want 2 shared holders", broke)
	}
	for _, r := range []*dlock.Lease{ra, rb} {
		select {
		case <-r.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a broken shared holder's lease did not end within 10s")
		}
		if !errors.Is(r.Err(), dlock.ErrLeaseLost) {
			t.Errorf("broken shared holder's Err() = %v, want ErrLeaseLost", r.Err())
		}
	}
	var w *dlock.Lease
	select {
	case w = <-wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("the exclusive waiter was not granted within 10s of the break")
	}
	if w == nil {
		t.FailNow()
	}
	if w.Token() <= rb.Token() {
		t.Errorf("token after the break %v not above the broken holders' %v", w.Token(), rb.Token())
	}
	select {
	case err := <-readDone:
		t.Fatalf("the shared waiter returned while the exclusive holder holds: %v", err)
	default:
	}
	in, err = dlock.Inspect(ctx, c, k)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Held || in.Shared != 0 || in.Waiters != 1 || in.Token != uint64(w.Token()) || in.Label != "c" {
		t.Errorf("Inspect of the exclusive holder: %+v", in)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-readDone; err != nil {
		t.Fatalf("the shared waiter after the exclusive holder left: %v", err)
	}
}
