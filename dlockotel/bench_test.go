package dlockotel_test

import (
	"context"
	"strings"
	"testing"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/observe"
)

// BenchmarkOverhead is an uncontended Acquire+Release on mem:// (the
// cheapest backend, so the observer's share is the largest it can be):
// without an observer, with the API's no-op providers, and with the SDK's
// MeterProvider (a manual reader) and TracerProvider (every span sampled,
// no exporter).
func BenchmarkOverhead(b *testing.B) { benchOverhead(b, "mem://overhead-") }

// BenchmarkOverheadRedis is BenchmarkOverhead on a real Redis server, where
// a round trip dominates: the observer's cost as a share of a real acquire.
func BenchmarkOverheadRedis(b *testing.B) {
	srv := testenv.StartRedis(b)
	benchOverhead(b, srv.URL()+"?x-bench=")
}

func benchOverhead(b *testing.B, dsnPrefix string) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider()
	defer mp.Shutdown(context.Background())
	defer tp.Shutdown(context.Background())
	noop, err := dlockotel.New(dlockotel.WithMeterProvider(metricnoop.NewMeterProvider()), dlockotel.WithTracerProvider(tracenoop.NewTracerProvider()))
	if err != nil {
		b.Fatal(err)
	}
	withSDK, err := dlockotel.New(dlockotel.WithMeterProvider(mp), dlockotel.WithTracerProvider(tp))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		obs  observe.Observer
	}{{"none", nil}, {"noop", noop}, {"sdk", withSDK}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			var opts []dlock.Option
			if c.obs != nil {
				opts = append(opts, dlock.WithObserver(c.obs))
			}
			dsn := dsnPrefix + c.name
			if !strings.HasPrefix(dsn, "mem:") {
				dsn = strings.TrimSuffix(dsnPrefix, "?x-bench=")
			}
			l, err := dlock.Open(ctx, dsn, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.ReportAllocs()
			for b.Loop() {
				lease, err := l.Acquire(ctx, "k")
				if err != nil {
					b.Fatal(err)
				}
				if err := lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
