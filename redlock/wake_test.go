package redlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
)

// acquired is the result of a waiting Acquire, stamped with when it returned.
type acquired struct {
	lease *dlock.Lease
	err   error
	at    time.Time
}

func waitingAcquire(ctx context.Context, l dlock.Locker, key string, opts ...dlock.AcquireOption) <-chan acquired {
	c := make(chan acquired, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, opts...)
		c <- acquired{lease, err, time.Now()}
	}()
	return c
}

func numSub(t testing.TB, c *cluster, i int, channel string) int64 {
	t.Helper()
	m, err := c.admin[i].PubSubNumSub(context.Background(), channel).Result()
	if err != nil {
		t.Fatalf("PUBSUB NUMSUB: %v", err)
	}
	return m[channel]
}

// TestWaiterWokenByPublish: a waiter is woken by the release messages, far
// sooner than its poll.
func TestWaiterWokenByPublish(t *testing.T) {
	c := startCluster(t, 5)
	const poll = 10 * time.Second
	a := c.open(t, "")
	b := c.open(t, "poll="+poll.String())
	ctx := testCtx(t)
	const key = "wake/publish"
	channel := redlock.ReleaseChannel(redlock.DefaultPrefix, key)
	for i := range 5 {
		lease, err := a.Acquire(ctx, key, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		got := waitingAcquire(ctx, b, key, dlock.WithTTL(time.Minute))
		for n := range c.nodes {
			waitFor(t, 5*time.Second, "waiter subscribed", func() bool { return numSub(t, c, n, channel) == 1 })
		}
		time.Sleep(20 * time.Millisecond) // let it pass its confirmed retry
		released := time.Now()
		release(t, lease)
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		d := r.at.Sub(released)
		t.Logf("round %d: release → waiter granted in %v", i, d)
		if d > poll/2 {
			t.Errorf("waiter granted %v after the release; only a poll (%v) explains that", d, poll)
		}
		release(t, r.lease)
	}
}

// TestWaiterRidesOutMajorityOutage: a waiting Acquire keeps waiting while a
// majority of the nodes is down (no quorum can answer), however long the
// outage lasts, and is granted once they are back. The holder's keys died
// with them (no persistence), so the lock is free on a quorum afterwards.
func TestWaiterRidesOutMajorityOutage(t *testing.T) {
	c := startCluster(t, 3)
	a := c.open(t, "")
	b := c.open(t, "poll=50ms&retry_delay=5ms")
	ctx := testCtx(t)
	const key = "wake/majority-outage"
	if _, err := a.Acquire(ctx, key, dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	got := waitingAcquire(ctx, b, key)
	c.nodes[0].Kill()
	c.nodes[1].Kill()
	select {
	case r := <-got:
		t.Fatalf("waiting Acquire returned while a majority was down: %v", r.err)
	case <-time.After(3 * time.Second): // the outage: many failed rounds
	}
	c.nodes[0].Restart()
	c.nodes[1].Restart()
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("waiting Acquire across the outage: %v", r.err)
		}
		release(t, r.lease)
	case <-time.After(15 * time.Second):
		t.Fatal("waiter not granted within 15s of the nodes' return")
	}
}
