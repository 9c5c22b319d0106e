package nats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
	dlocknats "github.com/dlock-go/dlock/nats"
)

func TestMain(m *testing.M) {
	conformance.Main(m) // in a child process of the fault suite, runs the child and exits
	goleak.VerifyTestMain(m)
}

// testBucket is the bucket every test uses; conformance keys are unique per run.
const testBucket = "dlock-test"

// harness runs the conformance suite on a deployment given by its client URL.
type harness struct {
	url string // nats://host:port[,nats://…]
	dsn string
	kv  jetstream.KeyValue // for Expire, behind the lockers' backs
	js  jetstream.JetStream
	// legacy reads through the stream's leader (Residue): a direct read, as
	// KeyValue.Get makes, may come from a replica that lags behind a release.
	legacy natsgo.JetStreamContext
}

func newHarness(t testing.TB, url, dsn string) *harness {
	t.Helper()
	h := &harness{url: url, dsn: dsn}
	// The first locker creates the bucket; the raw client then opens it.
	createBucket(t, dsn)
	h.js, h.kv = rawKV(t, url)
	nc, err := natsgo.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if h.legacy, err = nc.JetStream(); err != nil {
		t.Fatal(err)
	}
	return h
}

// createBucket opens a locker on dsn, which creates its bucket, and closes
// it. A cluster that has just started may take longer than one request
// timeout to place a replicated stream, so it tries for up to a minute.
func createBucket(t testing.TB, dsn string) {
	t.Helper()
	var bo backend.Backoff
	for deadline := time.Now().Add(time.Minute); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		l, err := dlock.Open(ctx, dsn)
		cancel()
		if err == nil {
			_ = l.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("creating the bucket of %s: %v", dsn, err)
		}
		t.Logf("creating the bucket: %v; trying again", err)
		_ = backend.Sleep(context.Background(), bo.Next())
	}
}

// rawKV returns a plain nats.go client's view of the test bucket, its
// connection closed in t.Cleanup.
func rawKV(t testing.TB, url string) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	return rawKVOf(t, url, testBucket)
}

func (h *harness) DSN(testing.TB) string { return h.dsn }

func (h *harness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, h.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// Expire purges key's lock, as the server does when its TTL runs out.
func (h *harness) Expire(t testing.TB, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.kv.Purge(ctx, dlocknats.KeyName(key)); err != nil {
		t.Fatalf("Expire(%q): %v", key, err)
	}
}

// ShortTTL is two whole seconds: nats-server counts TTLs in seconds.
func (*harness) ShortTTL() time.Duration { return 2 * time.Second }

// Residue reports key's lock if the bucket holds a live value for it
// (markers of deleted keys expire on their own and hold no lock).
func (h *harness) Residue(t testing.TB, key string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := h.legacy.GetLastMsg("KV_"+testBucket, "$KV."+testBucket+"."+dlocknats.KeyName(key), natsgo.Context(ctx))
	if errors.Is(err, natsgo.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("Residue(%q): %v", key, err)
	}
	if m.Header.Get("KV-Operation") != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return nil // a marker of a deleted, purged or expired key
	}
	return []string{dlocknats.KeyName(key) + "=" + string(m.Data)}
}

// Waiters counts the waiting Acquires of key that the bucket watch of their
// driver covers (the waiters share their driver's one consumer, so the
// server cannot tell them apart).
func (h *harness) Waiters(t testing.TB, key string) int {
	return dlocknats.Waiters(key)
}

var (
	_ conformance.DSNer         = (*harness)(nil)
	_ conformance.Inspector     = (*harness)(nil)
	_ conformance.WaiterCounter = (*harness)(nil)
)

func startHarness(t testing.TB) *harness {
	t.Helper()
	srv := testenv.StartNATS(t)
	return newHarness(t, srv.URL(), srv.URL()+"/"+testBucket)
}

func TestConformance(t *testing.T) {
	conformance.Run(t, startHarness(t))
}
