package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/mode"
	"github.com/dlock-go/dlock/internal/testenv"
)

// room returns the keys in the waiting room of semaphore name (the keys
// under the lock name of name + "/permits/").
func room(t *testing.T, raw *clientv3.Client, name string) []string {
	t.Helper()
	resp, err := raw.Get(testCtx(t), etcd.LockName(testPrefix, name+"/permits/")+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

// waitRoom returns once semaphore name's waiting room has n keys. The
// server announces nothing a test could wait on here, so it reads the room
// every few milliseconds, for 10s at most.
func waitRoom(t *testing.T, raw *clientv3.Client, name string, n int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); len(room(t, raw, name)) != n; {
		if time.Now().After(end) {
			t.Fatalf("the waiting room of %q has %q, want %d keys", name, room(t, raw, name), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSemaphoreLayout: a permit is one key under the lock name of its slot
// key, NAME/permits/i, valued "permits=<n> <label>", whose create revision
// is the token; Inspect and List show it under the slot key with its label.
func TestSemaphoreLayout(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	raw := rawClient(t, []string{srv.Endpoint()})
	ctx := testCtx(t)
	var held []*dlock.Lease
	for i := range 3 {
		p, err := l.TryAcquire(ctx, "layout", mode.WithPermits(3), dlock.WithLabel(fmt.Sprintf("worker %d", i)))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
		if want := backend.PermitKey("layout", i); p.Key() != want {
			t.Errorf("permit %d on %q, want %q (the lowest free slot)", i, p.Key(), want)
		}
		resp, err := raw.Get(ctx, etcd.LockName(testPrefix, p.Key())+"/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 {
			t.Fatalf("slot %d has %d keys under its lock name, want 1", i, len(resp.Kvs))
		}
		kv := resp.Kvs[0]
		if got, want := string(kv.Value), fmt.Sprintf("permits=3 worker %d", i); got != want {
			t.Errorf("slot %d's key %s has value %q, want %q", i, kv.Key, got, want)
		}
		if uint64(kv.CreateRevision) != uint64(p.Token()) {
			t.Errorf("slot %d: token %v, key's create revision %d", i, p.Token(), kv.CreateRevision)
		}
		if kv.Lease == 0 {
			t.Errorf("slot %d's key has no lease", i)
		}
		in, err := dlock.Inspect(ctx, l, p.Key())
		if err != nil {
			t.Fatal(err)
		}
		if !in.Held || in.Token != uint64(p.Token()) || in.Label != fmt.Sprintf("worker %d", i) {
			t.Errorf("Inspect(%q) = %+v, want held with token %v and label %q", p.Key(), in, p.Token(), fmt.Sprintf("worker %d", i))
		}
	}
	if err := held[1].SetLabel(ctx, "relabelled"); err != nil {
		t.Fatal(err)
	}
	if resp, err := raw.Get(ctx, etcd.LockName(testPrefix, held[1].Key())+"/", clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "permits=3 relabelled" {
		t.Fatalf("after SetLabel, slot 1's keys: %v (%v), want one valued %q", resp.Kvs, err, "permits=3 relabelled")
	}
	infos, err := dlock.List(ctx, l, "layout")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, in := range infos {
		keys = append(keys, in.Key+"="+in.Label)
	}
	if got, want := strings.Join(keys, ","), "layout/permits/0=worker 0,layout/permits/1=relabelled,layout/permits/2=worker 2"; got != want {
		t.Errorf("List: %s, want %s", got, want)
	}
	// Still counted with its new label: a fourth permit is refused.
	if p, err := l.TryAcquire(ctx, "layout", mode.WithPermits(3)); !errors.Is(err, dlock.ErrNotAcquired) {
		if err == nil {
			_ = p.Release(ctx)
		}
		t.Fatalf("a fourth permit of 3: %v, want ErrNotAcquired", err)
	}
	for _, p := range held {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := raw.Get(ctx, etcd.LockName(testPrefix, "layout/permits/"), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("after the releases: %v keys left under the semaphore (%v)", resp.Count, err)
	}
}

// TestSemaphoreRequests: an uncontended permit (a free slot among the
// first eight, nobody waiting) is one transaction, its release one delete;
// a waiter queues with two transactions (the try, which reads the
// semaphore, and its key in the room) and is granted with one after the
// release that frees its slot. The figures are logged.
func TestSemaphoreRequests(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l, c := countingLocker(t, srv)
	ctx := testCtx(t)
	const cycles = 50
	// The shared lease is granted by the first acquire; count from the next.
	warm, err := l.Acquire(ctx, "requests/warm", dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = warm.Release(ctx) }()
	c.reset()
	var held []*dlock.Lease
	for i := range cycles {
		// Up to 5 permits held at once: grants of slot 0 of an empty
		// semaphore and of slots 1–4 beside other holders.
		p, err := l.Acquire(ctx, "requests", mode.WithPermits(5), dlock.WithAutoRenew(false))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
		if len(held) == 5 || i == cycles-1 {
			for _, p := range held {
				if err := p.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			held = held[:0]
		}
	}
	// The driver's loss watch (one stream for every lease it holds) opens
	// once, 20ms after the first grant: it is not counted.
	txns, dels, all := c.get(rpcTxn), c.get("/etcdserverpb.KV/DeleteRange"), c.total()-c.get("/etcdserverpb.Watch/Watch")
	t.Logf("%d uncontended permits: %d transactions, %d deletes, %d requests in all but the loss watch: %.2f requests per grant and release",
		cycles, txns, dels, all, float64(all)/cycles)
	if txns != cycles || dels != cycles || all != 2*cycles {
		t.Errorf("%d uncontended permits: %d transactions, %d deletes, %d requests; want one transaction per grant and one delete per release", cycles, txns, dels, all)
	}

	// A hand-off: the waiter's grant is one transaction after the release.
	holder := openLocker(t, srv.URL()+testPrefix)
	h, err := holder.Acquire(ctx, "handoff", mode.WithPermits(1))
	if err != nil {
		t.Fatal(err)
	}
	raw := rawClient(t, []string{srv.Endpoint()})
	c.reset()
	got := make(chan *dlock.Lease, 1)
	go func() {
		p, err := l.Acquire(ctx, "handoff", mode.WithPermits(1))
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitRoom(t, raw, "handoff", 1)
	queued := c.get(rpcTxn)
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p := <-got
	if p == nil {
		return
	}
	defer func() { _ = p.Release(ctx) }()
	t.Logf("a waiting permit: %d transactions to queue (a try that read, the waiting key), %d after the release, %d requests in all (watch streams included)",
		queued, c.get(rpcTxn)-queued, c.total())
	if queued != 2 || c.get(rpcTxn)-queued != 1 {
		t.Errorf("a waiting permit sent %d transactions to queue and %d after the release; want 2 and 1", queued, c.get(rpcTxn)-queued)
	}
	if p.Token() <= h.Token() || p.Key() != h.Key() {
		t.Errorf("hand-off: %s token %v after %s token %v", p.Key(), p.Token(), h.Key(), h.Token())
	}
}

// TestSemaphoreForeignHolder: a client that locks a slot's lock name
// (concurrency.Mutex, `etcdctl lock`) holds that slot: it counts toward n,
// dlock's permits take the other slots, and its unlock wakes a waiter. A
// dlock permit likewise holds off the Mutex.
func TestSemaphoreForeignHolder(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	raw := rawClient(t, []string{srv.Endpoint()})
	ctx := testCtx(t)
	ses, err := concurrency.NewSession(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer ses.Close()
	m := concurrency.NewMutex(ses, etcd.LockName(testPrefix, backend.PermitKey("foreign", 0)))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := l.TryAcquire(ctx, "foreign", mode.WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	if a.Key() != backend.PermitKey("foreign", 1) {
		t.Errorf("the permit took %q while the Mutex holds slot 0", a.Key())
	}
	if p, err := l.TryAcquire(ctx, "foreign", mode.WithPermits(2)); !errors.Is(err, dlock.ErrNotAcquired) {
		if err == nil {
			_ = p.Release(ctx)
		}
		t.Fatalf("a permit beside the Mutex and a permit of 2: %v, want ErrNotAcquired", err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		p, err := l.Acquire(ctx, "foreign", mode.WithPermits(2))
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitRoom(t, raw, "foreign", 1)
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-got
	if b == nil {
		return
	}
	if b.Key() != backend.PermitKey("foreign", 0) {
		t.Errorf("the waiter took %q after the Mutex left slot 0", b.Key())
	}
	// A dlock permit holds off the Mutex.
	if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("Mutex.TryLock of slot 0 held by a permit: %v, want ErrLocked", err)
	}
	for _, p := range []*dlock.Lease{a, b} {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSemaphoreSizeMismatch: a holder's or a waiter's n is recorded in its
// key's value; a try or a wait that uses another n is refused with
// ErrSizeMismatch naming it, and leaves no key.
func TestSemaphoreSizeMismatch(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	raw := rawClient(t, []string{srv.Endpoint()})
	ctx := testCtx(t)
	a, err := l.Acquire(ctx, "size", mode.WithPermits(1))
	if err != nil {
		t.Fatal(err)
	}
	for _, wait := range []bool{false, true} {
		acquire := l.TryAcquire
		if wait {
			acquire = l.Acquire
		}
		for _, n := range []int{2, 3} { // slot 0 held, and a free slot for n
			_, err := acquire(ctx, "size", mode.WithPermits(n))
			if !errors.Is(err, dlock.ErrSizeMismatch) || !strings.Contains(err.Error(), "uses 1 permits") {
				t.Fatalf("wait=%v: a permit of %d while the holder uses 1: %v, want ErrSizeMismatch naming 1", wait, n, err)
			}
		}
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A waiter's n counts too: behind another client's holder of slot 0,
	// whose key records no n.
	ses, err := concurrency.NewSession(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer ses.Close()
	m := concurrency.NewMutex(ses, etcd.LockName(testPrefix, backend.PermitKey("size", 0)))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		p, err := l.Acquire(wctx, "size", mode.WithPermits(1))
		if err == nil {
			_ = p.Release(ctx)
		}
		got <- err
	}()
	waitRoom(t, raw, "size", 1)
	if _, err := l.TryAcquire(ctx, "size", mode.WithPermits(2)); !errors.Is(err, dlock.ErrSizeMismatch) {
		t.Fatalf("a permit of 2 while a waiter uses 1: %v, want ErrSizeMismatch", err)
	}
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled waiter: %v", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if left := room(t, raw, "size"); len(left) != 0 {
		t.Fatalf("keys left in the waiting room: %q", left)
	}
	if resp, err := raw.Get(ctx, etcd.LockName(testPrefix, "size/permits/"), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("%v keys left under the semaphore (%v)", resp.Count, err)
	}
}

// TestSemaphoreFIFO: waiters for a full semaphore are granted in the order
// they queued, each when a permit is released, and a cancelled waiter
// leaves the room empty behind it. With a slot free and a waiter in the
// room (another client's key), a try fails and a wait queues behind it
// until it leaves.
func TestSemaphoreFIFO(t *testing.T) {
	srv := testenv.StartEtcd(t)
	raw := rawClient(t, []string{srv.Endpoint()})
	ctx := testCtx(t)
	holder := openLocker(t, srv.URL()+testPrefix)
	h, err := holder.Acquire(ctx, "fifo", mode.WithPermits(1))
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 4
	order := make(chan int, waiters)
	leases := make([]*dlock.Lease, waiters)
	cancelled := 2 // this one gives up while it waits
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	for i := range waiters {
		l := openLocker(t, srv.URL()+testPrefix)
		go func() {
			actx := ctx
			if i == cancelled {
				actx = wctx
			}
			p, err := l.Acquire(actx, "fifo", mode.WithPermits(1))
			if i == cancelled {
				done <- err
				return
			}
			if err != nil {
				t.Error(err)
				order <- -1
				return
			}
			leases[i] = p
			order <- i
		}()
		waitRoom(t, raw, "fifo", i+1)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	waitRoom(t, raw, "fifo", waiters-1)
	prev := h
	for want := range waiters {
		if want == cancelled {
			continue
		}
		if err := prev.Release(ctx); err != nil {
			t.Fatal(err)
		}
		got := <-order
		if got != want {
			t.Fatalf("waiter %d granted, want %d (the order they queued in)", got, want)
		}
		if leases[got].Token() <= prev.Token() {
			t.Errorf("waiter %d's token %v not above %v", got, leases[got].Token(), prev.Token())
		}
		prev = leases[got]
	}
	if err := prev.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if resp, err := raw.Get(ctx, etcd.LockName(testPrefix, "fifo/permits/"), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("%v keys left under the semaphore (%v)", resp.Count, err)
	}

	// Nobody overtakes a waiter, even with a slot free: behind another
	// client's key in the room, a try fails and a wait queues.
	foreign := etcd.LockName(testPrefix, "fifo/permits/") + "/foreign-1"
	if _, err := raw.Put(ctx, foreign, "permits=1 foreign"); err != nil {
		t.Fatal(err)
	}
	l := openLocker(t, srv.URL()+testPrefix)
	if p, err := l.TryAcquire(ctx, "fifo", mode.WithPermits(1)); !errors.Is(err, dlock.ErrNotAcquired) {
		if err == nil {
			_ = p.Release(ctx)
		}
		t.Fatalf("a try with the slot free and a waiter in the room: %v, want ErrNotAcquired", err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		p, err := l.Acquire(ctx, "fifo", mode.WithPermits(1))
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitRoom(t, raw, "fifo", 2)
	if _, err := raw.Delete(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	if p := <-got; p != nil {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSemaphoreWaiterIgnoresOtherWrites: the head of the waiting room waits
// on a watch of the slots, not on the cluster's revision: writes elsewhere
// while it waits (and while its watch starts) cost it no request beyond one
// read of the slots per watch started.
func TestSemaphoreWaiterIgnoresOtherWrites(t *testing.T) {
	srv := testenv.StartEtcd(t)
	raw := rawClient(t, []string{srv.Endpoint()})
	ctx := testCtx(t)
	holder := openLocker(t, srv.URL()+testPrefix)
	h, err := holder.Acquire(ctx, "busy", mode.WithPermits(1))
	if err != nil {
		t.Fatal(err)
	}
	// Writes elsewhere, from before the waiter comes until well after.
	puts := make(chan int, 1)
	stop := make(chan struct{})
	go func() {
		n := 0
		defer func() { puts <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := raw.Put(ctx, "/elsewhere/k", strconv.Itoa(n)); err != nil {
				t.Error(err)
				return
			}
			n++
		}
	}()
	l, c := countingLocker(t, srv)
	got := make(chan *dlock.Lease, 1)
	go func() {
		p, err := l.Acquire(ctx, "busy", mode.WithPermits(1))
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitRoom(t, raw, "busy", 1)
	for range 100 { // a hundred more writes elsewhere, seen by the waiter's watch's server
		if _, err := raw.Put(ctx, "/elsewhere/sync", "x"); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	t.Logf("%d writes elsewhere while the waiter queued and waited: it sent %d transactions, %d reads", <-puts+100, c.get(rpcTxn), c.get("/etcdserverpb.KV/Range"))
	if got := c.get(rpcTxn); got != 2 {
		t.Errorf("the waiter sent %d transactions while writes went on elsewhere, want 2 (its try and its key in the room)", got)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if p := <-got; p != nil {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSemaphoreManySlots: beyond the eight slots the first transaction
// names, a free slot is found from what it read and claimed by a second;
// every slot is granted once, the lowest free first, and a permit too many
// is refused.
func TestSemaphoreManySlots(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l, c := countingLocker(t, srv)
	ctx := testCtx(t)
	const n = 11
	held := make([]*dlock.Lease, n)
	for i := range n {
		c.reset()
		p, err := l.TryAcquire(ctx, "many", mode.WithPermits(n))
		if err != nil {
			t.Fatalf("permit %d of %d: %v", i, n, err)
		}
		if want := backend.PermitKey("many", i); p.Key() != want {
			t.Fatalf("permit %d on %q, want %q", i, p.Key(), want)
		}
		want := 1
		if i >= 8 {
			want = 2
		}
		if got := c.get(rpcTxn); got != want {
			t.Errorf("permit of slot %d: %d transactions, want %d", i, got, want)
		}
		held[i] = p
	}
	if p, err := l.TryAcquire(ctx, "many", mode.WithPermits(n)); !errors.Is(err, dlock.ErrNotAcquired) {
		if err == nil {
			_ = p.Release(ctx)
		}
		t.Fatalf("permit %d of %d: %v, want ErrNotAcquired", n+1, n, err)
	}
	for _, i := range []int{9, 3} { // freed beyond the first eight, then among them
		if err := held[i].Release(ctx); err != nil {
			t.Fatal(err)
		}
		p, err := l.TryAcquire(ctx, "many", mode.WithPermits(n))
		if err != nil {
			t.Fatalf("after slot %d was released: %v", i, err)
		}
		if p.Key() != held[i].Key() || p.Token() <= held[i].Token() {
			t.Errorf("after slot %d (token %v) was released, the permit took %q with token %v", i, held[i].Token(), p.Key(), p.Token())
		}
		held[i] = p
	}
	for _, p := range held {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
