package etcd_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/testenv"
)

// rpcCounts counts the requests a client sends, by gRPC method (a stream
// counts once, when it opens: KeepAliveOnce opens one per renewal).
type rpcCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *rpcCounts) add(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[method]++
}

func (c *rpcCounts) get(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[method]
}

// total is the number of requests counted, of every method.
func (c *rpcCounts) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

func (c *rpcCounts) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = map[string]int{}
}

const (
	rpcTxn       = "/etcdserverpb.KV/Txn"
	rpcGrant     = "/etcdserverpb.Lease/LeaseGrant"
	rpcKeepAlive = "/etcdserverpb.Lease/LeaseKeepAlive"
)

// countingLocker returns a Locker whose client counts its requests.
func countingLocker(t *testing.T, srv *testenv.Etcd) (dlock.Locker, *rpcCounts) {
	t.Helper()
	c := &rpcCounts{n: map[string]int{}}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{
			grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				c.add(method)
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				c.add(method)
				return streamer(ctx, desc, cc, method, opts...)
			}),
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	l, err := etcd.New(context.Background(), cli, &etcd.Options{Prefix: testPrefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, c
}

// TestHeldLeasesShareOneLease: the leases one Locker holds with one TTL are
// keys of one etcd lease, as a concurrency.Session's Mutexes are: each
// acquire is one transaction, the server has one lease for them all, and
// their renewals cost one keep-alive however many renew.
func TestHeldLeasesShareOneLease(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l, c := countingLocker(t, srv)
	raw := rawClient(t, []string{srv.Endpoint()})
	ctx := testCtx(t)
	const n = 100
	const ttl = 6 * time.Second
	leases := make([]*dlock.Lease, n)
	var err error
	for i := range leases {
		if leases[i], err = l.Acquire(ctx, "one-lease/"+strconv.Itoa(i), dlock.WithTTL(ttl), dlock.WithAutoRenew(false)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d acquires: %d transactions, %d lease grants", n, c.get(rpcTxn), c.get(rpcGrant))
	if got := c.get(rpcGrant); got != 1 {
		t.Errorf("%d acquires granted %d etcd leases, want 1", n, got)
	}
	if got := c.get(rpcTxn); got != n {
		t.Errorf("%d acquires sent %d transactions, want one each", n, got)
	}
	resp, err := raw.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Leases) != 1 {
		t.Errorf("the server has %d leases for %d held locks, want 1", len(resp.Leases), n)
	}

	// Renewals: once the shared lease is due (TTL/6 after its grant), the
	// renewals of every lease share one keep-alive.
	time.Sleep(ttl / 6) // the renewal window is time itself, not an event
	c.reset()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, lease := range leases {
		wg.Go(func() { errs[i] = lease.Refresh(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d concurrent renewals: %d keep-alives, %d transactions", n, c.get(rpcKeepAlive), c.get(rpcTxn))
	if got := c.get(rpcKeepAlive); got < 1 || got > 2 {
		t.Errorf("%d concurrent renewals sent %d keep-alives, want one (two if the first began before the rest asked)", n, got)
	}
	c.reset()
	for _, lease := range leases[:n/2] {
		if err := lease.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.get(rpcKeepAlive); got != 0 {
		t.Errorf("%d renewals right after a renewal of the shared lease sent %d keep-alives, want none", n/2, got)
	}

	// Releasing deletes only the holder's key: the others stay held.
	for _, lease := range leases[:n/2] {
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, lease := range leases[n/2:] {
		if err := lease.Refresh(ctx); err != nil {
			t.Fatalf("lease %d after others were released: %v", n/2+i, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSameKeyTwiceWaits: a second Acquire of a key the same Locker holds
// waits for the first to be released (it cannot share the first's key under
// the shared lease), and TryAcquire of it is refused.
func TestSameKeyTwiceWaits(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	ctx := testCtx(t)
	first, err := l.Acquire(ctx, "twice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "twice"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a key the Locker holds: %v, want ErrNotAcquired", err)
	}
	got := make(chan *dlock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		second, err := l.Acquire(ctx, "twice")
		if err != nil {
			errc <- err
			return
		}
		got <- second
	}()
	waitQueued(t, rawClient(t, []string{srv.Endpoint()}), "twice", 2)
	select {
	case <-got:
		t.Fatal("a second Acquire of a held key was granted while the first held it")
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	firstToken := first.Token()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case second := <-got:
		if second.Token() <= firstToken {
			t.Errorf("second token %d ≤ first %d", second.Token(), firstToken)
		}
		if err := second.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-ctx.Done():
		t.Fatal("the second Acquire was not granted after the first was released")
	}
}

// TestSharedLeaseLossEndsItsLeases: when the shared lease is gone (revoked
// here, as when it expires), every lease on it ends as lost at once, and the
// next acquire takes a new one.
func TestSharedLeaseLossEndsItsLeases(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l := openLocker(t, srv.URL()+testPrefix)
	raw := rawClient(t, []string{srv.Endpoint()})
	ctx := testCtx(t)
	const n = 10
	leases := make([]*dlock.Lease, n)
	var err error
	for i := range leases {
		if leases[i], err = l.Acquire(ctx, "gone/"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := raw.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Leases) != 1 {
		t.Fatalf("the server has %d leases, want the one shared lease", len(resp.Leases))
	}
	if _, err := raw.Revoke(ctx, resp.Leases[0].ID); err != nil {
		t.Fatal(err)
	}
	for i, lease := range leases {
		select {
		case <-lease.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("lease %d did not end within 5s of its etcd lease's revocation", i)
		}
		if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("lease %d: Err() = %v, want ErrLeaseLost", i, lease.Err())
		}
	}
	again, err := l.Acquire(ctx, "gone/0")
	if err != nil {
		t.Fatalf("Acquire after the shared lease was revoked: %v", err)
	}
	if err := again.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitQueued waits until key's lock name has n keys (holder and waiters).
func waitQueued(t *testing.T, raw *clientv3.Client, key string, n int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
	defer cancel()
	name := etcd.LockName(testPrefix, key) + "/"
	w := raw.Watch(ctx, name, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	for {
		resp, err := raw.Get(ctx, name, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count >= n {
			return
		}
		select {
		case <-w:
		case <-ctx.Done():
			t.Fatalf("%q: %d keys queued, want %d", key, resp.Count, n)
		}
	}
}

// TestAcquireAllIsOneTransaction: AcquireAll of free keys takes them all in
// one transaction; with one of them held, TryAcquireAll takes none and
// leaves nothing behind.
func TestAcquireAllIsOneTransaction(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l, c := countingLocker(t, srv)
	other := openLocker(t, srv.URL()+testPrefix)
	ctx := testCtx(t)
	keys := []string{"multi/e", "multi/a", "multi/c", "multi/b", "multi/d"}
	warm, err := l.Acquire(ctx, "warm") // grants the shared lease
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Release(ctx)
	c.reset()
	set, err := dlock.AcquireAll(ctx, l, keys)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.get(rpcTxn); got != 1 {
		t.Errorf("AcquireAll of %d free keys sent %d transactions, want 1", len(keys), got)
	}
	for _, k := range keys {
		if _, err := other.TryAcquire(ctx, k); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("%s after AcquireAll: %v, want held", k, err)
		}
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	blocker, err := other.Acquire(ctx, "multi/c")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dlock.TryAcquireAll(ctx, l, keys); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll with one key held: %v", err)
	}
	resp, err := rawClient(t, []string{srv.Endpoint()}).Get(ctx, testPrefix+"/multi%2F", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 1 {
		t.Errorf("after a refused TryAcquireAll, %d keys under multi/, want only the blocker's", resp.Count)
	}
	_ = blocker.Release(ctx)
}
