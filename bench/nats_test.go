package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
	dlocknats "github.com/dlock-go/dlock/nats" // nats://
)

// natsFloorBucket is the floor's bucket, configured as the driver configures
// the buckets it creates.
const natsFloorBucket = "floor"

type natsEnv struct {
	srv   *testenv.NATS
	reqs  func() (float64, error)
	impls []impl
}

func startNATSEnv(tb testing.TB) *natsEnv {
	e := &natsEnv{srv: testenv.StartNATS(tb)}
	e.reqs = natsInMsgs(e.srv.MonitorEndpoint())
	url := e.srv.URL()
	// The floor's bucket, created once (the driver creates its own on open).
	nc := newNATSConn(tb, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("nats: jetstream: %v", err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         natsFloorBucket,
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       1,
		LimitMarkerTTL: dlocknats.DefaultMarkerTTL,
	}); err != nil {
		tb.Fatalf("nats: floor bucket: %v", err)
	}
	e.impls = []impl{
		dlockImpl("dlock", url+"/dlock", e.reqs),
		{name: "floor", newLocker: func(tb testing.TB) locker { return newNATSFloor(tb, url) }, reqs: e.reqs},
		{name: "floor-watch", newLocker: func(tb testing.TB) locker { return newNATSFloorWatch(tb, url) }, reqs: e.reqs},
	}
	return e
}

// natsInMsgs returns a reader of the messages the server has received from
// clients (in_msgs from /varz): every publish, JetStream API requests
// (consumer create and delete) and key-value writes alike.
func natsInMsgs(monitor string) func() (float64, error) {
	return func() (float64, error) {
		var v struct {
			InMsgs *float64 `json:"in_msgs"`
		}
		if err := readVarz(monitor, &v); err != nil {
			return 0, err
		}
		if v.InMsgs == nil {
			return 0, errors.New("nats /varz: no in_msgs")
		}
		return *v.InMsgs, nil
	}
}

// readVarz decodes the server's /varz (at monitor, host:port) into v.
func readVarz(monitor string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+monitor+"/varz", nil)
	if err != nil {
		return err
	}
	resp, err := natsHTTP.Do(req)
	if err != nil {
		return fmt.Errorf("nats /varz: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("nats /varz: %w", err)
	}
	return nil
}

// natsHTTP keeps no idle connections, so no transport goroutine outlives a
// reading (goleak).
var natsHTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func newNATSConn(tb testing.TB, url string) *natsgo.Conn {
	nc, err := natsgo.Connect(url, natsgo.Name("bench"))
	if err != nil {
		tb.Fatalf("nats: connect: %v", err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// natsFloor is the least a NATS key-value lock with expiry does, with the
// driver's own writes: a create-only write with a per-key TTL (the bench TTL,
// in whole seconds), and a purge conditional on the create's revision that
// leaves a marker for the bucket's marker TTL.
type natsFloor struct{ kv jetstream.KeyValue }

func newNATSFloor(tb testing.TB, url string) natsFloor {
	nc := newNATSConn(tb, url)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("floor: jetstream: %v", err)
	}
	kv, err := js.KeyValue(context.Background(), natsFloorBucket)
	if err != nil {
		tb.Fatalf("floor: bucket: %v", err)
	}
	return natsFloor{kv}
}

func (f natsFloor) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	if wait {
		return nil, fmt.Errorf("floor: cannot wait")
	}
	k := dlocknats.KeyName(key)
	rev, err := f.kv.Create(ctx, k, []byte(backend.NewOwnerID()), jetstream.KeyTTL(benchTTL))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("floor: %q is held", k)
	}
	if err != nil {
		return nil, err
	}
	return func() error {
		return f.kv.Purge(context.Background(), k, jetstream.LastRevision(rev), jetstream.PurgeTTL(dlocknats.DefaultMarkerTTL))
	}, nil
}

// natsHold is how long the Held scenario holds each lease: long enough for
// floor-watch's loss watch (set up after the grant, in the background) to
// start.
const natsHold = 20 * time.Millisecond

// Sizes of BenchmarkNATS's own scenarios, fixed (not b.N: a held cycle
// takes natsHold, and a count of requests needs no more).
const (
	natsHeldRounds    = 100 // Held: rounds
	natsRequestCycles = 100 // Requests: cycles released at once, per implementation
	natsHeldCycles    = 50  // Requests: held cycles, per implementation
)

// natsFloorWatch is the floor plus a loss watch per held lock (what the
// driver did before it watched its whole bucket through one consumer): a
// watch of the key (nats.go's KeyValue.Watch, an ordered consumer),
// started in the background after the create and read until the release,
// which ends it (deleting its consumer) in the background too.
type natsFloorWatch struct {
	natsFloor
	wg *sync.WaitGroup // the watches; tb's cleanup waits for them
}

func newNATSFloorWatch(tb testing.TB, url string) natsFloorWatch {
	f := natsFloorWatch{natsFloor: newNATSFloor(tb, url), wg: new(sync.WaitGroup)}
	tb.Cleanup(f.wg.Wait) // registered after the connection's close: runs before it
	return f
}

func (f natsFloorWatch) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	unlock, err := f.natsFloor.lock(ctx, key, wait)
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	f.wg.Go(func() {
		w, err := f.kv.Watch(wctx, dlocknats.KeyName(key))
		if err != nil {
			return
		}
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-wctx.Done():
				return
			case _, ok := <-w.Updates():
				if !ok {
					return
				}
			}
		}
	})
	return func() error {
		stop()
		return unlock()
	}, nil
}

// BenchmarkNATS compares dlock's NATS driver with the raw floor on one
// nats-server with JetStream; the scenarios are BenchmarkRedis's (no peer
// library: NATS users build their lock on the key-value store's create),
// and two of its own:
//
//   - Held: natsHeldRounds of Uncontended's interleaved rounds, each lease
//     held for natsHold before its release: IMPL.cycle-ns is the mean
//     acquire plus release, without the hold (floor-watch's loss watch starts
//     during the hold).
//   - Requests: the messages the server receives per cycle of each
//     implementation, one implementation at a time: IMPL.reqs/cycle over
//     natsRequestCycles released at once (as in Uncontended),
//     IMPL.reqs/cycle-held over natsHeldCycles held for natsHold.
//
// Both ignore b.N: run them with any -benchtime; each run is one sample.
func BenchmarkNATS(b *testing.B) {
	e := startNATSEnv(b)
	benchBackend(b, e.impls)
	b.Run("Held", func(b *testing.B) {
		for name, d := range runHeld(b, e.impls, natsHeldRounds, natsHold) {
			report(b, float64(d.Nanoseconds()), name+".cycle-ns")
		}
	})
	b.Run("Requests", func(b *testing.B) {
		for _, im := range e.impls {
			report(b, runRequestsPerCycle(b, im, natsRequestCycles, 0), im.name+".reqs/cycle")
			report(b, runRequestsPerCycle(b, im, natsHeldCycles, natsHold), im.name+".reqs/cycle-held")
		}
	})
}

// runHeld runs n rounds of an uncontended try-acquire, a hold of hold and a
// release of every implementation, in shuffled order (as runUncontended),
// and returns each implementation's mean acquire + release time, without
// the hold.
func runHeld(tb testing.TB, impls []impl, n int, hold time.Duration) map[string]time.Duration {
	ctx := context.Background()
	ls := make([]locker, len(impls))
	keys := make([]string, len(impls))
	sums := make([]time.Duration, len(impls))
	for i, im := range impls {
		ls[i] = im.newLocker(tb)
		keys[i] = uniqueKey("held", im.name)
	}
	resetTimer(tb)
	inShuffledRounds(len(impls), n, func(i int) {
		start := time.Now()
		unlock, err := ls[i].lock(ctx, keys[i], false)
		if err != nil {
			tb.Fatalf("%s: lock: %v", impls[i].name, err)
		}
		took := time.Since(start)
		time.Sleep(hold)
		start = time.Now()
		if err := unlock(); err != nil {
			tb.Fatalf("%s: unlock: %v", impls[i].name, err)
		}
		sums[i] += took + time.Since(start)
	})
	stopTimer(tb)
	res := make(map[string]time.Duration, len(impls))
	for i, im := range impls {
		res[im.name] = sums[i] / time.Duration(max(n, 1))
	}
	return res
}

// runRequestsPerCycle runs n try-acquire, hold, release cycles of im on one
// key with one client, after a warm-up cycle, and returns the server
// requests per cycle.
func runRequestsPerCycle(tb testing.TB, im impl, n int, hold time.Duration) float64 {
	ctx := context.Background()
	l := im.newLocker(tb)
	key := uniqueKey("requests", im.name)
	cycle := func() {
		unlock, err := l.lock(ctx, key, false)
		if err != nil {
			tb.Fatalf("%s: lock: %v", im.name, err)
		}
		time.Sleep(hold)
		if err := unlock(); err != nil {
			tb.Fatalf("%s: unlock: %v", im.name, err)
		}
	}
	cycle()
	before := readReqs(tb, im)
	for range n {
		cycle()
	}
	return (readReqs(tb, im) - before) / float64(n)
}

// TestSmokeNATS runs BenchmarkNATS's own scenarios, Held and Requests, at
// tiny sizes (TestSmoke runs the shared ones).
func TestSmokeNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server: not in -short")
	}
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs after the server's and clients' cleanups
	e := startNATSEnv(t)
	held := runHeld(t, e.impls, 3, natsHold)
	for _, im := range e.impls {
		if held[im.name] <= 0 {
			t.Errorf("%s: held: %v per cycle", im.name, held[im.name])
		}
		// At least a create and a purge per cycle.
		if r := runRequestsPerCycle(t, im, 3, 0); r < 2 {
			t.Errorf("%s: %v requests per cycle, want ≥ 2", im.name, r)
		}
		if r := runRequestsPerCycle(t, im, 3, natsHold); r < 2 {
			t.Errorf("%s: %v requests per held cycle, want ≥ 2", im.name, r)
		}
	}
}
