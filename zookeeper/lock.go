package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// lockNode is a lock node the driver created: Grant.Data of its grants.
type lockNode struct {
	parent string // the key's node
	path   string // parent + "/" + name()
	czxid  int64
	ses    *session // the session the node lives in
	owner  int64    // its ephemeralOwner, when read from the server (0: not read)
	first  bool     // it was the only child of parent when created
	// siblings is how many children parent had once the node was created
	// (0: not known).
	siblings int32
	start    time.Time // when the request that created it was sent

	watch atomic.Pointer[<-chan zk.Event] // the node's exists watch, set at the first refresh
}

// name is the node's own name, "_c_<uuid>-lock-<seq>"
// ("_c_<uuid>-read-lock-<seq>" if shared).
func (n *lockNode) name() string { return n.path[len(n.parent)+1:] }

// validity is how long a grant or refresh sent at some moment is valid after
// it: min(ttl, session timeout) less the drift allowance.
func validity(ttl, sessionTimeout time.Duration) (time.Duration, error) {
	v := min(ttl, sessionTimeout)
	if v -= backend.DriftAllowance(v); v <= 0 {
		return 0, fmt.Errorf("%w: ttl %v is too short (it must leave time after the drift allowance)", dlock.ErrInvalidOption, ttl)
	}
	return v, nil
}

// transient reports whether err says only that the connection failed: the
// session, and with it the lock node, may well be alive.
func transient(err error) bool {
	return connLost(err) || errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrSessionMoved)
}

// connLost reports whether err says that the connection broke while the
// request was on its way: the server may or may not have applied it.
// go-zookeeper reports a connection that broke before the reply as
// ErrConnectionClosed, and one that broke as the request was written as the
// write's own error (a *net.OpError).
func connLost(err error) bool {
	var op *net.OpError
	return errors.Is(err, zk.ErrConnectionClosed) || errors.As(err, &op)
}

type callResult[T any] struct {
	v   T
	err error
}

// call runs f, a go-zookeeper call, and returns its result, or ctx.Err() as
// soon as ctx is done (go-zookeeper takes no context). An abandoned call runs
// to its end in a goroutine Close waits for.
func call[T any](ctx context.Context, d *Driver, f func() (T, error)) (T, error) {
	if ctx.Done() == nil {
		return f()
	}
	ch := make(chan callResult[T], 1)
	d.wg.Go(func() {
		v, err := f()
		ch <- callResult[T]{v, err}
	})
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		select {
		case r := <-ch: // prefer an answer that is already there
			return r.v, r.err
		default:
		}
		var zero T
		return zero, ctx.Err()
	}
}

// pause waits for the next backoff step; it returns early with an error when
// ctx is done, lost is closed or the driver is closed.
func (d *Driver) pause(ctx context.Context, b *backend.Backoff, s *session) error {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	var lost <-chan struct{}
	if s != nil {
		lost = s.lost
	}
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-lost:
		return s.err()
	case <-d.quit:
		return errClosed
	}
}

func retryBackoff() backend.Backoff {
	return backend.Backoff{Min: 20 * time.Millisecond, Max: 500 * time.Millisecond}
}

// Acquire implements backend.Driver: it queues a lock node and, when
// waiting, watches the node it waits for. Connection failures do not fail it
// while the session may be alive, its loss does; on any failure or ctx's end
// it deletes its node (in the background if the server is unreachable).
func (d *Driver) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	s, err := d.sess.live(ctx, req.Wait, d.quit)
	if err != nil {
		return nil, err
	}
	if _, err := validity(req.TTL, s.timeout); err != nil {
		return nil, err
	}
	if req.Permits > 0 {
		return d.acquirePermit(ctx, req, s)
	}
	parent := LockPath(d.root, req.Key)
	n, err := d.create(ctx, s, req.Wait, parent, nodePrefix(protectedID(req.Owner), req.Shared), []byte(req.Label))
	if err != nil {
		return nil, err
	}
	if err := d.settle(ctx, n); err != nil {
		d.remove(n)
		return nil, err
	}
	g, err := d.wait(ctx, req, n)
	if err != nil {
		d.remove(n)
		return nil, err
	}
	n.ses.watch(n, req.OnLost)
	return g, nil
}

// create creates the lock node under parent, named prefix + sequence, with
// data (the holder's label, where Curator stores a participant's address),
// and returns it. If ctx ends first, the node the create still makes, if any, is
// deleted.
func (d *Driver) create(ctx context.Context, s *session, wait bool, parent, prefix string, data []byte) (*lockNode, error) {
	if ctx.Done() == nil {
		return d.createNode(ctx, s, wait, parent, prefix, data)
	}
	ch := make(chan callResult[*lockNode], 1)
	d.wg.Go(func() {
		n, err := d.createNode(ctx, s, wait, parent, prefix, data)
		ch <- callResult[*lockNode]{n, err}
	})
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
	}
	done := make(chan struct{})
	d.wg.Go(func() {
		defer close(done)
		if r := <-ch; r.v != nil {
			d.deleteNode(r.v)
		}
	})
	select {
	case <-done:
	case <-time.After(cleanupTimeout):
	}
	return nil, ctx.Err()
}

// createNode is create's goroutine. It runs until it knows whether it created
// the node, even after ctx ends: a create whose reply was lost may have been
// applied, and the node must not stay behind as an orphan. If the session
// ends before the node is made, it goes on in the next session (waiting for
// one if wait is set).
func (d *Driver) createNode(ctx context.Context, s *session, wait bool, parent, prefix string, data []byte) (*lockNode, error) {
	b := retryBackoff()
	noNode := 0
	for {
		if s.isLost() {
			var err error
			if s, err = d.sess.live(ctx, wait, d.quit); err != nil {
				return nil, err
			}
		}
		start := time.Now()
		// The create runs in one transaction with a write to the key's node:
		// the key node's new mzxid is the transaction's zxid, which is the new
		// node's czxid (the token), and its child count says whether the new
		// node is the only one (then it holds the lock at once).
		res, err := d.conn.Multi(
			&zk.CreateRequest{Path: parent + "/" + prefix, Data: data, Acl: d.acl, Flags: zk.FlagEphemeralSequential},
			&zk.SetDataRequest{Path: parent, Version: -1},
		)
		switch {
		case err == nil:
			if len(res) != 2 || res[1].Stat == nil || !strings.HasPrefix(res[0].String, parent+"/") {
				return nil, fmt.Errorf("create lock node under %s: unexpected reply %+v", parent, res)
			}
			d.sess.ack(s.id, start)
			return &lockNode{
				parent:   parent,
				path:     res[0].String,
				czxid:    res[1].Stat.Mzxid,
				ses:      s,
				first:    res[1].Stat.NumChildren == 1,
				siblings: res[1].Stat.NumChildren,
				start:    start,
			}, nil
		case errors.Is(err, zk.ErrNoNode) && noNode < 3:
			// The key's node does not exist yet, or the server just removed
			// the empty container.
			noNode++
			if err := d.ensureParent(parent); err != nil {
				return nil, err
			}
			continue
		case connLost(err):
			// The request may have been applied: look for the node by its
			// protected name.
			n, ferr := d.findOwn(s, parent, prefix)
			if ferr != nil || n != nil {
				return n, ferr
			}
		case transient(err), errors.Is(err, zk.ErrSessionExpired):
		default:
			return nil, fmt.Errorf("create lock node under %s: %w", parent, d.refused(err, parent))
		}
		if err := d.pause(ctx, &b, s); err != nil && !s.isLost() {
			return nil, err
		}
	}
}

// findOwn looks for the node a create with the given protected prefix may have
// made under parent, after the reply was lost. It keeps trying while the
// session that made the request may be alive.
func (d *Driver) findOwn(s *session, parent, prefix string) (*lockNode, error) {
	b := retryBackoff()
	for {
		children, _, err := d.conn.Children(parent)
		if err == nil {
			name, ok := ownChild(children, prefix)
			if !ok {
				return nil, nil
			}
			start := time.Now()
			ok, st, err := d.conn.Exists(parent + "/" + name)
			if err == nil {
				if !ok {
					return nil, nil
				}
				return &lockNode{parent: parent, path: parent + "/" + name,
					czxid: st.Czxid, ses: s, owner: st.EphemeralOwner, start: start}, nil
			}
		}
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return nil, nil
		case !transient(err):
			return nil, fmt.Errorf("look for a lock node under %s after a lost reply: %w", parent, err)
		case d.sess.gone(s.id):
			return nil, nil // the node, if made, died with its session
		}
		if err := d.pause(context.Background(), &b, nil); err != nil {
			return nil, err
		}
	}
}

// ensureParent creates the key's node as a container (and, for a
// semaphore's locks and leases, the key's node above them) with the ACL of
// Options.ACL, and the root's nodes, with Options.RootACL, if they are
// missing.
func (d *Driver) ensureParent(parent string) error {
	for range 2 {
		_, err := d.conn.CreateContainer(parent, nil, zk.FlagContainer, d.acl)
		switch {
		case err == nil, errors.Is(err, zk.ErrNodeExists):
			return nil
		case errors.Is(err, zk.ErrNoAuth):
			return fmt.Errorf("create %s: %w", parent, d.refused(err, parentOf(parent)))
		case errors.Is(err, zk.ErrNoNode):
			up := parent[:strings.LastIndexByte(parent, '/')]
			if up == d.root || len(up) <= len(d.root) {
				err = d.ensureRoot()
			} else {
				err = d.ensureParent(up)
			}
			if err != nil {
				return err
			}
		default:
			// ZooKeeper before 3.5 has no container nodes.
			if _, err2 := d.conn.Create(parent, nil, zk.FlagPersistent, d.acl); err2 != nil && !errors.Is(err2, zk.ErrNodeExists) {
				return fmt.Errorf("create %s: %w", parent, err)
			}
			return nil
		}
	}
	return nil
}

// ensureRoot creates the root and the nodes above it that are missing, open
// to every client (Options.RootACL).
func (d *Driver) ensureRoot() error {
	p := ""
	for _, part := range strings.Split(d.root[1:], "/") {
		p += "/" + part
		if _, err := d.conn.Create(p, nil, zk.FlagPersistent, d.rootACL); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", p, d.refused(err, parentOf(p)))
		}
	}
	return nil
}

// settle makes sure n is attributed to the session it lives in. The session
// may have changed while the create was in flight (a request queued while
// disconnected runs in whatever session the client has next).
func (d *Driver) settle(ctx context.Context, n *lockNode) error {
	cur := d.sess.current()
	if cur == n.ses && !cur.isLost() && (n.owner == 0 || n.owner == cur.id) {
		return nil
	}
	owner := n.owner
	if owner == 0 {
		ok, st, err := callExists(ctx, d, n.path)
		if err != nil {
			return fmt.Errorf("check the session of %s: %w", n.path, err)
		}
		if !ok {
			return fmt.Errorf("%w: %s vanished", errNoLockNode, n.path)
		}
		owner = st.EphemeralOwner
	}
	cur = d.sess.current()
	if cur == nil || cur.isLost() || cur.id != owner {
		return fmt.Errorf("the ZooKeeper session changed while the lock node was created: %w", errNoSession)
	}
	n.ses, n.owner, n.first, n.siblings = cur, owner, false, 0
	return nil
}

func callExists(ctx context.Context, d *Driver, path string) (bool, *zk.Stat, error) {
	type ex struct {
		ok bool
		st *zk.Stat
	}
	r, err := call(ctx, d, func() (ex, error) {
		ok, st, err := d.conn.Exists(path)
		return ex{ok, st}, err
	})
	return r.ok, r.st, err
}

// wait returns the grant once n holds the lock: once it is the first lock
// node of its key, or, for a shared request, once no exclusive node is ahead
// of it. With req.Wait false it returns ErrHeld if it does not hold it.
func (d *Driver) wait(ctx context.Context, req backend.AcquireRequest, n *lockNode) (*backend.Grant, error) {
	if n.first {
		return d.grant(req, n, n.start)
	}
	b := retryBackoff()
	for {
		if n.ses.isLost() {
			return nil, n.ses.err()
		}
		// The listing that decides the grant follows a sync, which the leader
		// answers: a follower cut off from the leader would answer a plain
		// read alone, and the grant's validity would count from a moment the
		// leader never confirmed the session alive. (The create's own reply
		// is the leader's; so the uncontended grant, decided by the create,
		// needs no sync.)
		start := time.Now()
		ls, err := d.syncedChildren(ctx, n.parent, false)
		if err != nil {
			if err := d.listFailed(ctx, err, n, &b); err != nil {
				return nil, err
			}
			continue
		}
		locks := sortedLocks(ls.children, ls.cversion)
		i := slices.Index(locks, n.name())
		if i < 0 {
			return nil, fmt.Errorf("%w: %s vanished (the session ended?)", errNoLockNode, n.path)
		}
		j := blocker(locks, i, req.Shared)
		switch {
		case j < 0:
			d.sess.ack(n.ses.id, start)
			return d.grant(req, n, start)
		case !req.Wait:
			return nil, fmt.Errorf("%w (%d ahead in the queue)", backend.ErrHeld, i)
		}
		pred := n.parent + "/" + locks[j]
		type exw struct {
			ok bool
			ch <-chan zk.Event
		}
		// A data watch, as Curator sets: unlike an exists watch, it is not
		// left behind when the node is gone already.
		r, err := call(ctx, d, func() (exw, error) {
			_, _, ch, err := d.conn.GetW(pred)
			if errors.Is(err, zk.ErrNoNode) {
				return exw{}, nil
			}
			return exw{true, ch}, err
		})
		if err != nil {
			if !transient(err) || ctx.Err() != nil {
				return nil, fmt.Errorf("watch %s: %w", pred, err)
			}
			if err := d.pause(ctx, &b, n.ses); err != nil {
				return nil, err
			}
			continue
		}
		b.Reset()
		if !r.ok {
			continue // gone already: look again
		}
		select {
		case <-r.ch: // deleted (or changed, or the watch ended): look again
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-n.ses.lost:
			return nil, n.ses.err()
		case <-d.quit:
			return nil, errClosed
		}
	}
}

func (d *Driver) grant(req backend.AcquireRequest, n *lockNode, start time.Time) (*backend.Grant, error) {
	v, err := validity(req.TTL, n.ses.timeout)
	if err != nil {
		return nil, err
	}
	return &backend.Grant{
		Key:      req.Key,
		Owner:    req.Owner,
		Token:    uint64(n.czxid),
		Start:    start,
		Validity: v,
		Data:     n,
	}, nil
}

// remove deletes n, waiting at most cleanupTimeout; the deletion goes on in
// the background if it has to.
func (d *Driver) remove(n *lockNode) {
	done := make(chan struct{})
	d.wg.Go(func() {
		defer close(done)
		d.deleteNode(n)
	})
	select {
	case <-done:
	case <-time.After(cleanupTimeout):
	}
}

// deleteNode deletes n, retrying connection failures for as long as its
// session may be alive (after that the server has deleted it) and the driver
// is open. It reports whether it deleted the node.
func (d *Driver) deleteNode(n *lockNode) bool {
	id := n.ses.id
	if n.owner != 0 {
		id = n.owner
	}
	b := retryBackoff()
	for {
		err := d.conn.Delete(n.path, -1)
		switch {
		case err == nil:
			return true
		case !transient(err), d.sess.gone(id), d.closed.Load():
			return false
		}
		if d.pause(context.Background(), &b, nil) != nil {
			return false
		}
	}
}

func (d *Driver) node(g *backend.Grant) (*lockNode, error) {
	n, ok := g.Data.(*lockNode)
	if !ok || n == nil {
		return nil, fmt.Errorf("grant of key %q was not made by this driver", g.Key)
	}
	return n, nil
}

// Refresh implements backend.Driver: through a sync with the leader it proves
// g's node is still there in its session, and returns min(ttl, session
// timeout) less the drift allowance. It waits for a reconnection while the
// session may be alive, and fails with ErrNotHeld once it is lost.
func (d *Driver) Refresh(ctx context.Context, g *backend.Grant, ttl time.Duration) (time.Duration, error) {
	if d.closed.Load() {
		return 0, errClosed
	}
	n, err := d.node(g)
	if err != nil {
		return 0, err
	}
	v, err := validity(ttl, n.ses.timeout)
	if err != nil {
		return 0, err
	}
	b := retryBackoff()
	for {
		if n.ses.isLost() {
			return 0, fmt.Errorf("%w: %w", backend.ErrNotHeld, n.ses.err())
		}
		sent, err := d.sharedSync(ctx)
		if err == nil {
			err = d.nodeGone(ctx, n)
		}
		switch {
		case err == nil:
			if n.ses.isLost() {
				return 0, fmt.Errorf("%w: %w", backend.ErrNotHeld, n.ses.err())
			}
			d.sess.ack(n.ses.id, sent)
			return v, nil
		case errors.Is(err, backend.ErrNotHeld):
			return 0, err
		case !transient(err) || ctx.Err() != nil:
			return 0, fmt.Errorf("check %s: %w", n.path, err)
		}
		if err := d.pause(ctx, &b, n.ses); err != nil {
			if n.ses.isLost() {
				return 0, fmt.Errorf("%w: %w", backend.ErrNotHeld, n.ses.err())
			}
			return 0, err
		}
	}
}

// Relabel implements backend.Relabeler: it writes label as g's node's data,
// where Curator keeps a participant's id and Inspect reads the label. A
// follower's Watch hears it through its data watch on the holder's node.
func (d *Driver) Relabel(ctx context.Context, g *backend.Grant, label string) error {
	if d.closed.Load() {
		return errClosed
	}
	n, err := d.node(g)
	if err != nil {
		return err
	}
	if n.isPermit() {
		return fmt.Errorf("a permit's node data records its slot: relabelling a permit is not supported: %w", errors.ErrUnsupported)
	}
	if n.ses.isLost() {
		return fmt.Errorf("%w: %w", backend.ErrNotHeld, n.ses.err())
	}
	st, err := call(ctx, d, func() (*zk.Stat, error) { return d.conn.Set(n.path, []byte(label), -1) })
	switch {
	case errors.Is(err, zk.ErrNoNode):
		if n.ses.isLost() {
			return fmt.Errorf("%w: %w", backend.ErrNotHeld, n.ses.err())
		}
		return fmt.Errorf("%w: %s was deleted", backend.ErrNotHeld, n.path)
	case err != nil:
		return fmt.Errorf("set the data of %s: %w", n.path, err)
	case st.Czxid != n.czxid || st.EphemeralOwner != n.ses.id:
		// Not ours (a node of the same name made again): cannot happen
		// while the name carries this lease's owner ID, but say so.
		return fmt.Errorf("%w: %s belongs to another session", backend.ErrNotHeld, n.path)
	}
	return nil
}

// Release implements backend.Driver: it deletes g's node, failing with
// ErrNotHeld if it was gone. A delete that cannot finish within ctx goes on in
// the background for as long as the session may be alive.
func (d *Driver) Release(ctx context.Context, g *backend.Grant) error {
	if d.closed.Load() {
		return errClosed
	}
	n, err := d.node(g)
	if err != nil {
		return err
	}
	n.ses.unwatch(n)
	b := retryBackoff()
	for {
		start := time.Now()
		_, err := call(ctx, d, func() (struct{}, error) { return struct{}{}, d.conn.Delete(n.path, -1) })
		switch {
		case err == nil:
			d.sess.ack(n.ses.id, start)
			return nil
		case errors.Is(err, zk.ErrNoNode):
			if n.ses.isLost() {
				return fmt.Errorf("%w: %w", backend.ErrNotHeld, n.ses.err())
			}
			return fmt.Errorf("%w: %s was deleted", backend.ErrNotHeld, n.path)
		case transient(err) && ctx.Err() == nil && !n.ses.isLost():
			if d.pause(ctx, &b, n.ses) == nil {
				continue
			}
		}
		// Not confirmed: keep trying in the background.
		d.wg.Go(func() { d.deleteNode(n) })
		if n.ses.isLost() {
			return fmt.Errorf("%w: %w", backend.ErrNotHeld, n.ses.err())
		}
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return fmt.Errorf("delete %s: %w", n.path, d.refused(err, n.parent))
	}
}

// listFailed judges a failed listing of n's parent in a wait: an error to
// return (the parent vanished, the error is not transient, or ctx ended),
// or nil after a pause, and the wait lists again.
func (d *Driver) listFailed(ctx context.Context, err error, n *lockNode, b *backend.Backoff) error {
	if errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("%w: %s vanished", errNoLockNode, n.parent)
	}
	if !transient(err) || ctx.Err() != nil {
		return fmt.Errorf("list %s: %w", n.parent, err)
	}
	return d.pause(ctx, b, n.ses)
}

// childList is a listing of a node's children: with its cversion, and the
// children watch if one was asked for.
type childList struct {
	children []string
	cversion int32
	ch       <-chan zk.Event
}

// syncedChildren lists parent's children after a sync, which the leader
// answers (see wait), with a children watch if watch.
func (d *Driver) syncedChildren(ctx context.Context, parent string, watch bool) (childList, error) {
	return call(ctx, d, func() (childList, error) {
		if _, err := d.conn.Sync(parent); err != nil {
			return childList{}, err
		}
		var l childList
		var st *zk.Stat
		var err error
		if watch {
			l.children, st, l.ch, err = d.conn.ChildrenW(parent)
		} else {
			l.children, st, err = d.conn.Children(parent)
		}
		if err != nil {
			return childList{}, err
		}
		l.cversion = st.Cversion
		return l, nil
	})
}
