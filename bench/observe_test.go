package bench

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/internal/testenv"
)

// BenchmarkObserve measures what observability costs an uncontended
// try-acquire + release on one Redis server, the implementations
// interleaved round by round (see runUncontended): dlock without an
// observer ("dlock"), with dlockotel over the OpenTelemetry API's no-op
// providers ("otel-noop"), and with the SDK's MeterProvider (a manual
// reader) and TracerProvider (every span sampled, no exporter) ("otel-sdk"),
// and with the SDK's MeterProvider alone ("otel-metrics"). The raw floor
// ("floor") and the floor wrapped in the spans and recordings dlockotel
// makes per cycle, made by hand with the same providers ("floor+sdk"), give
// what the SDK itself costs a cycle, whoever calls it.
func BenchmarkObserve(b *testing.B) {
	srv := testenv.StartRedis(b)
	reqs := redisCalls(b, srv.Addr())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider()
	b.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	observed := func(name string, opts ...dlockotel.Option) impl {
		return impl{name: name, reqs: reqs, newLocker: func(tb testing.TB) locker {
			obs, err := dlockotel.New(opts...)
			if err != nil {
				tb.Fatal(err)
			}
			return dlockLocker{openDlock(tb, srv.URL(), benchTTL, dlock.WithObserver(obs))}
		}}
	}
	impls := []impl{
		dlockImpl("dlock", srv.URL(), reqs),
		dlockImpl("dlock-again", srv.URL(), reqs), // A/A control: the noise of a ratio of two equals
		observed("otel-noop", dlockotel.WithMeterProvider(metricnoop.NewMeterProvider()), dlockotel.WithTracerProvider(tracenoop.NewTracerProvider())),
		observed("otel-metrics", dlockotel.WithMeterProvider(mp), dlockotel.WithTracerProvider(tracenoop.NewTracerProvider())),
		observed("otel-sdk", dlockotel.WithMeterProvider(mp), dlockotel.WithTracerProvider(tp)),
		{name: "floor", reqs: reqs, newLocker: func(tb testing.TB) locker { return newRedisFloor(tb, srv.Addr()) }},
		{name: "floor+sdk", reqs: reqs, newLocker: func(tb testing.TB) locker {
			return newSDKFloor(tb, newRedisFloor(tb, srv.Addr()), mp, tp)
		}},
	}
	b.Run("Uncontended", func(b *testing.B) {
		reportUncontended(b, runUncontended(b, impls, b.N))
	})
}

// sdkFloor wraps a floor in the OpenTelemetry calls dlockotel makes for an
// uncontended try-acquire + release, made directly: a client span for the
// acquire (backend, mode and key at its start; outcome and token at its
// end) and one for the release, the acquire's duration recorded, and at the
// release a release counted and the lease's duration recorded, each with an
// attribute set built once. It is the least any instrumentation with those
// spans and metrics costs on the SDK.
type sdkFloor struct {
	inner                     locker
	tracer                    trace.Tracer
	client                    trace.SpanStartOption
	acquireDur                metric.Float64Histogram
	releases                  metric.Int64Counter
	leaseDur                  metric.Float64Histogram
	granted, released         []metric.RecordOption
	releaseOK                 []metric.AddOption
	backend, modeTry          attribute.KeyValue
	outcomeOK, outcomeGranted attribute.KeyValue
}

func newSDKFloor(tb testing.TB, inner locker, mp metric.MeterProvider, tp trace.TracerProvider) *sdkFloor {
	m := mp.Meter("floor+sdk")
	f := &sdkFloor{inner: inner, tracer: tp.Tracer("floor+sdk"), client: trace.WithSpanKind(trace.SpanKindClient),
		backend: dlockotel.AttrBackend.String("redis"), modeTry: dlockotel.AttrMode.String("try"),
		outcomeOK: dlockotel.AttrOutcome.String("ok"), outcomeGranted: dlockotel.AttrOutcome.String("granted")}
	var err error
	if f.acquireDur, err = m.Float64Histogram("floor.acquire.duration", metric.WithUnit("s")); err != nil {
		tb.Fatal(err)
	}
	if f.releases, err = m.Int64Counter("floor.releases"); err != nil {
		tb.Fatal(err)
	}
	if f.leaseDur, err = m.Float64Histogram("floor.lease.duration", metric.WithUnit("s")); err != nil {
		tb.Fatal(err)
	}
	f.granted = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(f.backend, f.modeTry, f.outcomeGranted))}
	f.releaseOK = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(f.backend, f.outcomeOK))}
	f.released = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(f.backend, dlockotel.AttrEnd.String("released")))}
	return f
}

func (f *sdkFloor) lock(ctx context.Context, key string, wait bool) (func() error, error) {
	start := time.Now()
	actx, span := f.tracer.Start(ctx, "dlock.acquire",
		trace.WithAttributes(f.backend, f.modeTry, dlockotel.AttrKey.String(key)), f.client)
	unlock, err := f.inner.lock(actx, key, wait)
	if err != nil {
		span.End()
		return nil, err
	}
	granted := time.Now()
	f.acquireDur.Record(actx, granted.Sub(start).Seconds(), f.granted...)
	span.SetAttributes(f.outcomeGranted, dlockotel.AttrToken.Int64(1))
	span.End()
	leaseCtx := trace.ContextWithSpanContext(context.Background(), span.SpanContext())
	return func() error {
		_, rs := f.tracer.Start(ctx, "dlock.release", f.client)
		err := unlock()
		f.releases.Add(leaseCtx, 1, f.releaseOK...)
		rs.SetAttributes(f.backend, f.outcomeOK, dlockotel.AttrToken.Int64(1))
		rs.End()
		f.leaseDur.Record(leaseCtx, time.Since(granted).Seconds(), f.released...)
		return err
	}, nil
}
