package zookeeper_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/zookeeper"
)

func testKey(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return strings.ReplaceAll(t.Name(), "/", ".") + "/" + hex.EncodeToString(b[:])
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, l dlock.Locker, key string, opts ...dlock.AcquireOption) *dlock.Lease {
	t.Helper()
	lease, err := l.Acquire(testCtx(t), key, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return lease
}

func mustRelease(t *testing.T, lease *dlock.Lease) {
	t.Helper()
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release(%q): %v", lease.Key(), err)
	}
}

func waitDone(t *testing.T, lease *dlock.Lease, bound time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-lease.Done():
		return time.Since(start)
	case <-time.After(bound):
		t.Fatalf("%s: lease Done not closed within %v", what, bound)
		return 0
	}
}

// eventually polls cond every 20ms until it holds or bound passes.
func eventually(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// czxid returns the czxid of a lock node of key.
func (h *harness) czxid(t *testing.T, key, node string) int64 {
	t.Helper()
	ok, st, err := h.admin.Exists(zookeeper.LockPath(zookeeper.DefaultRoot, key) + "/" + node)
	if err != nil || !ok {
		t.Fatalf("node %s of %q: exists=%v, %v", node, key, ok, err)
	}
	return st.Czxid
}

// TestDriver runs the driver's own tests against one standalone server.
func TestDriver(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	h := newHarness(t, []string{srv.Addr()}, 10*time.Second)
	t.Run("Open", func(t *testing.T) { testOpen(t, srv, h) })
	t.Run("DigestAuth", func(t *testing.T) { testDigestAuth(t, srv, h) })
	t.Run("OwnConnection", func(t *testing.T) { testOwnConnection(t, srv, h) })
	t.Run("SessionExpiry", func(t *testing.T) { testSessionExpiry(t, h) })
	t.Run("CreateReplyLost", func(t *testing.T) { testCreateReplyLost(t, h) })
	t.Run("CancelLeavesNoNode", func(t *testing.T) { testCancelLeavesNoNode(t, srv, h) })
	t.Run("MixedWithZkLock", func(t *testing.T) { testMixedWithZkLock(t, h) })
	t.Run("QueueAcrossSequenceWrap", func(t *testing.T) { testQueueAcrossSequenceWrap(t, h) })
	t.Run("WaiterGrantSyncsFirst", func(t *testing.T) { testWaiterGrantSyncsFirst(t, h) })
	t.Run("PingsDoNotConfirmSession", func(t *testing.T) { testPingsDoNotConfirmSession(t, h) })
	t.Run("RenewalCostsOneSharedSync", func(t *testing.T) { testRenewalCostsOneSharedSync(t, h) })
	t.Run("RenewalSeesDeletionThroughWatch", func(t *testing.T) { testRenewalSeesDeletion(t, h) })
	t.Run("HeldLeasesNeedNoGoroutines", func(t *testing.T) { testHeldLeasesNeedNoGoroutines(t, h) })
	t.Run("ReconnectWithWatchesAndReplies", func(t *testing.T) { testReconnectWithWatches(t, h) })
	t.Run("ConnectionBreaksAsRequestIsWritten", func(t *testing.T) { testWriteBreaks(t, h) })
}

// testHeldLeasesNeedNoGoroutines: leases held by one Locker share the
// session's loss signal; none has a goroutine of its own, and the session's
// end still ends every one of them.
func testHeldLeasesNeedNoGoroutines(t *testing.T, h *harness) {
	l := h.NewLocker(t)
	ctx := testCtx(t)
	mustRelease(t, mustAcquire(t, l, testKey(t)+"warm-up"))
	before := testenv.SteadyGoroutines()
	const n = 200
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		leases[i] = mustAcquire(t, l, testKey(t)+strconv.Itoa(i))
	}
	after := testenv.SteadyGoroutines()
	t.Logf("goroutines: %d before, %d with %d leases held", before, after, n)
	if after-before > 5 {
		t.Errorf("%d held leases added %d goroutines", n, after-before)
	}
	h.Crash(t, l) // the session ends without a release
	for _, lease := range leases {
		select {
		case <-lease.Done():
		case <-ctx.Done():
			t.Fatal("a lease outlived its session")
		}
		if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("lease after the session ended: %v, want ErrLeaseLost", lease.Err())
		}
	}
}

// testReconnectWithWatches: a connection that breaks while the driver has
// watches set and requests in flight resumes its session, sets the watches
// again and answers the requests. go-zookeeper reads the last zxid it saw
// (to set the watches again) on one goroutine while its receive loop writes
// it, for a reply, on another: a data race the race detector reports unless
// the driver's connection holds such replies back until the watches are set
// (wireConn.gate). Run under -race, this test fails without the gate.
func testReconnectWithWatches(t *testing.T, h *harness) {
	l := h.NewLocker(t)
	d := h.driverOf(t, l)
	ctx := testCtx(t)
	k := testKey(t)
	var leases []*dlock.Lease
	for i := range 8 {
		lease := mustAcquire(t, l, k+strconv.Itoa(i))
		if err := lease.Refresh(ctx); err != nil { // sets the watch
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 { // requests queued while the connection is down
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = dlock.Inspect(ctx, l, k+strconv.Itoa(i))
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for range 8 { // each costs go-zookeeper's 1s pause before it dials again
		zookeeper.Bounce(d)
		// A refresh sent while the connection is down fails, without
		// losing the lease; one goes through once it is back.
		eventually(t, 10*time.Second, "a refresh after the reconnect", func() bool {
			err := leases[0].Refresh(ctx)
			if errors.Is(err, dlock.ErrLeaseLost) {
				t.Fatalf("Refresh after a reconnect: %v", err)
			}
			return err == nil
		})
	}
	for _, lease := range leases {
		mustRelease(t, lease)
	}
}

// testWriteBreaks: a connection that breaks as a request is written (the
// write fails, go-zookeeper returns its error rather than
// ErrConnectionClosed) is a lost connection like any other: a refresh tries
// again once it is back, and a lock node's create is looked for by its
// protected name.
func testWriteBreaks(t *testing.T, h *harness) {
	l := h.NewLocker(t)
	d := h.driverOf(t, l)
	ctx := testCtx(t)
	k := testKey(t)
	lease, err := l.Acquire(ctx, k, dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	zookeeper.BreakOnWrite(d, zookeeper.OpSync)
	if err := lease.Refresh(ctx); err != nil {
		t.Fatalf("Refresh whose sync's write broke the connection: %v", err)
	}
	mustRelease(t, lease)

	zookeeper.BreakOnWrite(d, zookeeper.OpMulti)
	lease, err = l.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire whose create's write broke the connection: %v", err)
	}
	if nodes := h.nodes(t, k); len(nodes) != 1 {
		t.Fatalf("nodes of %q: %q, want the one lock node", k, nodes)
	}
	mustRelease(t, lease)
}

// testRenewalCostsOneSharedSync: a lease's first renewal reads its node
// (with a watch) after a sync; later renewals send only the sync, and the
// renewals of many leases at once share one.
func testRenewalCostsOneSharedSync(t *testing.T, h *harness) {
	l := h.NewLocker(t)
	d := h.driverOf(t, l)
	ctx := testCtx(t)
	const n = 50
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		lease, err := l.Acquire(ctx, testKey(t)+strconv.Itoa(i), dlock.WithAutoRenew(false))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = lease
	}
	refreshAll := func() []int32 {
		zookeeper.RecordOps(d)
		var wg sync.WaitGroup
		for _, lease := range leases {
			wg.Go(func() {
				if err := lease.Refresh(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		return zookeeper.SentOps(d)
	}
	count := func(ops []int32, op int32) int {
		c := 0
		for _, o := range ops {
			if o == op {
				c++
			}
		}
		return c
	}
	first := refreshAll()
	if e := count(first, zookeeper.OpExists); e != n {
		t.Errorf("first renewal of %d leases read %d nodes (ops %v), want each once", n, e, first)
	}
	for round := range 3 {
		ops := refreshAll()
		syncs := count(ops, zookeeper.OpSync)
		t.Logf("round %d: %d concurrent renewals sent %d requests: %d syncs", round, n, len(ops), syncs)
		if syncs != len(ops) {
			t.Errorf("round %d: renewals sent %v; want syncs only", round, ops)
		}
		if syncs == 0 || syncs > 3 {
			t.Errorf("round %d: %d concurrent renewals sent %d syncs, want them to share one or two", round, n, syncs)
		}
	}
	for _, lease := range leases {
		mustRelease(t, lease)
	}
}

// testRenewalSeesDeletion: a node deleted behind the holder's back (a
// stale Curator or an operator) fails the next renewal, which learns it
// from the node's watch after the shared sync, not from a read.
func testRenewalSeesDeletion(t *testing.T, h *harness) {
	l := h.NewLocker(t)
	ctx := testCtx(t)
	k := testKey(t)
	lease, err := l.Acquire(ctx, k, dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Refresh(ctx); err != nil { // sets the watch
		t.Fatal(err)
	}
	nodes := h.nodes(t, k)
	if len(nodes) != 1 {
		t.Fatalf("nodes of %q: %v", k, nodes)
	}
	if err := h.admin.Delete(zookeeper.LockPath(zookeeper.DefaultRoot, k)+"/"+nodes[0], -1); err != nil {
		t.Fatal(err)
	}
	d := h.driverOf(t, l)
	zookeeper.RecordOps(d)
	err = lease.Refresh(ctx)
	if !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Refresh after the node was deleted: %v, want ErrLeaseLost", err)
	}
	// One sync, and no read of the node. (The lost lease's cleanup may
	// send a delete meanwhile.)
	ops := zookeeper.SentOps(d)
	syncs, reads := 0, 0
	for _, op := range ops {
		switch op {
		case zookeeper.OpSync:
			syncs++
		case zookeeper.OpExists, zookeeper.OpGetData, zookeeper.OpGetChildren2:
			reads++
		}
	}
	if syncs != 1 || reads != 0 {
		t.Errorf("the renewal that found the deletion sent %v, want one sync and no read", ops)
	}
}

// testWaiterGrantSyncsFirst: the listing that finds a waiter first, whose send
// time the grant's validity counts from, must follow a sync (answered by the
// leader), or a follower cut off from the leader could vouch for the session
// alone.
func testWaiterGrantSyncsFirst(t *testing.T, h *harness) {
	k := testKey(t)
	a, b := h.NewLocker(t), h.NewLocker(t)
	held := mustAcquire(t, a, k)
	db := h.driverOf(t, b)
	zookeeper.RecordOps(db)
	got := make(chan *dlock.Lease, 1)
	go func() {
		lease, err := b.Acquire(testCtx(t), k)
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	eventually(t, 10*time.Second, "b queued", func() bool { return len(h.nodes(t, k)) == 2 })
	mustRelease(t, held)
	lease := <-got
	if lease == nil {
		t.FailNow()
	}
	defer mustRelease(t, lease)
	// Every listing b made — the last of which granted it — follows a sync.
	ops := zookeeper.SentOps(db)
	n := 0
	for i, op := range ops {
		if op != zookeeper.OpGetChildren2 {
			continue
		}
		n++
		if i == 0 || ops[i-1] != zookeeper.OpSync {
			t.Fatalf("b listed the queue without a sync first: ops %v", ops)
		}
	}
	if n == 0 {
		t.Fatalf("b sent %v before its grant; no listing", ops)
	}
}

// testPingsDoNotConfirmSession: a ping's reply may come from a follower cut
// off from the leader, so it must not move the moment the session-loss rule
// counts from; only leader-confirmed requests do.
func testPingsDoNotConfirmSession(t *testing.T, h *harness) {
	d := h.driver(t, 2*time.Second) // go-zookeeper pings every third of the session timeout
	l, err := dlock.New(d)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mustRelease(t, mustAcquire(t, l, testKey(t)))
	before := zookeeper.LastAck(d)
	time.Sleep(2 * time.Second) // three ping intervals with no request
	if after := zookeeper.LastAck(d); after != before {
		t.Fatalf("lastAck moved %v with only pings on the wire", after-before)
	}
}

// testQueueAcrossSequenceWrap puts lock nodes named as ZooKeeper names them
// just before its sequence counter wraps (the parent's cversion reaches
// 2^31 - 1 after 2^31 creates and deletes under a key node that never
// empties) in front of dlock's, whose suffixes come from the parent's real,
// small cversion: seen as text or as numbers, dlock's nodes are first; by age
// they are behind. dlock must queue behind them and be granted in arrival
// order as they go.
func testQueueAcrossSequenceWrap(t *testing.T, h *harness) {
	ctx := testCtx(t)
	k := testKey(t)
	parent := zookeeper.LockPath(zookeeper.DefaultRoot, k)
	a, b := h.NewLocker(t), h.NewLocker(t)
	mustRelease(t, mustAcquire(t, a, k)) // makes the key's node

	var old []string
	for _, seq := range []string{"2147483646", "2147483647"} {
		p, err := h.admin.Create(parent+"/_c_00000000-0000-4000-8000-00000000000"+seq[9:]+"-lock-"+seq, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		if err != nil {
			t.Fatal(err)
		}
		old = append(old, p)
	}
	if _, err := a.TryAcquire(ctx, k); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire with two nodes made before the wrap in the queue: %v, want ErrNotAcquired", err)
	}

	type result struct {
		who   string
		lease *dlock.Lease
	}
	got := make(chan result, 2)
	acquire := func(who string, l dlock.Locker) {
		lease, err := l.Acquire(ctx, k)
		if err != nil {
			t.Error(err)
		}
		got <- result{who, lease}
	}
	go acquire("a", a)
	eventually(t, 10*time.Second, "a queued", func() bool { return len(h.nodes(t, k)) == 3 })
	go acquire("b", b)
	eventually(t, 10*time.Second, "b queued", func() bool { return len(h.nodes(t, k)) == 4 })

	if err := h.admin.Delete(old[0], -1); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		t.Fatalf("%s granted while a node made before it still holds the lock", r.who)
	case <-time.After(500 * time.Millisecond):
	}
	if err := h.admin.Delete(old[1], -1); err != nil {
		t.Fatal(err)
	}
	first := <-got
	if first.who != "a" || first.lease == nil {
		t.Fatalf("first grant went to %q, want a (queued first)", first.who)
	}
	select {
	case r := <-got:
		t.Fatalf("%s granted while a holds the lock", r.who)
	case <-time.After(500 * time.Millisecond):
	}
	mustRelease(t, first.lease)
	second := <-got
	if second.who != "b" || second.lease == nil {
		t.FailNow()
	}
	mustRelease(t, second.lease)
}

var curatorName = regexp.MustCompile(`^_c_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-lock-[0-9]{10}$`)

func testOpen(t *testing.T, srv *testenv.ZooKeeper, h *harness) {
	ctx := testCtx(t)
	l, err := dlock.Open(ctx, srv.URL("/dsn/locks")+"?session=4s&ttl=5s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if c := l.Capabilities(); c.Fencing != backend.FencingStrict || !c.FIFO || !c.FaultTolerant || !c.LossNotify || !c.PushWait {
		t.Errorf("Capabilities() = %+v", c)
	}
	k := "jobs/nightly"
	lease, err := l.TryAcquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	parent := zookeeper.LockPath("/dsn/locks", k)
	if parent != "/dsn/locks/jobs%2Fnightly" {
		t.Errorf("LockPath = %q", parent)
	}
	children, _, err := h.admin.Children(parent)
	if err != nil || len(children) != 1 || !curatorName.MatchString(children[0]) {
		t.Fatalf("children of %s = %q, %v; want one node in Curator's protected layout", parent, children, err)
	}
	_, st, err := h.admin.Exists(parent + "/" + children[0])
	if err != nil || uint64(st.Czxid) != uint64(lease.Token()) {
		t.Fatalf("token %d, node czxid %d (%v)", lease.Token(), st.Czxid, err)
	}
	// session=4s: the lease's validity derives from the session (4s), not
	// from the 5s TTL.
	if left := time.Until(lease.Deadline()); left > 4*time.Second || left < 3*time.Second {
		t.Errorf("deadline %v away with session=4s, ttl=5s; want just under 4s", left)
	}
	mustRelease(t, lease)

	dead := testenv.FreePort(t)
	for _, tc := range []struct{ dsn, want string }{
		{srv.URL("/x") + "?sesion=1s", `"sesion"`},
		{srv.URL("/x") + "?session=-1s", "session"},
		{srv.URL("/zookeeper/x"), "/zookeeper"},
		{srv.URL("/a//b"), "empty path component"},
		{"zk://alice@" + srv.Addr() + "/x", "user:password"},
		{"zk:///x", "no server"},
		{"zk://alice:s3cret@127.0.0.1:" + strconv.Itoa(dead) + "/x?connect=300ms", "no session"},
		{"zk://alice:s3cret@127.0.0.1:" + strconv.Itoa(dead) + "/x?bogus=1", `"bogus"`},
	} {
		begin := time.Now()
		l, err := dlock.Open(ctx, tc.dsn)
		if err == nil {
			l.Close()
			t.Errorf("Open(%q) succeeded", tc.dsn)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want it to mention %s", tc.dsn, err, tc.want)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%q): the error shows the password: %v", tc.dsn, err)
		}
		if d := time.Since(begin); d > 5*time.Second {
			t.Errorf("Open(%q) took %v", tc.dsn, d)
		}
	}
}

func testDigestAuth(t *testing.T, srv *testenv.ZooKeeper, h *harness) {
	ctx := testCtx(t)
	l, err := dlock.Open(ctx, "zk://alice:s3cret@"+srv.Addr()+"/digest")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	k := testKey(t)
	lease, err := l.TryAcquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	parent := zookeeper.LockPath("/digest", k)
	// Without the credentials, anyone can see the queue, but nobody can
	// join or remove it.
	if _, _, err := h.admin.Children(parent); err != nil {
		t.Fatalf("unauthenticated list of %s: %v", parent, err)
	}
	if _, err := h.admin.Create(parent+"/_c_x-lock-", nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll)); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("unauthenticated create under %s: %v, want ErrNoAuth", parent, err)
	}
	alice, _, err := zk.Connect(h.servers, 4*time.Second, zk.WithLogInfo(false), zk.WithLogger(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	if err := alice.AddAuth("digest", []byte("alice:s3cret")); err != nil {
		t.Fatal(err)
	}
	acl, _, err := alice.GetACL(parent)
	if err != nil || len(acl) != 2 || acl[0].Scheme != "digest" || !strings.HasPrefix(acl[0].ID, "alice:") || acl[1] != (zk.ACL{Perms: zk.PermRead, Scheme: "world", ID: "anyone"}) {
		t.Fatalf("ACL of %s = %+v, %v; want alice's digest, and read for anyone", parent, acl, err)
	}
	children, _, err := alice.Children(parent)
	if err != nil || len(children) != 1 {
		t.Fatalf("children of %s: %q, %v", parent, children, err)
	}
	if err := h.admin.Delete(parent+"/"+children[0], -1); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("unauthenticated delete of the lock node: %v, want ErrNoAuth", err)
	}
	mustRelease(t, lease)
}

func testOwnConnection(t *testing.T, srv *testenv.ZooKeeper, h *harness) {
	conn, _, err := zk.Connect([]string{srv.Addr()}, 4*time.Second, zk.WithLogInfo(false), zk.WithLogger(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := zookeeper.New(context.Background(), conn, nil); !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), "SessionTimeout") {
		t.Fatalf("New without a session timeout: %v, want ErrInvalidOption naming SessionTimeout", err)
	}
	l, err := zookeeper.New(context.Background(), conn, &zookeeper.Options{SessionTimeout: 4 * time.Second, Root: "/own"})
	if err != nil {
		t.Fatal(err)
	}
	k := testKey(t)
	lease := mustAcquire(t, l, k)
	children, _, err := conn.Children(zookeeper.LockPath("/own", k))
	if err != nil || len(children) != 1 {
		t.Fatalf("children: %q, %v", children, err)
	}
	_, st, err := conn.Exists(zookeeper.LockPath("/own", k) + "/" + children[0])
	if err != nil || st.EphemeralOwner != conn.SessionID() {
		t.Fatalf("lock node owner 0x%x, connection's session 0x%x (%v)", st.EphemeralOwner, conn.SessionID(), err)
	}
	mustRelease(t, lease)

	// Closing the locker leaves the connection to its owner.
	lease = mustAcquire(t, l, k, dlock.WithTTL(time.Minute))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := conn.Exists("/own"); err != nil || !ok {
		t.Fatalf("connection unusable after the locker's Close: %v", err)
	}
	if children, _, _ := conn.Children(zookeeper.LockPath("/own", k)); len(children) != 0 {
		t.Fatalf("Close left lock nodes: %q", children)
	}
	if !errors.Is(lease.Err(), dlock.ErrReleased) {
		t.Fatalf("lease Err() after the locker's Close: %v, want ErrReleased", lease.Err())
	}

	// The driver follows the state of a connection it does not own: when the
	// connection is gone, its leases end within the session timeout.
	l2, err := zookeeper.New(context.Background(), conn, &zookeeper.Options{SessionTimeout: 4 * time.Second, Root: "/own"})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	lease = mustAcquire(t, l2, k, dlock.WithTTL(time.Minute))
	conn.Close()
	d := waitDone(t, lease, 8*time.Second, "lease on a closed connection")
	t.Logf("lease ended %v after its connection was closed", d)
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", lease.Err())
	}
}

// testSessionExpiry: when the session ends, every lease of it ends promptly,
// and the next holder's token is higher.
func testSessionExpiry(t *testing.T, h *harness) {
	a, b := h.NewLocker(t), h.NewLocker(t)
	k1, k2 := testKey(t), testKey(t)
	l1 := mustAcquire(t, a, k1, dlock.WithTTL(time.Minute))
	l2 := mustAcquire(t, a, k2, dlock.WithTTL(time.Minute))
	h.Expire(t, k1)
	d1 := waitDone(t, l1, 5*time.Second, "lease of the expired session")
	waitDone(t, l2, 5*time.Second, "other lease of the expired session")
	t.Logf("lease ended %v after the session expired", d1)
	for _, l := range []*dlock.Lease{l1, l2} {
		if !errors.Is(l.Err(), dlock.ErrLeaseLost) || !strings.Contains(l.Err().Error(), "session") {
			t.Fatalf("Err() = %v, want ErrLeaseLost naming the session", l.Err())
		}
	}
	l3 := mustAcquire(t, b, k1)
	if l3.Token() <= l1.Token() {
		t.Fatalf("token after the expiry %d, not above %d", l3.Token(), l1.Token())
	}
	mustRelease(t, l3)
	// The expired holder goes on with a new session.
	l4 := mustAcquire(t, a, k2)
	if l4.Token() <= l2.Token() {
		t.Fatalf("token in the new session %d, not above %d", l4.Token(), l2.Token())
	}
	mustRelease(t, l4)
}

// testCreateReplyLost: the connection breaks after the server created the
// lock node but before the reply arrived. The driver finds its node by its
// protected name: nothing is left behind, nothing blocks the queue.
func testCreateReplyLost(t *testing.T, h *harness) {
	ctx := testCtx(t)
	a, b := h.NewLocker(t), h.NewLocker(t)
	db := h.driverOf(t, b)
	session, _ := zookeeper.Session(db)
	k := testKey(t)

	// Uncontended: the node found is adopted, and holds the lock.
	zookeeper.DropNextCreateReply(db)
	lb, err := b.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire with the create's reply lost: %v", err)
	}
	if zookeeper.DropArmed(db) {
		t.Fatal("the reply was not dropped")
	}
	nodes := h.nodes(t, k)
	if len(nodes) != 1 || uint64(h.czxid(t, k, nodes[0])) != uint64(lb.Token()) {
		t.Fatalf("nodes %q, token %d: want the one node, with the token as its czxid", nodes, lb.Token())
	}
	mustRelease(t, lb)
	if n := h.nodes(t, k); len(n) != 0 {
		t.Fatalf("nodes after the release: %q", n)
	}

	// Contended TryAcquire: the node found is not first, and is deleted.
	la := mustAcquire(t, a, k)
	zookeeper.DropNextCreateReply(db)
	if _, err := b.TryAcquire(ctx, k); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key, reply lost: %v, want ErrNotAcquired", err)
	}
	if n := h.nodes(t, k); len(n) != 1 {
		t.Fatalf("nodes after a failed TryAcquire whose reply was lost: %q (orphan?)", n)
	}

	// Contended Acquire: the node found waits its turn.
	zookeeper.DropNextCreateReply(db)
	got := make(chan *dlock.Lease, 1)
	go func() {
		lease, err := b.Acquire(ctx, k)
		if err != nil {
			t.Errorf("waiting Acquire, reply lost: %v", err)
		}
		got <- lease
	}()
	eventually(t, 10*time.Second, "the waiter's node", func() bool { return len(h.nodes(t, k)) == 2 })
	mustRelease(t, la)
	lb = <-got
	if lb == nil {
		t.FailNow()
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d, not above the previous holder's %d", lb.Token(), la.Token())
	}
	mustRelease(t, lb)
	if n := h.nodes(t, k); len(n) != 0 {
		t.Fatalf("nodes left: %q", n)
	}
	if id, _ := zookeeper.Session(db); id != session {
		t.Fatalf("session changed from 0x%x to 0x%x: the test meant a connection loss only", session, id)
	}
}

// testCancelLeavesNoNode: a cancelled Acquire removes its node, whether it
// was waiting or its create was still in flight.
func testCancelLeavesNoNode(t *testing.T, srv *testenv.ZooKeeper, h *harness) {
	a, b := h.NewLocker(t), h.NewLocker(t)
	k := testKey(t)
	la := mustAcquire(t, a, k)
	ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(ctx, k); !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its ctx: %v", err)
	}
	if n := h.nodes(t, k); len(n) != 1 {
		t.Fatalf("nodes right after a cancelled Acquire: %q, want only the holder's", n)
	}
	mustRelease(t, la)

	// The server is paused: the create is in flight when ctx ends. Once the
	// server resumes and creates the node, the driver deletes it: the key's
	// node sees two more child changes and has no children.
	k2 := testKey(t)
	lease, err := a.TryAcquire(testCtx(t), k2)
	if err != nil {
		t.Fatal(err)
	}
	mustRelease(t, lease)
	_, before, err := h.admin.Exists(zookeeper.LockPath(zookeeper.DefaultRoot, k2))
	if err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	ctx, cancel = context.WithTimeout(testCtx(t), 200*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err = b.Acquire(ctx, k2)
	took := time.Since(begin)
	srv.Resume()
	resumed = true
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire against a paused server: %v", err)
	}
	if took > 5*time.Second {
		t.Fatalf("Acquire returned %v after its 200ms ctx", took)
	}
	eventually(t, 10*time.Second, "the cancelled create's node created and deleted", func() bool {
		_, st, err := h.admin.Exists(zookeeper.LockPath(zookeeper.DefaultRoot, k2))
		return err == nil && st.Cversion >= before.Cversion+2 && st.NumChildren == 0
	})
	lease, err = a.TryAcquire(testCtx(t), k2)
	if err != nil {
		t.Fatalf("TryAcquire after the cancelled create: %v", err)
	}
	mustRelease(t, lease)
}

// testMixedWithZkLock: dlock and go-zookeeper's zk.Lock, which share
// Curator's "lock-" sequence naming, exclude each other on the same path.
func testMixedWithZkLock(t *testing.T, h *harness) {
	a := h.NewLocker(t)
	k := testKey(t)
	zl := zk.NewLock(h.admin, zookeeper.LockPath(zookeeper.DefaultRoot, k), zk.WorldACL(zk.PermAll))
	if err := zl.Lock(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(testCtx(t), k); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while zk.Lock holds the path: %v", err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		lease, err := a.Acquire(testCtx(t), k)
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	eventually(t, 10*time.Second, "dlock queued behind zk.Lock", func() bool { return len(h.nodes(t, k)) == 2 })
	if err := zl.Unlock(); err != nil {
		t.Fatal(err)
	}
	lease := <-got
	if lease == nil {
		t.FailNow()
	}
	locked := make(chan error, 1)
	go func() { locked <- zl.Lock() }()
	eventually(t, 10*time.Second, "zk.Lock queued behind dlock", func() bool { return len(h.nodes(t, k)) == 2 })
	select {
	case err := <-locked:
		t.Fatalf("zk.Lock returned (%v) while dlock holds the lock", err)
	default:
	}
	mustRelease(t, lease)
	select {
	case err := <-locked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("zk.Lock not granted after dlock's release")
	}
	if err := zl.Unlock(); err != nil {
		t.Fatal(err)
	}
}

// TestLeaderFailover kills the ensemble's leader while a lease is held: the
// lease survives (the session moves to another server), nobody else gets the
// lock meanwhile, and tokens keep increasing.
func TestLeaderFailover(t *testing.T) {
	e := testenv.StartZooKeeperEnsemble(t, 3)
	h := newHarness(t, e.Addrs(), 10*time.Second)
	a, b := h.NewLocker(t), h.NewLocker(t)
	k := testKey(t)
	lease := mustAcquire(t, a, k) // TTL 15s: refreshed every ~3.3s, valid 9.9s
	validity := 10*time.Second - backend.DriftAllowance(10*time.Second)

	leader := e.Leader(t)
	killed := time.Now()
	leader.Kill()
	newLeader := e.Leader(t)
	t.Logf("leader %d killed; %d leads %v later", leader.ID(), newLeader.ID(), time.Since(killed))

	// A refresh sent after the kill succeeds: the deadline moves past what
	// any earlier refresh could have given.
	deadline := time.Now().Add(20 * time.Second)
	for !lease.Deadline().After(killed.Add(validity)) {
		select {
		case <-lease.Done():
			t.Fatalf("lease lost in the failover: %v", lease.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no successful refresh within 20s of the failover (deadline %v after the kill)", lease.Deadline().Sub(killed))
		}
	}
	t.Logf("first refresh after the kill done %v after it", time.Since(killed))
	if _, err := b.TryAcquire(testCtx(t), k); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while the lease survives the failover: %v, want ErrNotAcquired", err)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("lease ended: %v", err)
	}
	mustRelease(t, lease)
	l2 := mustAcquire(t, b, k)
	if l2.Token() <= lease.Token() {
		t.Fatalf("token after the failover %d, not above %d", l2.Token(), lease.Token())
	}

	// The old leader comes back as a follower; tokens still increase.
	leader.Restart()
	e.Leader(t)
	mustRelease(t, l2)
	l3 := mustAcquire(t, a, k)
	if l3.Token() <= l2.Token() {
		t.Fatalf("token after the restart %d, not above %d", l3.Token(), l2.Token())
	}
	mustRelease(t, l3)
}
