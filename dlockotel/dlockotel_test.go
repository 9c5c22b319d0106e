package dlockotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/observe"
	"github.com/dlock-go/dlock/redis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sdk is an OpenTelemetry SDK with in-memory readers.
type sdk struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	obs    observe.Observer
}

func newSDK(t *testing.T) *sdk {
	t.Helper()
	s := &sdk{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.spans))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = tp.Shutdown(context.Background()) })
	obs, err := dlockotel.New(dlockotel.WithMeterProvider(mp), dlockotel.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	s.obs = obs
	return s
}

// sum returns the value of counter name (or the count of histogram name)
// over the data points whose attributes include want.
func (s *sdk) sum(t *testing.T, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	has := func(set attribute.Set) bool {
		for _, kv := range want {
			if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if has(p.Attributes) {
						n += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if has(p.Attributes) {
						n += int64(p.Count)
					}
				}
			}
		}
	}
	return n
}

// span returns the ended spans named name.
func (s *sdk) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, sp := range s.spans.Ended() {
		if sp.Name() == name {
			out = append(out, sp)
		}
	}
	return out
}

func attr(sp sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range sp.Attributes() {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// scenarios runs the events every backend must report: a granted acquire, a
// try on a held lock, a cancelled wait and a release, then a lease lost
// because the lock was deleted behind its holder's back (del).
func scenarios(t *testing.T, s *sdk, dsn, backend string, del func(key string)) {
	ctx := context.Background()
	l, err := dlock.Open(ctx, dsn, dlock.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	be := dlockotel.AttrBackend.String(backend)

	lease, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.sum(t, "dlock.leases.held", be); got != 1 {
		t.Errorf("dlock.leases.held = %d while one lease is held", got)
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := l.Acquire(cctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	if err := lease.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		want []attribute.KeyValue
		n    int64
	}{
		{"dlock.acquire.duration", []attribute.KeyValue{be, dlockotel.AttrMode.String("wait"), dlockotel.AttrOutcome.String("granted")}, 1},
		{"dlock.acquire.duration", []attribute.KeyValue{be, dlockotel.AttrMode.String("try"), dlockotel.AttrOutcome.String("not-acquired")}, 1},
		{"dlock.acquire.duration", []attribute.KeyValue{be, dlockotel.AttrMode.String("wait"), dlockotel.AttrOutcome.String("cancelled")}, 1},
		{"dlock.renewals", []attribute.KeyValue{be, dlockotel.AttrOutcome.String("ok")}, 1},
		{"dlock.releases", []attribute.KeyValue{be, dlockotel.AttrOutcome.String("ok")}, 1},
		{"dlock.lease.duration", []attribute.KeyValue{be, dlockotel.AttrEnd.String("released")}, 1},
		{"dlock.leases.held", []attribute.KeyValue{be}, 0},
	} {
		if got := s.sum(t, c.name, c.want...); got != c.n {
			t.Errorf("%s %v = %d, want %d", c.name, c.want, got, c.n)
		}
	}
	acq := s.ended("dlock.acquire")
	if len(acq) != 3 {
		t.Fatalf("%d dlock.acquire spans, want 3", len(acq))
	}
	if v, _ := attr(acq[0], dlockotel.AttrToken); v.AsInt64() != int64(lease.Token()) {
		t.Errorf("dlock.acquire span: token %v, want %d", v, lease.Token())
	}
	if v, _ := attr(acq[0], dlockotel.AttrKey); v.AsString() != "k" {
		t.Errorf("dlock.acquire span: key %v", v)
	}
	if len(s.ended("dlock.release")) != 1 {
		t.Errorf("%d dlock.release spans, want 1", len(s.ended("dlock.release")))
	}
	renew := s.ended("dlock.renew")
	if len(renew) != 1 {
		t.Fatalf("%d dlock.renew spans, want 1", len(renew))
	}
	if v, _ := attr(renew[0], dlockotel.AttrOutcome); v.AsString() != "ok" {
		t.Errorf("dlock.renew span: outcome %v, want ok", v)
	}
	if renew[0].Parent().SpanID() != acq[0].SpanContext().SpanID() || renew[0].SpanContext().TraceID() != acq[0].SpanContext().TraceID() {
		t.Errorf("dlock.renew span is not a child of the granting acquire's span")
	}

	// A lease whose lock is deleted behind its back: its next renewal says so.
	lost, err := l.Acquire(ctx, "gone", dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	del("gone")
	if err := lost.Refresh(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("renewal of a deleted lock: %v", err)
	}
	<-lost.Done() // the observer has seen the end by then
	if got := s.sum(t, "dlock.leases.lost", be, dlockotel.AttrCause.String("backend-reported")); got != 1 {
		t.Errorf("dlock.leases.lost{cause=backend-reported} = %d, want 1", got)
	}
	// (The renewal's own error is counted only where the backend did not
	// report the loss first: mem:// does at once.)
	if got := s.sum(t, "dlock.renewals", be, dlockotel.AttrOutcome.String("error")); got > 1 {
		t.Errorf("dlock.renewals{outcome=error} = %d, want at most 1", got)
	}
	spans := s.ended("dlock.lease.lost")
	if len(spans) != 1 {
		t.Fatalf("%d dlock.lease.lost spans, want 1", len(spans))
	}
	last := spans[0]
	if last.Status().Code.String() != "Error" {
		t.Errorf("a lost lease's span status %v, want Error", last.Status())
	}
	if v, _ := attr(last, dlockotel.AttrCause); v.AsString() != "backend-reported" {
		t.Errorf("dlock.lease.lost span: cause %v, want backend-reported", v)
	}
	found := false
	for _, ev := range last.Events() {
		found = found || ev.Name == "lost"
	}
	if !found {
		t.Error("a lost lease's span has no \"lost\" event")
	}
	var granting sdktrace.ReadOnlySpan
	for _, sp := range s.ended("dlock.acquire") {
		if v, _ := attr(sp, dlockotel.AttrKey); v.AsString() == "gone" {
			granting = sp
		}
	}
	if granting == nil || last.Parent().SpanID() != granting.SpanContext().SpanID() {
		t.Error("the dlock.lease.lost span is not a child of the granting acquire's span")
	}
}

func TestMem(t *testing.T) {
	s := newSDK(t)
	scenarios(t, s, "mem://dlockotel", "mem", func(key string) {
		l, _ := dlock.Open(context.Background(), "mem://dlockotel")
		defer l.Close()
		if _, err := dlock.Break(context.Background(), l, key); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRedis(t *testing.T) {
	srv := testenv.StartRedis(t)
	s := newSDK(t)
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer raw.Close()
	scenarios(t, s, srv.URL(), "redis", func(key string) {
		if err := raw.Del(context.Background(), redis.LockKey(redis.DefaultPrefix, key)).Err(); err != nil {
			t.Fatal(err)
		}
	})

	// A renewal that fails because the server is gone ends the lease as
	// renewal-failed.
	l, err := dlock.Open(context.Background(), srv.URL(), dlock.WithObserver(s.obs), dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.Acquire(context.Background(), "down")
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	<-lease.Done()
	if got := s.sum(t, "dlock.leases.lost", dlockotel.AttrBackend.String("redis"), dlockotel.AttrCause.String("renewal-failed")); got != 1 {
		t.Errorf("dlock.leases.lost{cause=renewal-failed} = %d after the server died, want 1 (lease: %v)", got, lease.Err())
	}
}

// TestRejectionCounter: a guard's rejected stale write is counted.
func TestRejectionCounter(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	count, err := dlockotel.RejectionCounter(dlockotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	g := fencing.Guard{OnReject: count}
	if err := g.Do("r", 5, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := g.Do("r", 4, func() error { return nil }); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("stale write: %v", err)
	}
	s := &sdk{reader: reader}
	if got := s.sum(t, "dlock.fencing.rejections"); got != 1 {
		t.Errorf("dlock.fencing.rejections = %d after one stale write, want 1", got)
	}
}
