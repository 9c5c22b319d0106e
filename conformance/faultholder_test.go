package conformance

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redlock"
)

// TestLostHolderClosesWhenStopped: the in-process holder of a fault trial
// whose lease is lost keeps its Locker open until the trial stops it, as the
// child holder and the local leader do, so that the trial's Residue check
// (after the heal) sees what the driver leaves once it can reach every node.
// Here three of five Redlock nodes (with an append-only file) are killed
// right after the grant, the next renewal loses the lease, and the nodes
// restart with the holder's key only after the holder has called Release:
// its Locker, still open, deletes the key there, and nothing is left once
// it is stopped. A holder that closed its Locker on its own when the lease
// ended gave the down nodes their last try while they were down, and its
// key stayed on them for the rest of its TTL.
func TestLostHolderClosesWhenStopped(t *testing.T) {
	goredis.SetLogger(quietRedis{}) // the test kills nodes on purpose
	nodes := make([]*testenv.Redis, 5)
	admin := make([]*goredis.Client, len(nodes))
	addrs := make([]string, len(nodes))
	for i := range nodes {
		nodes[i] = testenv.StartRedis(t, testenv.WithPersistence())
		addrs[i] = nodes[i].Addr()
		admin[i] = goredis.NewClient(&goredis.Options{Addr: addrs[i], DialerRetries: 1, MaxRetries: -1})
		t.Cleanup(func() { _ = admin[i].Close() })
	}
	// TTL 3s: the lease is lost at the first renewal (TTL/3), and the
	// restarted nodes must be back, with the key set at the grant, well
	// before it expires there (TTL after the grant).
	fs := &faultSuite{ttl: 3 * time.Second}
	k := key(t)
	lk := redlock.LockKey(redlock.DefaultPrefix, k)
	holders := func() []string { // per node, the owner in k's lock key ("" if none)
		out := make([]string, len(admin))
		for i, a := range admin {
			v, err := a.Get(context.Background(), lk).Result()
			if err != nil && !errors.Is(err, goredis.Nil) {
				t.Fatalf("GET on node %d: %v", i, err)
			}
			out[i] = v
		}
		return out
	}

	for i, a := range admin {
		if v, err := a.ConfigGet(context.Background(), "appendonly").Result(); err != nil || v["appendonly"] != "yes" {
			t.Fatalf("node %d: appendonly is %q (%v), want yes: its key would not come back after a restart, and the test would prove nothing", i, v["appendonly"], err)
		}
	}
	hv, stop := fs.localHolder(t, "redlock://"+strings.Join(addrs, ",")+"?node_timeout=400ms", k, newRegister(), roleLock)
	if ended, err := awaitGrant(hv, stop, 0); ended || err != nil {
		t.Fatalf("the holder was not granted %q: %v", k, err)
	}
	down := []int{0, 1, 2}
	var wg sync.WaitGroup
	for _, i := range down {
		wg.Go(nodes[i].Kill)
	}
	wg.Wait()
	select {
	case <-hv.ended:
	case <-time.After(2 * fs.ttl):
		t.Fatalf("the holder's lease did not end within %v of three of five nodes going down", 2*fs.ttl)
	}
	if !hv.lost {
		t.Fatalf("the holder's lease ended, but not as lost: %s", hv.endErr)
	}
	// Once the holder has called Release it does no more work: a holder that
	// closes its Locker on its own does so now.
	for end := time.Now().Add(fs.ttl); ; time.Sleep(5 * time.Millisecond) {
		hv.mu.Lock()
		rel := hv.relAt
		hv.mu.Unlock()
		if rel != 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the holder did not call Release within %v of its lease's loss", fs.ttl)
		}
	}
	for _, i := range down {
		nodes[i].Restart()
	}
	// The key was set at the grant, and is on the restarted nodes (from their
	// append-only files) until TTL after it, unless the holder deletes it.
	if back := time.Unix(0, hv.grantAt).Add(fs.ttl); time.Now().After(back) {
		t.Fatalf("the nodes were back only after the key had expired there (%v after the grant); the test proves nothing", fs.ttl)
	}
	if err := stop(); err != nil {
		t.Fatalf("stopping the holder: %v", err)
	}
	for i, h := range holders() {
		if h != "" {
			t.Errorf("node %d still holds %q (owner %s) after the holder was stopped", i, k, h)
		}
	}
}

// quietRedis drops go-redis's log lines ("failed to dial ...").
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// twoStoreHarness gives a fault trial's holder, on its first LinkedDSN, a
// store where the key is already held, and a free one after that.
type twoStoreHarness struct {
	memFaultHarness
	first string
	calls int
}

func (h *twoStoreHarness) LinkedDSN(testing.TB) (string, Link) {
	h.calls++
	if h.calls == 1 {
		return "mem://" + h.first, nil
	}
	return "mem://" + h.name, nil
}

// TestHolderNotGrantedStartsAgain: a trial holder that is not granted
// within the bound (the harness failed: here, its first store never frees
// the key) is an inconclusive attempt, started once more on a new
// LinkedDSN, where it is granted; the trial goes on with the second holder.
func TestHolderNotGrantedStartsAgain(t *testing.T) {
	h := &twoStoreHarness{memFaultHarness: memFaultHarness{name: "granted-" + t.Name()}, first: "blocked-" + t.Name()}
	k := key(t)
	blocker, err := dlock.New(memlock.Shared(h.first).NewDriver())
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close()
	lease, err := blocker.Acquire(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()

	fs := &faultSuite{h: h, ttl: h.ShortTTL(), grantBound: 500 * time.Millisecond}
	dsn, link := h.LinkedDSN(t)
	hv, _, stop, _ := fs.startHolder(t, Partition, k, newRegister(), dsn, link)
	defer func() { _ = stop() }()
	select {
	case <-hv.granted:
	default:
		t.Fatal("startHolder returned without a grant")
	}
	if h.calls != 2 {
		t.Fatalf("LinkedDSN called %d times, want 2: the holder was not started again on a new link", h.calls)
	}
}
