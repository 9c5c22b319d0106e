package etcd

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
)

// lossTestPrefix is the key prefix of the loss watch tests' lockers.
const lossTestPrefix = "/dlock-losswatch"

// setHook sets *hook to f until the test ends (after the lockers it opens
// later are closed: cleanups run last first).
func setHook[F any](t *testing.T, hook *F, f F) {
	t.Helper()
	*hook = f
	t.Cleanup(func() {
		var zero F
		*hook = zero
	})
}

// lossTestClient returns a clientv3 client of srv, closed when the test ends.
func lossTestClient(t *testing.T, srv *testenv.Etcd) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// lossTestLocker returns a driver on srv and a Locker over it, closed when
// the test ends.
func lossTestLocker(t *testing.T, srv *testenv.Etcd) (*Driver, dlock.Locker) {
	t.Helper()
	d, err := NewDriver(context.Background(), lossTestClient(t, srv), &Options{Prefix: lossTestPrefix})
	if err != nil {
		t.Fatal(err)
	}
	l, err := dlock.New(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return d, l
}

// awaitWatched waits until the loss watch of d holds a lease of key.
func awaitWatched(t *testing.T, d *Driver, key string) {
	t.Helper()
	name := LockName(d.prefix, key) + "/"
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.loss.mu.Lock()
		found := false
		for k := range d.loss.held {
			found = found || strings.HasPrefix(k, name)
		}
		d.loss.mu.Unlock()
		if found {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not added to the loss watch within 5s", key)
		}
		time.Sleep(time.Millisecond)
	}
}

// deleteKeys deletes the keys of key's lock behind its holder's back.
func deleteKeys(t *testing.T, ctx context.Context, raw *clientv3.Client, key string) {
	t.Helper()
	resp, err := raw.Delete(ctx, LockName(lossTestPrefix, key)+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Deleted == 0 {
		t.Fatalf("no key of %s to delete", key)
	}
}

// awaitLost waits up to within for lease to end with ErrLeaseLost.
func awaitLost(t *testing.T, lease *dlock.Lease, within time.Duration, what string) {
	t.Helper()
	select {
	case <-lease.Done():
	case <-time.After(within):
		t.Fatalf("%s: the lease was not ended within %v", what, within)
	}
	if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("%s: Err() = %v, want ErrLeaseLost", what, lease.Err())
	}
}

// TestLossWatchReopenSeesNewGrant: a lease granted while the loss watch
// reopens (after it took its snapshot of the held leases, before the new
// watch is in place), whose key is deleted in that window, still learns of
// the deletion at once; and the reopened watch reports later deletions.
func TestLossWatchReopenSeesNewGrant(t *testing.T) {
	srv := testenv.StartEtcd(t)
	raw := lossTestClient(t, srv)
	var d *Driver
	streams := make(chan context.CancelFunc, 8)
	window, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	setHook(t, &hookLossWatchOpened, func(hd *Driver, stop context.CancelFunc) {
		if hd == d {
			streams <- stop
		}
	})
	setHook(t, &hookLossWatchReopening, func(hd *Driver) {
		if hd != d {
			return
		}
		once.Do(func() {
			close(window)
			select {
			case <-proceed:
			case <-hd.bg.Done():
			}
		})
	})
	d, l := lossTestLocker(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const n = 50
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		var err error
		if leases[i], err = l.Acquire(ctx, "reopen/"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range leases {
		awaitWatched(t, d, leases[i].Key())
	}
	var stop context.CancelFunc
	select {
	case stop = <-streams:
	case <-time.After(5 * time.Second):
		t.Fatal("the loss watch did not open within 5s")
	}
	stop() // as a compaction or a member without a leader ends it

	select {
	case <-window:
	case <-time.After(5 * time.Second):
		t.Fatal("the loss watch did not reopen within 5s")
	}
	victim, err := l.Acquire(ctx, "reopen/victim")
	if err != nil {
		t.Fatal(err)
	}
	awaitWatched(t, d, victim.Key())
	deleteKeys(t, ctx, raw, victim.Key())
	close(proceed)
	awaitLost(t, victim, time.Second, "key deleted while the loss watch reopened")

	select {
	case <-streams:
	case <-time.After(5 * time.Second):
		t.Fatal("the loss watch did not open again within 5s")
	}
	deleteKeys(t, ctx, raw, leases[0].Key())
	awaitLost(t, leases[0], time.Second, "key deleted after the loss watch reopened")
	for _, lease := range leases[1:] {
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("%s: %v", lease.Key(), err)
		}
	}
}

// TestLossWatchSeesDeletionBeforeAdd: a lease whose key is deleted after its
// grant but before it joins the loss watch (lossWatchDelay), while the watch
// is open and reports that deletion with no lease for it yet, still learns
// of it at once when it joins: from the deletions the watch remembers, or,
// once more than maxDrops deletions came after it, by reading its key.
func TestLossWatchSeesDeletionBeforeAdd(t *testing.T) {
	srv := testenv.StartEtcd(t)
	raw := lossTestClient(t, srv)
	for _, tc := range []struct {
		name  string
		flood int // keys deleted after the victim's, before the sentinel's
	}{
		{"remembered", 0},
		{"forgotten", maxDrops + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			flood := lossTestPrefix + "/" + tc.name + "-flood/"
			for lo := 0; lo < tc.flood; lo += 100 {
				ops := make([]clientv3.Op, 0, 100)
				for i := lo; i < min(lo+100, tc.flood); i++ {
					ops = append(ops, clientv3.OpPut(flood+strconv.Itoa(i), ""))
				}
				if _, err := raw.Txn(ctx).Then(ops...).Commit(); err != nil {
					t.Fatal(err)
				}
			}
			var d *Driver
			victimKey, sentinelKey := tc.name+"/victim", tc.name+"/sentinel"
			victimName := LockName(lossTestPrefix, victimKey) + "/"
			adding, proceed := make(chan struct{}), make(chan struct{})
			setHook(t, &hookLossWatchAdding, func(hd *Driver, g *grant) {
				if hd != d || !strings.HasPrefix(g.key, victimName) {
					return
				}
				close(adding)
				select {
				case <-proceed:
				case <-hd.bg.Done():
				}
			})
			d, l := lossTestLocker(t, srv)

			sentinel, err := l.Acquire(ctx, sentinelKey)
			if err != nil {
				t.Fatal(err)
			}
			awaitWatched(t, d, sentinel.Key())
			victim, err := l.Acquire(ctx, victimKey)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-adding:
			case <-time.After(5 * time.Second):
				t.Fatal("the victim was not being added to the loss watch within 5s")
			}
			deleteKeys(t, ctx, raw, victim.Key())
			if tc.flood > 0 {
				if _, err := raw.Delete(ctx, flood, clientv3.WithPrefix()); err != nil {
					t.Fatal(err)
				}
			}
			deleteKeys(t, ctx, raw, sentinel.Key())
			// The watch reports deletions in revision order: once the
			// sentinel's has ended its lease, the victim's was reported too,
			// before its lease joined.
			awaitLost(t, sentinel, 5*time.Second, "sentinel")
			close(proceed)
			awaitLost(t, victim, time.Second, "key deleted before the lease joined the loss watch")
		})
	}
}
