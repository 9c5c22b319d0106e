package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
)

// TestLostLeaseKeysLeaveRestartedNodes: a majority of nodes restarts (with
// their append-only files) under a held lease, so its renewal loses the
// quorum and the lease is lost. The release dlock then runs fails on the
// nodes that are down; they come back with the lost lease's key from their
// files. The driver must finish the release there once they are back — not
// leave the key to block every other client for the rest of its TTL.
func TestLostLeaseKeysLeaveRestartedNodes(t *testing.T) {
	c := startCluster(t, 3, testenv.WithPersistence())
	l := c.open(t, "retry_delay=5ms&poll=100ms")
	ctx := testCtx(t)
	const key = "finish/restart"
	const ttl = 10 * time.Second
	lease, err := l.Acquire(ctx, key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	c.nodes[0].Kill()
	c.nodes[1].Kill()
	select {
	case <-lease.Done():
	case <-time.After(ttl):
		t.Fatal("the lease outlived the loss of its quorum")
	}
	if err := lease.Err(); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("lease ended with %v, want ErrLeaseLost", err)
	}
	lost := time.Now()
	c.nodes[0].Restart()
	c.nodes[1].Restart()
	// The keys on the restarted nodes expire on their own only a TTL after
	// the last renewal; the background release must remove them well before.
	waitFor(t, ttl/2, "the lost lease's keys gone from every node", func() bool { return c.countHeld(t, key) == 0 })
	t.Logf("keys gone %v after the lease was lost", time.Since(lost).Round(time.Millisecond))
	other := c.open(t, "")
	lease2, err := other.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("another client after the restart: %v", err)
	}
	release(t, lease2)
}
