package bench

import (
	"context"
	"testing"

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
// and with the SDK's MeterProvider alone ("otel-metrics").
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
	}
	b.Run("Uncontended", func(b *testing.B) {
		reportUncontended(b, runUncontended(b, impls, b.N))
	})
}
