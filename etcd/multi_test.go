package etcd_test

import (
	"errors"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
)

// TestTryAcquireAllManyKeys: TryAcquireAll of more keys than one etcd
// transaction may carry (65: etcd's default --max-txn-ops is 128, a compare
// and a put per key) takes them all; with one of them held (in the first
// transaction's part or in the last's) it takes none and leaves none of the
// set's keys behind.
func TestTryAcquireAllManyKeys(t *testing.T) {
	srv := testenv.StartEtcd(t)
	l, c := countingLocker(t, srv)
	other := openLocker(t, srv.URL()+testPrefix)
	raw := rawClient(t, []string{srv.Endpoint()})
	ctx := testCtx(t)
	const n = 65
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("many/%03d", i)
	}
	countKeys := func() int64 {
		t.Helper()
		resp, err := raw.Get(ctx, testPrefix+"/many%2F", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	warm, err := l.Acquire(ctx, "warm") // grants the shared lease
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Release(ctx)

	c.reset()
	set, err := dlock.TryAcquireAll(ctx, l, keys)
	if err != nil {
		t.Fatalf("TryAcquireAll of %d free keys: %v", n, err)
	}
	if got := c.get(rpcTxn); got != 2 {
		t.Errorf("TryAcquireAll of %d free keys sent %d transactions, want 2", n, got)
	}
	if got := countKeys(); got != n {
		t.Errorf("after TryAcquireAll of %d keys, %d keys under many/", n, got)
	}
	for _, lease := range set.Leases() {
		if lease.Token() == 0 {
			t.Errorf("%s: token 0", lease.Key())
		}
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}

	for _, held := range []string{keys[0], keys[n-1]} {
		blocker, err := other.Acquire(ctx, held)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dlock.TryAcquireAll(ctx, l, keys); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquireAll with %s held: %v, want ErrNotAcquired", held, err)
		}
		if got := countKeys(); got != 1 {
			t.Errorf("after a refused TryAcquireAll with %s held, %d keys under many/, want only the blocker's", held, got)
		}
		if err := blocker.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
