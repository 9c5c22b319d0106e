package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/zookeeper"
)

// waitBound bounds every wait for something the test expects to happen.
const waitBound = 10 * time.Second

// watchChildren lists path's children on a children watch (an exists
// watch while path is missing: children nil) until settled reports true for
// a listing, or fails the test after waitBound, describing what it saw by
// what settled's caller last said (see waitQueue).
func watchChildren(t *testing.T, h *harness, path string, settled func(children []string, st *zk.Stat) bool, want func() string) {
	t.Helper()
	timeout := time.After(waitBound)
	for {
		children, st, ch, err := h.admin.ChildrenW(path)
		if errors.Is(err, zk.ErrNoNode) {
			var ok bool
			if ok, _, ch, err = h.admin.ExistsW(path); err == nil && ok {
				continue // created since: list it
			}
			children, st = nil, nil
		}
		if err != nil {
			t.Fatalf("watch %s: %v", path, err)
		}
		if settled(children, st) {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("%s after %v: %s", path, waitBound, want())
		}
	}
}

// waitQueue waits, on a children watch of key's node, until key's queue
// holds n lock nodes, and returns them in queue order.
func waitQueue(t *testing.T, h *harness, key string, n int) []string {
	t.Helper()
	path := zookeeper.LockPath(zookeeper.DefaultRoot, key)
	var locks []string
	watchChildren(t, h, path, func(children []string, st *zk.Stat) bool {
		locks = nil
		if st != nil {
			locks = zookeeper.SortedLocks(children, st.Cversion)
		}
		return len(locks) == n
	}, func() string { return fmt.Sprintf("%d lock nodes (%q), want %d", len(locks), locks, n) })
	return locks
}

// waitWatched waits until the server lists a watch on key's lock node: a
// waiter for that node has looked at the queue, found it must wait and set
// its watch. (The server answers "wchp" with no way to be told of changes,
// so this polls it.)
func waitWatched(t *testing.T, srv *testenv.ZooKeeper, key, node string) {
	t.Helper()
	path := zookeeper.LockPath(zookeeper.DefaultRoot, key) + "/" + node
	deadline := time.Now().Add(waitBound)
	for {
		out, err := srv.WatchedPaths()
		if err != nil {
			t.Fatalf("wchp: %v", err)
		}
		if strings.Contains(out, path+"\n") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nobody watches %s after %v; the server watches:\n%s", path, waitBound, out)
		}
		time.Sleep(10 * time.Millisecond) // polling the server's watch table, not a synchronisation
	}
}

type acquired struct {
	lease *dlock.Lease
	err   error
}

// acquireAsync starts an Acquire of key and returns where its result arrives.
func acquireAsync(ctx context.Context, l dlock.Locker, key string, opts ...dlock.AcquireOption) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, opts...)
		ch <- acquired{lease, err}
	}()
	return ch
}

// notYet fails t if ch has delivered: the waiter got the lock while the
// holder still holds it.
func notYet[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s: returned (%+v) while the lock is held against it", what, v)
	default:
	}
}

// granted waits for a waiting dlock Acquire's grant.
func granted(t *testing.T, ch <-chan acquired, what string) *dlock.Lease {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.lease
	case <-time.After(waitBound):
		t.Fatalf("%s: not granted within %v", what, waitBound)
		return nil
	}
}

func mustTryFail(t *testing.T, l dlock.Locker, key string, what string, opts ...dlock.AcquireOption) {
	t.Helper()
	lease, err := l.TryAcquire(testCtx(t), key, opts...)
	if err == nil {
		_ = lease.Release(context.Background())
		t.Fatalf("%s: TryAcquire succeeded", what)
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("%s: TryAcquire: %v, want ErrNotAcquired", what, err)
	}
}

var readerNode = regexp.MustCompile(`^_c_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-read-lock-[0-9]{10}$`)

// TestSharedInterop: dlock's shared leases (reader nodes
// "_c_<uuid>-read-lock-<seq>") queue with go-zookeeper's zk.Lock, which
// takes them for exclusive holders; dlock readers share the lock among
// themselves, a dlock writer waits for them, and a reader that arrives
// behind a waiting writer (dlock's or zk.Lock) waits for it.
func TestSharedInterop(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	h := newHarness(t, []string{srv.Addr()}, 10*time.Second)
	shared := mode.WithShared()

	t.Run("ZkLockWaitsForReader", func(t *testing.T) {
		a, b := h.NewLocker(t), h.NewLocker(t)
		k := testKey(t)
		r := mustAcquire(t, a, k, shared)
		reader := waitQueue(t, h, k, 1)[0]
		if !readerNode.MatchString(reader) {
			t.Fatalf("a shared lease's node is %q, want _c_<uuid>-read-lock-<seq>", reader)
		}
		zl := zk.NewLock(h.admin, zookeeper.LockPath(zookeeper.DefaultRoot, k), zk.WorldACL(zk.PermAll))
		locked := make(chan error, 1)
		go func() { locked <- zl.Lock() }()
		waitQueue(t, h, k, 2)
		waitWatched(t, srv, k, reader) // zk.Lock found the reader ahead and waits for it
		notYet(t, locked, "zk.Lock behind a dlock reader")
		// zk.Lock's node is an exclusive waiter: a later reader waits too.
		mustTryFail(t, b, k, "a dlock reader behind a waiting zk.Lock", shared)
		notYet(t, locked, "zk.Lock behind a dlock reader")
		mustRelease(t, r)
		select {
		case err := <-locked:
			if err != nil {
				t.Fatalf("zk.Lock: %v", err)
			}
		case <-time.After(waitBound):
			t.Fatalf("zk.Lock not granted %v after the dlock reader left", waitBound)
		}
		if err := zl.Unlock(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ReaderWaitsForZkLock", func(t *testing.T) {
		a, b := h.NewLocker(t), h.NewLocker(t)
		k := testKey(t)
		zl := zk.NewLock(h.admin, zookeeper.LockPath(zookeeper.DefaultRoot, k), zk.WorldACL(zk.PermAll))
		if err := zl.Lock(); err != nil {
			t.Fatal(err)
		}
		holder := waitQueue(t, h, k, 1)[0]
		mustTryFail(t, a, k, "a dlock reader while zk.Lock holds", shared)
		got := acquireAsync(testCtx(t), a, k, shared)
		waitQueue(t, h, k, 2)
		waitWatched(t, srv, k, holder) // the reader found zk.Lock's node ahead and waits for it
		notYet(t, got, "a dlock reader behind zk.Lock")
		if err := zl.Unlock(); err != nil {
			t.Fatal(err)
		}
		r := granted(t, got, "a dlock reader after zk.Lock's unlock")
		// A second reader shares the lock at once.
		r2, err := b.TryAcquire(testCtx(t), k, shared)
		if err != nil {
			t.Fatalf("a second dlock reader beside the first: %v", err)
		}
		if r2.Token() <= r.Token() {
			t.Errorf("second reader's token %v is not above the first's %v", r2.Token(), r.Token())
		}
		mustRelease(t, r2)
		mustRelease(t, r)
	})

	t.Run("ReadersWriterReader", func(t *testing.T) {
		a, b, c, d := h.NewLocker(t), h.NewLocker(t), h.NewLocker(t), h.NewLocker(t)
		k := testKey(t)
		ra := mustAcquire(t, a, k, shared)
		rb, err := b.TryAcquire(testCtx(t), k, shared)
		if err != nil {
			t.Fatalf("two dlock readers at once: %v", err)
		}
		in, err := dlock.Inspect(testCtx(t), c, k)
		if err != nil {
			t.Fatal(err)
		}
		if !in.Held || in.Shared != 2 || dlock.Token(in.Token) != rb.Token() || in.Waiters != 0 {
			t.Errorf("Inspect with two readers: %+v, want Held, Shared 2, the second reader's token %v, no waiters", in, rb.Token())
		}

		// A dlock writer waits for both readers.
		write := acquireAsync(testCtx(t), c, k)
		q := waitQueue(t, h, k, 3)
		waitWatched(t, srv, k, q[1]) // the writer watches the reader just before it
		notYet(t, write, "a dlock writer behind two readers")

		// A reader that arrives behind the waiting writer waits for it.
		mustTryFail(t, d, k, "a dlock reader behind a waiting writer", shared)
		read := acquireAsync(testCtx(t), d, k, shared)
		q = waitQueue(t, h, k, 4)
		waitWatched(t, srv, k, q[2]) // the late reader watches the writer
		notYet(t, read, "a dlock reader behind a waiting writer")
		if in, err := dlock.Inspect(testCtx(t), c, k); err != nil || in.Shared != 2 || in.Waiters != 2 {
			t.Errorf("Inspect with two readers, a writer and a reader waiting: %+v, %v; want Shared 2, Waiters 2", in, err)
		}

		mustRelease(t, ra)
		notYet(t, write, "a dlock writer while a reader remains")
		notYet(t, read, "a dlock reader behind a waiting writer")
		mustRelease(t, rb)
		w := granted(t, write, "the dlock writer after the readers left")
		if w.Token() <= rb.Token() {
			t.Errorf("writer's token %v is not above the readers' (%v)", w.Token(), rb.Token())
		}
		waitQueue(t, h, k, 2)
		notYet(t, read, "a dlock reader while the writer holds")
		if in, err := dlock.Inspect(testCtx(t), a, k); err != nil || in.Shared != 0 || dlock.Token(in.Token) != w.Token() || in.Waiters != 1 {
			t.Errorf("Inspect with the writer holding, a reader waiting: %+v, %v; want Shared 0, the writer's token, Waiters 1", in, err)
		}
		mustRelease(t, w)
		r := granted(t, read, "the late dlock reader after the writer left")
		if r.Token() <= w.Token() {
			t.Errorf("late reader's token %v is not above the writer's %v", r.Token(), w.Token())
		}
		mustRelease(t, r)
	})

	t.Run("OneLocker", func(t *testing.T) {
		a := h.NewLocker(t)
		k := testKey(t)
		r1 := mustAcquire(t, a, k, shared)
		r2, err := a.TryAcquire(testCtx(t), k, shared)
		if err != nil {
			t.Fatalf("a second shared lease of the key from the same Locker: %v", err)
		}
		if q := waitQueue(t, h, k, 2); !readerNode.MatchString(q[0]) || !readerNode.MatchString(q[1]) {
			t.Errorf("two shared leases of one Locker: nodes %q, want two reader nodes", q)
		}
		// Exclusive under its own shared holds: it would wait for itself.
		mustTryFail(t, a, k, "an exclusive TryAcquire of a key the Locker holds shared")
		ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
		_, err = a.Acquire(ctx, k)
		cancel()
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("an exclusive Acquire of a key the Locker holds shared: %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		rctx := dlock.ContextWithLease(testCtx(t), r1)
		if _, err := a.Acquire(rctx, k, dlock.WithReentrant()); !errors.Is(err, dlock.ErrUpgrade) {
			t.Errorf("a re-entrant exclusive Acquire under a shared hold: %v, want ErrUpgrade", err)
		}
		mustRelease(t, r2)
		mustRelease(t, r1)
		waitQueue(t, h, k, 0)
	})

	t.Run("BreakEndsEveryReader", func(t *testing.T) {
		a, b, c := h.NewLocker(t), h.NewLocker(t), h.NewLocker(t)
		k := testKey(t)
		ra := mustAcquire(t, a, k, shared)
		rb := mustAcquire(t, b, k, shared)
		write := acquireAsync(testCtx(t), c, k)
		waitQueue(t, h, k, 3)
		in, err := dlock.Break(testCtx(t), c, k)
		if err != nil {
			t.Fatalf("Break: %v", err)
		}
		if in.Shared != 2 {
			t.Errorf("Break of a lock held by two readers: %+v, want Shared 2", in)
		}
		w := granted(t, write, "the writer after the readers were broken")
		if w.Token() <= rb.Token() {
			t.Errorf("writer's token %v is not above the broken readers' (%v)", w.Token(), rb.Token())
		}
		for _, r := range []*dlock.Lease{ra, rb} {
			if err := r.Refresh(testCtx(t)); err == nil {
				t.Errorf("a broken reader's Refresh succeeded")
			}
		}
		mustRelease(t, w)
	})
}
