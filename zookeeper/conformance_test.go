package zookeeper_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/zookeeper"
)

// shortSession is the session timeout of the conformance lockers: the
// shortest that is comfortable with tickTime=500 (the minimum is 1s) on a
// busy machine. It is the suite's short TTL, since a vanished holder keeps its
// lock until its session expires.
const shortSession = 2 * time.Second

// harness runs the conformance suite on a standalone server or an ensemble.
// Each locker has its own driver, connection and session.
type harness struct {
	servers []string
	session time.Duration
	admin   *zk.Conn // behind the lockers' backs

	mu      sync.Mutex
	drivers map[dlock.Locker]*zookeeper.Driver
}

func newHarness(t testing.TB, servers []string, session time.Duration) *harness {
	t.Helper()
	admin, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false), zk.WithLogger(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	return &harness{servers: servers, session: session, admin: admin, drivers: map[dlock.Locker]*zookeeper.Driver{}}
}

type discard struct{}

func (discard) Printf(string, ...any) {}

func (h *harness) driver(t testing.TB, session time.Duration) *zookeeper.Driver {
	t.Helper()
	d, err := zookeeper.Dial(context.Background(), h.servers, &zookeeper.Options{SessionTimeout: session})
	if err != nil {
		t.Fatalf("Dial(%v): %v", h.servers, err)
	}
	return d
}

func (h *harness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	return h.lockerWith(t, h.session)
}

func (h *harness) lockerWith(t testing.TB, session time.Duration, opts ...dlock.Option) dlock.Locker {
	t.Helper()
	d := h.driver(t, session)
	l, err := dlock.New(d, opts...)
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.drivers[l] = d
	h.mu.Unlock()
	t.Cleanup(func() {
		_ = l.Close()
		h.mu.Lock()
		delete(h.drivers, l)
		h.mu.Unlock()
	})
	return l
}

func (h *harness) driverOf(t testing.TB, l dlock.Locker) *zookeeper.Driver {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.drivers[l]
	if !ok {
		t.Fatal("locker not made by this harness")
	}
	return d
}

// holder returns the driver whose session holds key: a lock, or a permit's
// slot (NAME/permits/i, see permitNodes).
func (h *harness) holder(t testing.TB, key string) *zookeeper.Driver {
	t.Helper()
	path := ""
	if nodes := h.nodes(t, key); len(nodes) > 0 {
		path = zookeeper.LockPath(zookeeper.DefaultRoot, key) + "/" + nodes[0]
	} else if held, _, leases := h.permitNodes(t, key); len(held) > 0 {
		path = leases + "/" + held[0]
	} else {
		t.Fatalf("key %q has no lock node and no permit holds it", key)
	}
	ok, st, err := h.admin.Exists(path)
	if err != nil || !ok {
		t.Fatalf("holder node of %q: exists=%v, %v", key, ok, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.drivers {
		if id, _ := zookeeper.Session(d); id == st.EphemeralOwner {
			return d
		}
	}
	t.Fatalf("no locker of this harness has session 0x%x, which holds %q", st.EphemeralOwner, key)
	return nil
}

// nodes returns the lock nodes of key, in queue order.
func (h *harness) nodes(t testing.TB, key string) []string {
	t.Helper()
	path := zookeeper.LockPath(zookeeper.DefaultRoot, key)
	// The admin connection's server may lag behind the one that applied the
	// last change: catch up with the leader first.
	if _, err := h.admin.Sync(path); err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("sync %s: %v", path, err)
	}
	children, st, err := h.admin.Children(path)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		t.Fatalf("children of %q: %v", key, err)
	}
	return zookeeper.SortedLocks(children, st.Cversion)
}

// permitNodes reads, for a key NAME/permits/i, the lease nodes of the
// semaphore NAME in the driver's own layout (Curator's
// InterProcessSemaphoreV2, <root>/NAME/leases): held are those whose data
// names slot i, waiting those of dlock's that name no slot yet.
func (h *harness) permitNodes(t testing.TB, key string) (held, waiting []string, leases string) {
	t.Helper()
	j := strings.LastIndex(key, "/permits/")
	if j < 0 {
		return nil, nil, ""
	}
	slot := key[j+len("/permits/"):]
	leases = zookeeper.LockPath(zookeeper.DefaultRoot, key[:j]) + "/leases"
	if _, err := h.admin.Sync(leases); err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("sync %s: %v", leases, err)
	}
	children, _, err := h.admin.Children(leases)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil, leases
	}
	if err != nil {
		t.Fatalf("children of %s: %v", leases, err)
	}
	for _, c := range children {
		data, _, err := h.admin.Get(leases + "/" + c)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			t.Fatalf("read %s/%s: %v", leases, c, err)
		}
		switch d := string(data); {
		case strings.HasPrefix(d, "slot="+slot+" "):
			held = append(held, c)
		case strings.HasPrefix(d, "permits="):
			waiting = append(waiting, c)
		}
	}
	return held, waiting, leases
}

// Expire makes the servers end the session of key's holder, as if it had
// expired: in ZooKeeper the server forgets a lock holder exactly when its
// session ends, and that is how a holder loses a lock without releasing it.
// (Deleting the node by hand would be an operator's act; the driver notices it
// at the next refresh.) The holder is kept from reconnecting meanwhile, so it
// cannot take its session back; once it does reconnect, it is told the session
// expired. Every lease of the holder's session ends, not only key's.
func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	d := h.holder(t, key)
	id, pw := zookeeper.Session(d)
	zookeeper.BlockDial(d)
	defer zookeeper.UnblockDial(d)
	if err := testenv.ExpireZooKeeperSession(h.servers[0], id, pw, 5*time.Second); err != nil {
		t.Fatalf("Expire(%q): session 0x%x: %v", key, id, err)
	}
	if n := h.nodes(t, key); len(n) != 0 {
		t.Fatalf("Expire(%q): lock nodes left after the session ended: %v", key, n)
	}
	// A permit's slot may have gone to a waiter already: look for the
	// expired session's nodes only.
	held, _, leases := h.permitNodes(t, key)
	for _, c := range held {
		if ok, st, err := h.admin.Exists(leases + "/" + c); err == nil && ok && st.EphemeralOwner == id {
			t.Fatalf("Expire(%q): lease node %s left after its session ended", key, c)
		}
	}
}

// Crash drops the locker's connection for good, without closing its session.
func (h *harness) Crash(t testing.TB, l dlock.Locker) {
	zookeeper.Sever(h.driverOf(t, l))
}

func (h *harness) ShortTTL() time.Duration { return h.session }

var (
	_ conformance.Harness    = (*harness)(nil)
	_ conformance.Crasher    = (*harness)(nil)
	_ conformance.ShortTTLer = (*harness)(nil)
)

func TestConformance(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	conformance.Run(t, newHarness(t, []string{srv.Addr()}, shortSession))
}

func TestConformanceEnsemble(t *testing.T) {
	e := testenv.StartZooKeeperEnsemble(t, 3)
	conformance.Run(t, newHarness(t, e.Addrs(), shortSession))
}

// Waiters counts the lock nodes queued behind key's holder (or holders, when
// it is held shared).
func (h *harness) Waiters(t testing.TB, key string) int {
	t.Helper()
	nodes := h.nodes(t, key)
	return len(nodes) - zookeeper.Holders(nodes)
}

// Residue lists the lock nodes left under key's lock path, and for a
// permit's key (NAME/permits/i) the lease nodes that hold its slot or wait.
func (h *harness) Residue(t testing.TB, key string) []string {
	t.Helper()
	held, waiting, _ := h.permitNodes(t, key)
	return append(append(h.nodes(t, key), held...), waiting...)
}

// DSN reaches the harness's servers with its session timeout.
func (h *harness) DSN(testing.TB) string {
	return "zk://" + strings.Join(h.servers, ",") + "?session=" + h.session.String()
}

var (
	_ conformance.Inspector = (*harness)(nil)
	_ conformance.DSNer     = (*harness)(nil)
)
