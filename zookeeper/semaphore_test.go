package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/semaphore"
	"github.com/dlock-go/dlock/zookeeper"
)

// leasesPath is the parent of the lease nodes of the semaphore name, in the
// layout of Curator's InterProcessSemaphoreV2.
func leasesPath(name string) string {
	return zookeeper.LockPath(zookeeper.DefaultRoot, name) + "/leases"
}

// waitLeases waits, on a children watch, until the semaphore name has n
// lease nodes, and returns their names with their data.
func waitLeases(t *testing.T, h *harness, name string, n int) map[string]string {
	t.Helper()
	path := leasesPath(name)
	var seen []string
	var nodes map[string]string
	watchChildren(t, h, path, func(children []string, _ *zk.Stat) bool {
		seen, nodes = children, nil
		if len(children) != n {
			return false
		}
		nodes = map[string]string{}
		for _, c := range children {
			data, _, err := h.admin.Get(path + "/" + c)
			if errors.Is(err, zk.ErrNoNode) {
				return false // gone since the listing: the watch fires
			}
			if err != nil {
				t.Fatalf("read %s/%s: %v", path, c, err)
			}
			nodes[c] = string(data)
		}
		return true
	}, func() string { return fmt.Sprintf("%d lease nodes (%q), want %d", len(seen), seen, n) })
	return nodes
}

func newSemaphore(t *testing.T, l dlock.Locker, name string, n int) *semaphore.Semaphore {
	t.Helper()
	sem, err := semaphore.New(l, name, n)
	if err != nil {
		t.Fatal(err)
	}
	if !sem.Native() {
		t.Fatal("a semaphore on ZooKeeper is not in the driver's own layout")
	}
	return sem
}

type permitted struct {
	p   *semaphore.Permit
	err error
}

func acquirePermitAsync(ctx context.Context, sem *semaphore.Semaphore) <-chan permitted {
	ch := make(chan permitted, 1)
	go func() {
		p, err := sem.Acquire(ctx)
		ch <- permitted{p, err}
	}()
	return ch
}

func permitGranted(t *testing.T, ch <-chan permitted, what string) *semaphore.Permit {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.p
	case <-time.After(waitBound):
		t.Fatalf("%s: not granted within %v", what, waitBound)
		return nil
	}
}

func mustTryFailPermit(t *testing.T, sem *semaphore.Semaphore, what string) {
	t.Helper()
	p, err := sem.TryAcquire(testCtx(t))
	if err == nil {
		_ = p.Release(context.Background())
		t.Fatalf("%s: TryAcquire succeeded (slot %d)", what, p.Slot())
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("%s: TryAcquire: %v, want ErrNotAcquired", what, err)
	}
}

func mustReturn(t *testing.T, p *semaphore.Permit) {
	t.Helper()
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// testCuratorSemaphore is TestCurator's Semaphore* subtests: dlock's
// semaphores and Curator's InterProcessSemaphoreV2 on the same path count
// each other's leases toward the same n, in both directions, and never hold
// more than n between them.
func testCuratorSemaphore(t *testing.T, h *harness, peers *curatorPeers) {
	path := func(name string) string { return zookeeper.LockPath(zookeeper.DefaultRoot, name) }

	t.Run("SemaphoreCuratorHolds", func(t *testing.T) {
		cur := peers.on(t)
		name := testKey(t)
		a := newSemaphore(t, h.NewLocker(t), name, 2)
		b := newSemaphore(t, h.NewLocker(t), name, 2)
		cur.do("semaphore c1 "+path(name)+" 2", "ok c1")
		cur.do("lease c1", "leased c1")
		cur.do("lease c1", "leased c1")
		for c, data := range waitLeases(t, h, name, 2) {
			if !curatorLease.MatchString(c) || strings.HasPrefix(data, "slot=") {
				t.Fatalf("Curator's lease node %q (data %q)", c, data)
			}
		}
		mustTryFailPermit(t, a, "dlock while Curator holds both permits")

		got := acquirePermitAsync(testCtx(t), a)
		// dlock's waiting lease node counts, as Curator's do; it names no
		// slot while it waits. (Whether the waiter has set its children
		// watch yet cannot be seen: the server's wchp lists data watches
		// only. It need not have: it lists the leases after its node is
		// made, so a return before then is counted.)
		for c, data := range waitLeases(t, h, name, 3) {
			if strings.HasPrefix(data, "permits=2 ") {
				t.Logf("dlock's waiting lease node %s: %q", c, data)
			}
		}
		notYet(t, got, "dlock while Curator holds both permits")
		mustTryFailPermit(t, b, "a second dlock while the first waits")
		cur.do("return c1", "returned c1")
		p := permitGranted(t, got, "dlock after Curator returned a lease")
		if p.Slot() != 0 || p.Key() != semaphore.SlotKey(name, 0) {
			t.Errorf("dlock's permit beside Curator's lease: slot %d, key %q; want slot 0 (Curator's leases hold no slot)", p.Slot(), p.Key())
		}
		nodes := waitLeases(t, h, name, 2)
		if got := cur.ask("leases c1"); len(strings.Split(got, ",")) != 2 {
			t.Errorf("Curator's participant nodes %q, want 2", got)
		}
		mustTryFailPermit(t, b, "dlock with one Curator lease and one dlock permit of 2")
		cur.do("semaphore c2 "+path(name)+" 2", "ok c2")
		cur.do("lease c2 200", "notleased c2")
		mustReturn(t, p)
		cur.do("lease c2 5000", "leased c2")
		t.Logf("leases: %v", nodes)
		cur.do("return c1", "returned c1")
		cur.do("return c2", "returned c2")
		waitLeases(t, h, name, 0)
	})

	t.Run("SemaphoreDlockHolds", func(t *testing.T) {
		cur := peers.on(t)
		name := testKey(t)
		a := newSemaphore(t, h.NewLocker(t), name, 2)
		b := newSemaphore(t, h.NewLocker(t), name, 2)
		pa, err := a.Acquire(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		pb, err := b.Acquire(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if pa.Slot() == pb.Slot() {
			t.Fatalf("two dlock permits on slot %d", pa.Slot())
		}
		cur.do("semaphore c3 "+path(name)+" 2", "ok c3")
		cur.do("lease c3 300", "notleased c3")
		waitLeases(t, h, name, 2) // Curator's try left no node

		cur.send("lease c3")
		waitLeases(t, h, name, 3) // Curator's waiting lease node
		cur.quiet("Curator while dlock holds both permits")
		mustReturn(t, pa)
		cur.expect("leased c3")
		mustTryFailPermit(t, a, "dlock while Curator and dlock hold both permits")
		pc, err := a.TryAcquire(context.Background())
		if err == nil {
			t.Fatalf("a third permit of 2: slot %d", pc.Slot())
		}
		cur.do("return c3", "returned c3")
		pc, err = a.Acquire(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if pc.Slot() != pa.Slot() || pc.Token() <= pa.Token() {
			t.Errorf("the freed slot %d (token %v) went as slot %d with token %v", pa.Slot(), pa.Token(), pc.Slot(), pc.Token())
		}
		mustReturn(t, pc)
		mustReturn(t, pb)
		waitLeases(t, h, name, 0)
	})

	t.Run("SemaphoreNeverMoreThanN", func(t *testing.T) {
		// A Curator client and three dlock lockers take and return permits
		// of 2 side by side. Each holder counts itself from the moment it
		// knows it holds a permit to the moment it gives it back (a part of
		// its real hold), so a count above 2 is a real overlap.
		cur := peers.on(t)
		name := testKey(t)
		const n, rounds = 2, 12
		var inside, most atomic.Int32
		enter := func(who string) {
			in := inside.Add(1)
			for m := most.Load(); in > m && !most.CompareAndSwap(m, in); m = most.Load() {
			}
			if in > n {
				t.Errorf("%s: %d holders at once, the semaphore has %d permits", who, in, n)
			}
		}
		ctx := testCtx(t)
		var wg sync.WaitGroup
		for range 3 {
			sem := newSemaphore(t, h.NewLocker(t), name, n)
			wg.Go(func() {
				for range rounds {
					p, err := sem.Acquire(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					enter("dlock")
					time.Sleep(20 * time.Millisecond) // the work: lets holders overlap
					inside.Add(-1)
					if err := p.Release(context.Background()); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		cur.do("semaphore c4 "+path(name)+" 2", "ok c4")
		for range rounds {
			cur.send("lease c4")
			cur.expectWithin(time.Minute, "leased c4")
			enter("Curator")
			time.Sleep(20 * time.Millisecond)
			inside.Add(-1)
			cur.do("return c4", "returned c4")
		}
		wg.Wait()
		t.Logf("at most %d of %d permits held at once", most.Load(), n)
		if most.Load() < 2 {
			t.Errorf("at most %d holder at once: the permits were never held side by side", most.Load())
		}
		waitLeases(t, h, name, 0)
	})
}

// curatorLease is the name of a lease node of Curator's
// InterProcessSemaphoreV2 (protected mode), which dlock's share.
var curatorLease = regexp.MustCompile(`^_c_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-lease-[0-9]{10}$`)

// TestSemaphore checks what the suite cannot see of the driver's own
// semaphore layout: a permit's slot and token as its node records them, a
// foreign lease node counted without a slot, and a permit lost with its
// session.
func TestSemaphore(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	h := newHarness(t, []string{srv.Addr()}, 10*time.Second)

	t.Run("Slots", func(t *testing.T) {
		name := testKey(t)
		ctx := testCtx(t)
		sems := make([]*semaphore.Semaphore, 3)
		ps := make([]*semaphore.Permit, 3)
		for i := range sems {
			sems[i] = newSemaphore(t, h.NewLocker(t), name, 3)
			p, err := sems[i].Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The lowest free slot, in the order they were granted.
			if p.Slot() != i || p.Key() != semaphore.SlotKey(name, i) {
				t.Fatalf("permit %d: slot %d key %q, want slot %d", i, p.Slot(), p.Key(), i)
			}
			ps[i] = p
		}
		// Each node records its slot and n; its czxid is the token.
		nodes := waitLeases(t, h, name, 3)
		for c, data := range nodes {
			_, st, err := h.admin.Get(leasesPath(name) + "/" + c)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(ps, func(p *semaphore.Permit) bool { return uint64(st.Czxid) == uint64(p.Token()) })
			if i < 0 || !curatorLease.MatchString(c) || !strings.HasPrefix(data, "slot="+strconv.Itoa(i)+" permits=3 ") {
				t.Errorf("lease node %s (czxid %d): data %q; permits %v", c, st.Czxid, data, ps)
			}
		}
		if _, err := newSemaphore(t, h.NewLocker(t), name, 4).TryAcquire(ctx); !errors.Is(err, semaphore.ErrSizeMismatch) {
			t.Errorf("a semaphore of 4 while holders use 3: %v, want ErrSizeMismatch", err)
		}
		// A freed slot goes to the next acquirer, with a higher token: a
		// guard keyed by the slot rejects the old holder.
		var guard fencing.Guard
		for _, p := range ps {
			if err := guard.Do(p.Key(), p.Token(), func() error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
		mustReturn(t, ps[1])
		q, err := sems[0].Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if q.Key() != ps[1].Key() {
			t.Fatalf("the freed slot was %q, the next permit took %q", ps[1].Key(), q.Key())
		}
		if err := guard.Do(q.Key(), q.Token(), func() error { return nil }); err != nil {
			t.Fatalf("the new holder of slot 1: %v", err)
		}
		var stale *fencing.StaleTokenError
		if err := guard.Do(ps[1].Key(), ps[1].Token(), func() error { return nil }); !errors.As(err, &stale) {
			t.Fatalf("the old holder of slot 1: %v, want a StaleTokenError", err)
		}
		for _, p := range []*semaphore.Permit{ps[0], ps[2], q} {
			mustReturn(t, p)
		}
		waitLeases(t, h, name, 0)
	})

	t.Run("InspectListBreakSlots", func(t *testing.T) {
		// A permit's slot key reads as the lease node that holds it: Inspect
		// and List show its token and label, Break deletes that node, the
		// holder learns of it, and the slot's next token is higher.
		name := testKey(t)
		ctx := testCtx(t)
		l := h.NewLocker(t)
		sem := newSemaphore(t, l, name, 3)
		ps, err := sem.AcquireN(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		waiter := newSemaphore(t, h.NewLocker(t), name, 3)
		third, err := waiter.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := acquirePermitAsync(ctx, waiter)
		waitLeases(t, h, name, 4)
		for _, p := range ps {
			info, err := dlock.Inspect(ctx, l, p.Key())
			if err != nil {
				t.Fatal(err)
			}
			if !info.Held || info.Key != p.Key() || info.Token != uint64(p.Token()) || info.Label != dlock.DefaultLabel || info.Waiters != 1 {
				t.Errorf("Inspect(%q) = %+v, want held, token %d, label %q, 1 waiter", p.Key(), info, p.Token(), dlock.DefaultLabel)
			}
		}
		if info, err := dlock.Inspect(ctx, l, semaphore.SlotKey(name, 7)); err != nil || info.Held {
			t.Errorf("Inspect of a slot nobody holds: %+v, %v", info, err)
		}
		for _, prefix := range []string{name, name + "/", name + "/permits/", semaphore.SlotKey(name, 1)} {
			infos, err := dlock.List(ctx, l, prefix)
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, info := range infos {
				keys = append(keys, info.Key)
			}
			// The waiter holds the semaphore's queue lock while it waits.
			want := []string{semaphore.SlotKey(name, 0), semaphore.SlotKey(name, 1), semaphore.SlotKey(name, 2), name + "/permits/queue"}
			if prefix == semaphore.SlotKey(name, 1) {
				want = want[1:2]
			}
			if !slices.Equal(keys, want) {
				t.Errorf("List(%q) = %q, want %q", prefix, keys, want)
			}
		}
		broken := ps[1]
		if _, err := dlock.Break(ctx, l, broken.Key()); err != nil {
			t.Fatalf("Break(%q): %v", broken.Key(), err)
		}
		waitDone(t, broken.Lease(), 5*time.Second, "the broken permit")
		if err := broken.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
			t.Errorf("the broken permit's Err: %v, want ErrLeaseLost", err)
		}
		q := permitGranted(t, got, "the waiter after the break")
		if q.Key() != broken.Key() || q.Token() <= broken.Token() {
			t.Errorf("after the break: %q token %d, want the broken slot %q with a token above %d", q.Key(), q.Token(), broken.Key(), broken.Token())
		}
		if _, err := dlock.Break(ctx, l, semaphore.SlotKey(name, 7)); !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("Break of a slot nobody holds: %v, want ErrNotHeld", err)
		}
		for _, p := range []*semaphore.Permit{ps[0], third, q} {
			mustReturn(t, p)
		}
		waitLeases(t, h, name, 0)
	})

	t.Run("ForeignLeaseCountsWithoutSlot", func(t *testing.T) {
		// A lease node dlock cannot read (another client's; Curator's
		// carries its holder's address) counts toward n and holds no slot.
		name := testKey(t)
		if err := ensurePath(h.admin, leasesPath(name)); err != nil {
			t.Fatal(err)
		}
		foreign, err := h.admin.Create(leasesPath(name)+"/_c_00000000-0000-0000-0000-000000000000-lease-", []byte("10.0.0.7"), zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
		if err != nil {
			t.Fatal(err)
		}
		sem := newSemaphore(t, h.NewLocker(t), name, 2)
		p, err := sem.TryAcquire(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if p.Slot() != 0 {
			t.Errorf("beside a foreign lease: slot %d, want 0", p.Slot())
		}
		mustTryFailPermit(t, newSemaphore(t, h.NewLocker(t), name, 2), "a foreign lease and a dlock permit of 2")
		got := acquirePermitAsync(testCtx(t), newSemaphore(t, h.NewLocker(t), name, 2))
		waitLeases(t, h, name, 3)
		notYet(t, got, "dlock behind a foreign lease and a dlock permit of 2")
		if err := h.admin.Delete(foreign, -1); err != nil {
			t.Fatal(err)
		}
		q := permitGranted(t, got, "dlock after the foreign lease went")
		if q.Slot() != 1 {
			t.Errorf("the second dlock permit: slot %d, want 1", q.Slot())
		}
		mustReturn(t, q)
		mustReturn(t, p)
	})

	t.Run("SessionExpiry", func(t *testing.T) {
		// The holder's session expires: the server deletes its lease nodes,
		// each permit's Done closes at once (the session's loss signal, no
		// renewal needed), and the slots go to the next acquirers with
		// higher tokens.
		name := testKey(t)
		a := newSemaphore(t, h.NewLocker(t), name, 2)
		ps, err := a.AcquireN(testCtx(t), 2)
		if err != nil {
			t.Fatal(err)
		}
		acquired := time.Now()
		b := newSemaphore(t, h.NewLocker(t), name, 2)
		got := acquirePermitAsync(testCtx(t), b)
		waitLeases(t, h, name, 3)
		h.Expire(t, ps[0].Key())
		for _, p := range ps {
			// The lease's TTL is 15s and its first renewal 5s after its
			// grant: only the session's loss signal closes Done within 3s of
			// the expiry. It comes when the driver, whose dials Expire
			// blocked, reconnects and is told: go-zookeeper waits a second
			// between rounds of its server list, so about 1s after Expire
			// returns (TestDriver/SessionExpiry logs it), which a bound of
			// 1s failed once in CI.
			waitDone(t, p.Lease(), 3*time.Second, "a permit of the expired session")
			if since := time.Since(acquired); since >= 5*time.Second {
				t.Fatalf("permit %d: Done closed %v after the grant, when a renewal may have ended it: the session's signal was not seen", p.Slot(), since)
			}
			if err := p.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
				t.Errorf("permit %d: Err %v, want ErrLeaseLost", p.Slot(), err)
			}
		}
		q := permitGranted(t, got, "the waiter after the holder's session expired")
		old := ps[q.Slot()]
		if q.Token() <= old.Token() {
			t.Errorf("slot %d: token %v after the expired holder's %v", q.Slot(), q.Token(), old.Token())
		}
		r, err := b.TryAcquire(testCtx(t))
		if err != nil {
			t.Fatalf("the second slot after the expiry: %v", err)
		}
		if r.Slot() == q.Slot() {
			t.Fatalf("two permits on slot %d", r.Slot())
		}
		mustReturn(t, q)
		mustReturn(t, r)
		for _, p := range ps {
			if err := p.Release(context.Background()); !errors.Is(err, dlock.ErrLeaseLost) {
				t.Errorf("Release of a permit lost with its session: %v, want ErrLeaseLost", err)
			}
		}
	})
}

// ensurePath creates path and its parents (persistent; a test's).
func ensurePath(c *zk.Conn, path string) error {
	p := ""
	for _, part := range strings.Split(path[1:], "/") {
		p += "/" + part
		if _, err := c.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}
