package redlock_test

// These tests reproduce the failure scenarios of Martin Kleppmann's "How to
// do distributed locking" (2016) against real redis-server processes, and
// ASSERT the anomaly, so that the package documentation stays honest: under
// the conditions below, two clients hold the lock at once. Each test then
// shows what a resource that checks fencing tokens (fencing.Guard) makes of
// their writes. libfaketime hangs Debian's redis-server, so a clock jump on a
// node is simulated by its effect: the lock key expires early (PEXPIRE by an
// admin connection); a node whose clock runs ahead is simulated by the
// counter its clock floor would have produced.

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/redlock"
)

// holdsNow reports whether lease believes, at this moment, that it holds the
// lock: not ended, and before its deadline.
func holdsNow(lease *dlock.Lease) bool {
	return lease.Err() == nil && time.Now().Before(lease.Deadline())
}

// forget makes node i forget key's lock, as a clock jump or a restart
// without persistence would.
func (c *cluster) forget(t *testing.T, i int, key, how string) {
	t.Helper()
	switch how {
	case "clock jump":
		// A clock that jumps forward expires the key early: the same as
		// setting its remaining TTL to almost nothing.
		if err := c.admin[i].PExpire(context.Background(), redlock.LockKey(redlock.DefaultPrefix, key), time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "key expired on node", func() bool { return c.holders(t, key)[i] == "" })
	case "restart without persistence":
		c.nodes[i].Restart()
		if c.holders(t, key)[i] != "" {
			t.Fatal("the lock survived a restart without persistence; the test proves nothing")
		}
	default:
		t.Fatalf("forget: unknown way %q", how)
	}
}

// clockAhead makes node i behave, for key's fencing token, like a node whose
// clock runs ahead by d: its counter is floored at its clock, so it is set to
// what that clock would read.
func (c *cluster) clockAhead(t *testing.T, i int, key string, d time.Duration) {
	t.Helper()
	ahead := c.serverMicros(t, i) + uint64(d.Microseconds())
	if err := c.admin[i].Set(context.Background(), redlock.FenceKey(redlock.DefaultPrefix, key), ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// splitBrain runs Kleppmann's first scenario: A acquires while nodes 4 and 5
// are down, so its lock is on nodes 1-3; nodes 4 and 5 come back empty;
// node 3 forgets A's lock; B acquires on nodes 3-5. It asserts that both
// believe they hold the lock, and returns their leases. before, if not nil,
// runs once the cluster is up and before A acquires.
func splitBrain(t *testing.T, c *cluster, key, how string, before func()) (a, b *dlock.Lease) {
	t.Helper()
	ctx := testCtx(t)
	la := c.open(t, "", dlock.WithTTL(30*time.Second))
	lb := c.open(t, "", dlock.WithTTL(30*time.Second))
	if before != nil {
		before()
	}

	c.nodes[3].Kill()
	c.nodes[4].Kill()
	a, err := la.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("A's TryAcquire with nodes 4 and 5 down: %v", err)
	}
	if held := c.holders(t, key); held[0] == "" || held[1] == "" || held[2] == "" {
		t.Fatalf("A's lock is not on nodes 1-3: %q", held)
	}
	c.nodes[3].Restart()
	c.nodes[4].Restart()

	c.forget(t, 2, key, how)

	b, err = lb.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("B's TryAcquire once node 3 forgot A's lock: %v", err)
	}
	held := c.holders(t, key)
	if held[0] != held[1] || held[2] != held[3] || held[3] != held[4] || held[0] == held[2] || held[0] == "" || held[2] == "" {
		t.Fatalf("want A's lock on nodes 1-2 and B's on 3-5, got %q", held)
	}

	// The anomaly: both believe they hold the lock.
	if !holdsNow(a) || !holdsNow(b) {
		t.Fatalf("want both leases held: A err=%v deadline in %v; B err=%v deadline in %v",
			a.Err(), time.Until(a.Deadline()), b.Err(), time.Until(b.Deadline()))
	}
	t.Logf("ANOMALY (%s): A (token %d) and B (token %d) both hold %q", how, a.Token(), b.Token(), key)
	return a, b
}

// TestKleppmannNodeForgetsLock is the first scenario with clocks that agree
// (all nodes run on this host): B's token is higher than A's — B's quorum
// includes node 3, whose clock has moved on since A's grant — so the guard
// rejects A's writes once B has written. dlock notices the split at A's next
// refresh, which fails: at most TTL/3 later with auto-renew.
func TestKleppmannNodeForgetsLock(t *testing.T) {
	for _, how := range []string{"clock jump", "restart without persistence"} {
		t.Run(how, func(t *testing.T) {
			c := startCluster(t, 5)
			const key = "kleppmann/forget"
			a, b := splitBrain(t, c, key, how, nil)

			if b.Token() <= a.Token() {
				t.Fatalf("B's token %d is not above A's %d with agreeing clocks", b.Token(), a.Token())
			}
			var storage fencing.Guard
			if err := storage.Do(key, a.Token(), nil); err != nil {
				t.Fatalf("A's write before B's first one: %v", err)
			}
			if err := storage.Do(key, b.Token(), nil); err != nil {
				t.Fatalf("B's write: %v", err)
			}
			err := storage.Do(key, a.Token(), func() error {
				t.Error("A's write after B's reached the storage")
				return nil
			})
			if !errors.Is(err, fencing.ErrStaleToken) {
				t.Fatalf("A's write after B's: %v, want ErrStaleToken", err)
			}

			// A's next refresh finds its lock on 2 nodes only, and ends A's lease.
			if err := a.Refresh(testCtx(t)); !errors.Is(err, dlock.ErrLeaseLost) {
				t.Fatalf("A's refresh after the split: %v, want ErrLeaseLost", err)
			}
			if holdsNow(a) || !holdsNow(b) {
				t.Fatalf("after A's refresh: A holds=%v, B holds=%v", holdsNow(a), holdsNow(b))
			}
			release(t, b)
		})
	}
}

// TestKleppmannNodeForgetsLockClockAhead is the first scenario when node 1,
// in A's quorum but not in B's, has a clock one hour ahead: A's token comes
// from it and is higher than B's. The guard then accepts the stale holder A
// and rejects the current holder B — for as long as B holds the lock. A token
// that strictly increases needs consensus, not Redlock.
func TestKleppmannNodeForgetsLockClockAhead(t *testing.T) {
	c := startCluster(t, 5)
	const key = "kleppmann/clock-ahead"
	a, b := splitBrain(t, c, key, "clock jump", func() { c.clockAhead(t, 0, key, time.Hour) })

	if b.Token() >= a.Token() {
		t.Fatalf("B's token %d is not below A's %d, though A's quorum had a node an hour ahead", b.Token(), a.Token())
	}
	t.Logf("tokens went BACKWARDS: A %d, then B %d", a.Token(), b.Token())
	var storage fencing.Guard
	if err := storage.Do(key, a.Token(), nil); err != nil {
		t.Fatalf("A's write: %v", err)
	}
	err := storage.Do(key, b.Token(), func() error {
		t.Error("B's write reached the storage after A's")
		return nil
	})
	if !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("B's write after A's: %v, want ErrStaleToken: the current holder is fenced out", err)
	}
	if err := storage.Do(key, a.Token(), nil); err != nil {
		t.Fatalf("A's second write: %v (the stale holder is accepted)", err)
	}
	release(t, b)
}

// TestKleppmannPausedHolder is the second scenario: A checks its lease, then
// pauses (a GC or VM pause, SIGSTOP) past its validity; B gets the lock once
// A's keys have expired; A wakes and writes, still believing what it checked.
// B's token is higher, so the guard rejects A's write once B has written; a
// write of A that reaches the storage before B's first one is accepted — no
// token can stop it, since no newer token has been seen yet.
func TestKleppmannPausedHolder(t *testing.T) {
	c := startCluster(t, 5)
	ctx := testCtx(t)
	const key = "kleppmann/paused"
	// A's keepalive is paused with A: no auto-renew.
	la := c.open(t, "", dlock.WithTTL(time.Second), dlock.WithAutoRenew(false))
	lb := c.open(t, "")
	a, err := la.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !holdsNow(a) {
		t.Fatal("A does not hold its fresh lease")
	}
	checked := time.Now() // A checked its lease here, then paused

	b, err := lb.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, b)
	if got := time.Now(); got.Before(a.Deadline()) {
		t.Fatalf("B granted %v before A's deadline", a.Deadline().Sub(got))
	}
	t.Logf("ANOMALY: A checked its lease at %v and pauses; B (token %d) got the lock %v later; A (token %d) writes on waking",
		checked.Format("15:04:05.000"), b.Token(), time.Since(checked).Round(time.Millisecond), a.Token())
	if b.Token() <= a.Token() {
		t.Fatalf("B's token %d is not above A's %d", b.Token(), a.Token())
	}

	// B writes first: A's late write is rejected.
	var storage fencing.Guard
	if err := storage.Do(key, b.Token(), nil); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	if err := storage.Do(key, a.Token(), nil); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("A's write after its pause: %v, want ErrStaleToken", err)
	}
	// A's late write reaches a resource before B's first: accepted.
	var other fencing.Guard
	if err := other.Do(key, a.Token(), nil); err != nil {
		t.Fatalf("A's late write with no newer token seen: %v", err)
	}
	if err := other.Do(key, b.Token(), nil); err != nil {
		t.Fatalf("B's write after A's late one: %v", err)
	}
	if err := other.Do(key, a.Token(), nil); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("A's second late write: %v, want ErrStaleToken", err)
	}
	// Had A looked after its pause, its lease would have told it.
	select {
	case <-a.Done():
	case <-time.After(time.Second):
		t.Fatal("A's lease did not end after its deadline")
	}
	if !errors.Is(a.Err(), dlock.ErrLeaseLost) {
		t.Errorf("A's Err() = %v, want ErrLeaseLost", a.Err())
	}
}

// TestTokenWriteBack: node 1's clock runs an hour ahead and is in A's quorum
// but not in B's. If A's lease simply expires (A crashed: no refresh, no
// release), B's token is LOWER than A's: the documented way a Redlock token
// goes backwards. If A refreshed or released first, the token it wrote back
// into every node's counter keeps B's token above A's.
func TestTokenWriteBack(t *testing.T) {
	for _, end := range []string{"crash", "refresh then crash", "release"} {
		t.Run(end, func(t *testing.T) {
			c := startCluster(t, 5)
			ctx := testCtx(t)
			const key = "write-back"
			c.clockAhead(t, 0, key, time.Hour)
			clients := c.clients(t)
			la, err := redlock.New(ctx, clients, nil, dlock.WithTTL(time.Second), dlock.WithAutoRenew(false))
			if err != nil {
				t.Fatal(err)
			}
			defer la.Close()
			lb := c.open(t, "")

			// A's quorum is nodes 1-3, node 1 included.
			c.nodes[3].Kill()
			c.nodes[4].Kill()
			a, err := la.TryAcquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			c.nodes[3].Restart()
			c.nodes[4].Restart()
			switch end {
			case "refresh then crash":
				if err := a.Refresh(ctx); err != nil {
					t.Fatal(err)
				}
			case "release":
				release(t, a)
			}
			if end != "release" {
				crash(t, clients)
			}
			// B's quorum leaves node 1 out.
			c.nodes[0].Kill()
			b, err := lb.Acquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			defer release(t, b)
			t.Logf("%s: A's token %d, then B's %d", end, a.Token(), b.Token())
			if end == "crash" {
				if b.Token() >= a.Token() {
					t.Fatalf("B's token %d is not below A's %d: the scenario did not happen", b.Token(), a.Token())
				}
				return
			}
			if b.Token() <= a.Token() {
				t.Fatalf("B's token %d is not above A's %d after A's %s wrote it back", b.Token(), a.Token(), end)
			}
		})
	}
}

// crash closes a locker's clients: it can no longer refresh or release.
func crash(t *testing.T, clients []*goredis.Client) {
	t.Helper()
	for _, cl := range clients {
		if err := cl.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
