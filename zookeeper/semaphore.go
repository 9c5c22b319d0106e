package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock/backend"
)

// A counted semaphore (backend.AcquireRequest.Permits) is Apache Curator's
// InterProcessSemaphoreV2 on the key's node, <root>/<EscapeKey(key)>:
//
//	.../locks/_c_<uuid>-lock-<seq>    an InterProcessMutex every acquirer holds while it counts
//	.../leases/_c_<uuid>-lease-<seq>  one ephemeral sequential node per permit
//
// An acquirer takes the mutex, creates its lease node, lists the leases
// (with a watch) until there are at most n of them, its own included, and
// gives the mutex back. dlock's lease nodes carry their slot in their data
// (permitData); Curator's carry the holder's address, and count but hold no
// slot.
const (
	semLocks  = "locks"  // Curator's LOCK_PARENT
	semLeases = "leases" // Curator's LEASE_PARENT
	leaseName = "lease-" // Curator's LEASE_BASE_NAME
)

// permitData is the data of dlock's lease node: "slot=<i> permits=<n>
// <label>", or, while it waits for a permit (it has no slot yet),
// "permits=<n> <label>".
func permitData(slot, n int, label string) []byte {
	b := make([]byte, 0, 32+len(label))
	if slot >= 0 {
		b = append(b, "slot="...)
		b = strconv.AppendInt(b, int64(slot), 10)
		b = append(b, ' ')
	}
	b = append(b, "permits="...)
	b = strconv.AppendInt(b, int64(n), 10)
	if label != "" {
		b = append(b, ' ')
		b = append(b, label...)
	}
	return b
}

// parsePermitData reads a lease node's data: slot is -1 for a node that
// holds no slot (a dlock waiter), and ok is false for a node that is not
// dlock's (Curator's, whose data is its holder's address by default).
func parsePermitData(data []byte) (slot, n int, ok bool) {
	s := string(data)
	slot = -1
	if rest, found := strings.CutPrefix(s, "slot="); found {
		i := strings.IndexByte(rest, ' ')
		if i < 0 {
			return 0, 0, false
		}
		v, err := strconv.Atoi(rest[:i])
		if err != nil || v < 0 {
			return 0, 0, false
		}
		slot, s = v, rest[i+1:]
	}
	rest, found := strings.CutPrefix(s, "permits=")
	if !found {
		return 0, 0, false
	}
	if i := strings.IndexByte(rest, ' '); i >= 0 {
		rest = rest[:i]
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n <= 0 {
		return 0, 0, false
	}
	return slot, n, true
}

// isPermit reports whether n is a lease node of a semaphore (not a lock
// node).
func (n *lockNode) isPermit() bool {
	return strings.HasSuffix(n.parent, "/"+semLeases) && strings.Contains(n.name(), "-"+leaseName)
}

// acquirePermit is Acquire for a counted request, in session s.
func (d *Driver) acquirePermit(ctx context.Context, req backend.AcquireRequest, s *session) (*backend.Grant, error) {
	sem := LockPath(d.root, req.Key)
	leases := sem + "/" + semLeases
	uuid := protectedID(req.Owner)

	if !req.Wait {
		// One attempt fails, without a write, where two reads show it must:
		// another acquirer holds or waits for the mutex (a waiting one
		// keeps it while the semaphore is full), or n leases are there.
		if err := d.tryPermitRead(ctx, sem, req.Permits); err != nil {
			return nil, err
		}
	}
	// The mutex: dlock's exclusive lock, on Curator's path for it.
	m, err := d.create(ctx, s, req.Wait, sem+"/"+semLocks, nodePrefix(uuid, false), []byte(req.Label))
	if err != nil {
		return nil, err
	}
	if err := d.settle(ctx, m); err != nil {
		d.remove(m)
		return nil, err
	}
	if _, err := d.wait(ctx, req, m); err != nil {
		d.remove(m)
		if errors.Is(err, backend.ErrHeld) {
			return nil, fmt.Errorf("%w: another acquire of the semaphore is under way or waiting (its lock %s is held)", backend.ErrHeld, m.parent)
		}
		return nil, err
	}
	defer d.remove(m) // the mutex is given back whatever happens: granted, refused, failed

	count, slot, err := d.countPermits(ctx, leases, req.Permits, "")
	if err != nil {
		return nil, err
	}
	var n *lockNode
	if count < req.Permits && slot >= 0 {
		n, err = d.createUnderMutex(ctx, req, m, leases, uuid, permitData(slot, req.Permits, req.Label))
		if err != nil {
			return nil, err
		}
		if n.siblings > 0 && int(n.siblings) <= req.Permits {
			g, err := d.grantPermit(req, n, slot, n.start)
			if err != nil {
				d.remove(n)
			}
			return g, err
		}
		// Not counted by the create's reply (a reply lost and the node
		// found again), or the leases grew although every acquirer holds
		// the mutex: count again, below.
	} else if !req.Wait {
		return nil, fmt.Errorf("%w: all %d permits are held", backend.ErrHeld, req.Permits)
	}
	if n == nil {
		// Wait for a permit with a node of our own in the leases, as
		// Curator's waiters do: it counts toward n, so a Curator acquirer
		// that lists the leases meanwhile sees one more.
		n, err = d.createUnderMutex(ctx, req, m, leases, uuid, permitData(-1, req.Permits, req.Label))
		if err != nil {
			return nil, err
		}
	}
	g, err := d.waitPermit(ctx, req, n)
	if err != nil {
		d.remove(n)
		return nil, err
	}
	return g, nil
}

// tryPermitRead returns an error wrapping ErrHeld if the semaphore sem's
// mutex has a lock node or its leases number permits or more. The first
// reads are answered by this client's server, which may lag behind the
// leader (an ensemble's follower): a verdict to fail is only given after a
// sync and a second read, so a try does not fail on a holder that has
// already gone (a refused acquirer's mutex node, deleted before its Acquire
// returned, still listed by a lagging follower). A try may still go on to
// find the same under the mutex.
func (d *Driver) tryPermitRead(ctx context.Context, sem string, permits int) error {
	type counts struct{ locks, leases int }
	read := func(sync bool) (counts, error) {
		return call(ctx, d, func() (counts, error) {
			var c counts
			if sync {
				if _, err := d.conn.Sync(sem); err != nil && !errors.Is(err, zk.ErrNoNode) {
					return c, err
				}
			}
			locks, _, err := d.conn.Children(sem + "/" + semLocks)
			if err != nil && !errors.Is(err, zk.ErrNoNode) {
				return c, err
			}
			for _, l := range locks {
				if _, ok := sequence(l); ok {
					c.locks++
				}
			}
			leases, _, err := d.conn.Children(sem + "/" + semLeases)
			if err != nil && !errors.Is(err, zk.ErrNoNode) {
				return c, err
			}
			c.leases = len(leases)
			return c, nil
		})
	}
	c, err := read(false)
	if err == nil && (c.locks > 0 || c.leases >= permits) {
		c, err = read(true)
	}
	switch {
	case err != nil:
		return fmt.Errorf("list %s: %w", sem, err)
	case c.locks > 0:
		return fmt.Errorf("%w: another acquire of the semaphore is under way or waiting (its lock %s/%s is held)", backend.ErrHeld, sem, semLocks)
	case c.leases >= permits:
		return fmt.Errorf("%w: all %d permits are held", backend.ErrHeld, permits)
	}
	return nil
}

// createUnderMutex creates the caller's lease node under leases, in the
// session that holds m, the semaphore's mutex. A create goes on in the next
// session if its own ends; the mutex, ephemeral, ended with the old one, so
// a node made then was made without it: it is deleted and the acquire fails.
func (d *Driver) createUnderMutex(ctx context.Context, req backend.AcquireRequest, m *lockNode, leases, uuid string, data []byte) (*lockNode, error) {
	if m.ses.isLost() {
		return nil, m.ses.err()
	}
	n, err := d.create(ctx, m.ses, req.Wait, leases, protectedPrefix+uuid+"-"+leaseName, data)
	if err != nil {
		return nil, err
	}
	if err := d.settle(ctx, n); err != nil {
		d.remove(n)
		return nil, err
	}
	if n.ses != m.ses || m.ses.isLost() {
		d.remove(n)
		return nil, fmt.Errorf("the ZooKeeper session that held the semaphore's lock ended: %w", errNoSession)
	}
	return n, nil
}

// countPermits lists the lease nodes under leases, leaving out own (the
// name of the caller's node, if it has one), and returns how many there are
// and the lowest slot in [0, permits) that none of dlock's names (-1 if
// none is free). It fails with ErrSizeMismatch if one of dlock's nodes uses
// another number of permits. The caller holds the semaphore's mutex, so no
// other dlock acquirer picks a slot meanwhile.
func (d *Driver) countPermits(ctx context.Context, leases string, permits int, own string) (count, slot int, err error) {
	children, err := call(ctx, d, func() ([]string, error) {
		c, _, err := d.conn.Children(leases)
		return c, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("list %s: %w", leases, err)
	}
	taken := make([]bool, permits)
	for _, c := range children {
		if c == own {
			continue
		}
		data, err := call(ctx, d, func() ([]byte, error) {
			b, _, err := d.conn.Get(leases + "/" + c)
			return b, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			continue // gone since the listing
		}
		if err != nil {
			return 0, 0, fmt.Errorf("read %s/%s: %w", leases, c, err)
		}
		count++
		i, n, ok := parsePermitData(data)
		switch {
		case !ok: // another client's lease (Curator's): it counts, holds no slot
		case n != permits:
			return 0, 0, fmt.Errorf("%w: the holder of %s/%s uses %d permits, this request %d", backend.ErrSizeMismatch, leases, c, n, permits)
		case i >= permits:
			return 0, 0, fmt.Errorf("%w: %s/%s holds slot %d, this request has %d permits", backend.ErrSizeMismatch, leases, c, i, permits)
		case i >= 0:
			taken[i] = true
		}
	}
	return count, slices.Index(taken, false), nil
}

// waitPermit waits until n, a lease node of the semaphore, is among at most
// req.Permits lease nodes, as Curator's acquirers do; then it picks the
// lowest slot no other dlock node holds and writes it into n's data.
func (d *Driver) waitPermit(ctx context.Context, req backend.AcquireRequest, n *lockNode) (*backend.Grant, error) {
	b := retryBackoff()
	for {
		if n.ses.isLost() {
			return nil, n.ses.err()
		}
		// As in wait: the listing that grants follows a sync, which the
		// leader answers, and the validity counts from it.
		start := time.Now()
		ls, err := d.syncedChildren(ctx, n.parent, true)
		if err != nil {
			if err := d.listFailed(ctx, err, n, &b); err != nil {
				return nil, err
			}
			continue
		}
		b.Reset()
		if !slices.Contains(ls.children, n.name()) {
			return nil, fmt.Errorf("%w: %s vanished (the session ended?)", errNoLockNode, n.path)
		}
		if len(ls.children) <= req.Permits {
			d.sess.ack(n.ses.id, start)
			return d.claimSlot(ctx, req, n, start)
		}
		if !req.Wait {
			return nil, fmt.Errorf("%w: all %d permits are held", backend.ErrHeld, req.Permits)
		}
		select {
		case <-ls.ch: // a lease came or went (or the watch ended): count again
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-n.ses.lost:
			return nil, n.ses.err()
		case <-d.quit:
			return nil, errClosed
		}
	}
}

// claimSlot picks the lowest slot no other dlock lease node holds and writes
// it into n's data; then n is a permit of that slot. A slot is free: n is
// among at most req.Permits lease nodes, so the others name at most
// req.Permits-1 slots.
func (d *Driver) claimSlot(ctx context.Context, req backend.AcquireRequest, n *lockNode, start time.Time) (*backend.Grant, error) {
	_, slot, err := d.countPermits(ctx, n.parent, req.Permits, n.name())
	if err != nil {
		return nil, err
	}
	if slot < 0 {
		// Cannot happen while every dlock acquirer picks its slot under the
		// mutex; never hand out a slot another holds.
		return nil, fmt.Errorf("every slot of %s is named by another lease although at most %d leases are there", n.parent, req.Permits)
	}
	if _, err := call(ctx, d, func() (*zk.Stat, error) {
		return d.conn.Set(n.path, permitData(slot, req.Permits, req.Label), -1)
	}); err != nil {
		return nil, fmt.Errorf("write the slot into %s: %w", n.path, err)
	}
	return d.grantPermit(req, n, slot, start)
}

// grantPermit is the grant of n, a lease node of slot slot.
func (d *Driver) grantPermit(req backend.AcquireRequest, n *lockNode, slot int, start time.Time) (*backend.Grant, error) {
	g, err := d.grant(req, n, start)
	if err != nil {
		return nil, err
	}
	g.Key = backend.PermitKey(req.Key, slot)
	n.ses.watch(n, req.OnLost)
	return g, nil
}
