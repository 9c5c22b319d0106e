package nats_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	dlocknats "github.com/dlock-go/dlock/nats"
)

// consumerLimit is the consumers the buckets of the consumer-limit tests
// allow (nats-server's default is 1 000 a stream): fewer than their locks.
const consumerLimit = 4

// limitedBucket creates bucket as the driver would, with at most
// consumerLimit consumers on its stream, all but one of them taken, and
// returns a plain client's view and a function that returns once the
// stream has consumerLimit consumers.
func limitedBucket(t *testing.T, ctx context.Context, url, bucket string) (jetstream.KeyValue, func()) {
	t.Helper()
	nc, err := natsgo.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Storage: jetstream.FileStorage, LimitMarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxConsumers = consumerLimit
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Every consumer but one is taken by others.
	for i := range consumerLimit - 1 {
		if _, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: fmt.Sprintf("other-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	full := func() {
		t.Helper()
		for {
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Consumers >= consumerLimit {
				return
			}
			time.Sleep(5 * time.Millisecond) // polling the server: no signal to wait for
		}
	}
	return kv, full
}

func openLocker(t *testing.T, ctx context.Context, dsn string, opts ...dlock.Option) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(ctx, dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// TestDriverLossPastConsumerLimit: a driver holding more locks than its
// bucket's stream has consumers left still learns of each one's loss.
func TestDriverLossPastConsumerLimit(t *testing.T) {
	srv := testenv.StartNATS(t)
	ctx := testCtx(t)
	const bucket = "dlock-limit"
	kv, full := limitedBucket(t, ctx, srv.URL(), bucket)
	// Renewals (every TTL/3) would find the keys gone: the test ends long
	// before the first.
	l := openLocker(t, ctx, srv.URL()+"/"+bucket, dlock.WithTTL(time.Minute))
	// A lease held throughout, whose watch takes the last consumer.
	keep, err := l.TryAcquire(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Release(context.Background())
	full()
	const n = 2 * consumerLimit
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		var err error
		if leases[i], err = l.TryAcquire(ctx, fmt.Sprintf("k%d", i)); err != nil {
			t.Fatal(err)
		}
		defer leases[i].Release(context.Background())
	}
	// Broken behind the holders' backs, well within their TTL.
	for i := range leases {
		if err := kv.Purge(ctx, dlocknats.KeyName(fmt.Sprintf("k%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.After(5 * time.Second)
	var missed []int
	for i, lease := range leases {
		select {
		case <-lease.Done():
			if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
				t.Errorf("lease %d ended with %v, want ErrLeaseLost", i, lease.Err())
			}
		case <-deadline:
			deadline = time.After(0)
			missed = append(missed, i)
		}
	}
	if len(missed) > 0 {
		t.Fatalf("%d of %d leases never learned that their key was purged (leases %v); the stream allows %d consumers",
			len(missed), n, missed, consumerLimit)
	}
}

// TestDriverWaiterPastConsumerLimit: a waiter is woken by the release of
// its key, with no poll to fall back on, when the bucket's stream has no
// consumer left beyond the one its driver's holder uses.
func TestDriverWaiterPastConsumerLimit(t *testing.T) {
	srv := testenv.StartNATS(t)
	ctx := testCtx(t)
	const bucket = "dlock-limit"
	_, full := limitedBucket(t, ctx, srv.URL(), bucket)
	l := openLocker(t, ctx, srv.URL()+"/"+bucket+"?poll=1h", dlock.WithTTL(time.Minute))
	// The lease's watch takes the last consumer.
	held, err := l.TryAcquire(ctx, "wanted")
	if err != nil {
		t.Fatal(err)
	}
	full()
	type result struct {
		lease *dlock.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		lease, err := l.Acquire(wctx, "wanted")
		got <- result{lease, err}
	}()
	// The waiter waits (or has failed): its attempt was refused.
	for dlocknats.Waiters("wanted") < 1 {
		select {
		case r := <-got:
			t.Fatalf("the waiter ended before the release: %v", r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	// While the key stays held, a waiter woken by pushes sends nothing.
	const window = time.Second
	before := inMsgs(t, srv)
	time.Sleep(window) // the window measured
	if sent := inMsgs(t, srv) - before; sent > 10 {
		t.Errorf("the server received %d messages in %v while the waiter waited for a held key: the waiter polls", sent, window)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("the waiter failed: %v", r.err)
		}
		_ = r.lease.Release(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the release within 10s")
	}
}

// TestDriverCreateAnswerLost: an Acquire whose create reached a stalled
// server, and whose answer never came, leaves no lock behind once the
// server goes on: the key is free for another locker well before its TTL.
func TestDriverCreateAnswerLost(t *testing.T) {
	srv := testenv.StartNATS(t)
	ctx := testCtx(t)
	const bucket = "dlock-lost"
	const ttl = 30 * time.Second
	a := openLocker(t, ctx, srv.URL()+"/"+bucket+"?request-timeout=300ms", dlock.WithTTL(ttl))
	b := openLocker(t, ctx, srv.URL()+"/"+bucket, dlock.WithTTL(ttl))
	warm, err := a.TryAcquire(ctx, "warm-up")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	pid := srv.PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	waitStopped(t, pid)
	defer func() {
		if stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	lease, err := a.TryAcquire(actx, "k")
	cancel()
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatalf("granted by a stopped server: token %d", lease.Token())
	}
	t.Logf("while the server was stopped: %v", err)
	// The server now reads the create sent while it was stopped.
	_ = syscall.Kill(pid, syscall.SIGCONT)
	stopped = false
	start := time.Now()
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a third of the TTL
	defer cancel()
	lease, err = b.Acquire(bctx, "k")
	if err != nil {
		_, kv := rawKVOf(t, srv.URL(), bucket)
		if e, gerr := kv.Get(ctx, dlocknats.KeyName("k")); gerr == nil {
			t.Logf("the key holds %s (revision %d)", e.Value(), e.Revision())
		}
		t.Fatalf("the key stayed held after the Acquire whose answer was lost failed: %v", err)
	}
	t.Logf("the other locker got the key %v after the server went on", time.Since(start).Round(time.Millisecond))
	_ = lease.Release(ctx)
}

// rawKVOf returns a plain nats.go client's view of bucket, its connection
// closed in t.Cleanup.
func rawKVOf(t testing.TB, url, bucket string) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	nc, err := natsgo.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// waitStopped returns once every thread of process pid is stopped (a
// SIGSTOP takes effect on each thread as it is next scheduled).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, task := range tasks {
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if err != nil {
				continue // the thread exited
			}
			// The state follows the ")" that ends the command name.
			if i := strings.LastIndexByte(string(st), ')'); i < 0 || i+2 >= len(st) || (st[i+2] != 'T' && st[i+2] != 't') {
				running++
			}
		}
		if running == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d threads of process %d still run 10s after SIGSTOP", running, pid)
		}
		time.Sleep(time.Millisecond) // polling the kernel's view: no signal to wait for
	}
}

// inMsgs returns the messages srv has received from clients (in_msgs).
func inMsgs(t *testing.T, srv *testenv.NATS) int64 {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + srv.MonitorEndpoint() + "/varz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		InMsgs int64 `json:"in_msgs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v.InMsgs
}

// TestDriverLossDuringWatchGap: a key purged while the driver's bucket watch
// is down (between its end and its new start) still ends its lease: the
// watch reads the key of each held lease once it is set up again.
func TestDriverLossDuringWatchGap(t *testing.T) {
	srv := testenv.StartNATS(t)
	ctx := testCtx(t)
	const bucket = "dlock-gap"
	l := openLocker(t, ctx, srv.URL()+"/"+bucket, dlock.WithTTL(time.Minute))
	kept, err := l.TryAcquire(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Release(context.Background())
	lease, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	_, kv := rawKVOf(t, srv.URL(), bucket)
	var once sync.Once
	gapped := make(chan struct{})
	dlocknats.BreakWatches(t, func() {
		once.Do(func() {
			if err := kv.Purge(ctx, dlocknats.KeyName("k")); err != nil {
				t.Error(err)
			}
			close(gapped)
		})
	})
	select {
	case <-gapped:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end")
	}
	select {
	case <-lease.Done():
		if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
			t.Errorf("lease ended with %v, want ErrLeaseLost", lease.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the key purged while the watch was down: lease not ended within 5s")
	}
	select {
	case <-kept.Done():
		t.Fatalf("the lease whose key was not touched ended: %v", kept.Err())
	default:
	}
}

// TestDriverWatchSetupUnanswered: a bucket watch whose consumer creation is
// never answered (the request lost with a dying meta leader) is given up
// after the request timeout and set up again, so a held lock's loss is
// still reported at once.
func TestDriverWatchSetupUnanswered(t *testing.T) {
	srv := testenv.StartNATS(t)
	ctx := testCtx(t)
	var calls atomic.Int32
	// Replaced before the locker opens, restored after it closes.
	defer dlocknats.SetWatchKey(func(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyWatcher, error) {
		if calls.Add(1) == 1 {
			<-ctx.Done() // the first is never answered
			return nil, ctx.Err()
		}
		return kv.Watch(ctx, key, jetstream.UpdatesOnly())
	})()
	const bucket = "dlock-setup"
	l := openLocker(t, ctx, srv.URL()+"/"+bucket+"?request-timeout=500ms", dlock.WithTTL(time.Minute))
	lease, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	_, kv := rawKVOf(t, srv.URL(), bucket)
	if err := kv.Purge(ctx, dlocknats.KeyName("k")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
		if !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
			t.Errorf("lease ended with %v, want ErrLeaseLost", lease.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the key was purged but the lease did not end within 10s (%d watch setups)", calls.Load())
	}
}
