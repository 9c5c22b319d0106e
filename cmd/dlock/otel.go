package main

import (
	"context"
	"os"
	"time"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
)

// otelWanted reports whether the environment asks for OpenTelemetry export:
// an exporter or an OTLP endpoint is named in the standard OTEL_ variables.
// dlock exports nothing otherwise (the SDK's default would be to send OTLP
// to localhost).
func otelWanted() bool {
	for _, v := range []string{"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		if os.Getenv(v) != "" {
			return true
		}
	}
	return false
}

// otelShutdownTimeout bounds the flush of the exporters at exit.
const otelShutdownTimeout = 5 * time.Second

// setupOTel returns the option that reports a Locker's lease events through
// OpenTelemetry, with exporters chosen by the standard OTEL_ variables
// (go.opentelemetry.io/contrib/exporters/autoexport: otlp over grpc or
// http/protobuf, console, none), and the function that flushes them at
// exit. With no OTEL_ exporter variable set it returns no option.
func setupOTel(ctx context.Context) (opt dlock.Option, shutdown func(), err error) {
	if !otelWanted() {
		return nil, func() {}, nil
	}
	spans, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, nil, err
	}
	reader, err := autoexport.NewMetricReader(ctx)
	if err != nil {
		_ = spans.Shutdown(ctx)
		return nil, nil, err
	}
	res, _ := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName("dlock")))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(spans), sdktrace.WithResource(res))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithResource(res))
	shutdown = func() {
		ctx, cancel := context.WithTimeout(context.Background(), otelShutdownTimeout)
		defer cancel()
		_ = tp.Shutdown(ctx)
		_ = mp.Shutdown(ctx)
	}
	obs, err := dlockotel.New(dlockotel.WithMeterProvider(mp), dlockotel.WithTracerProvider(tp))
	if err != nil {
		shutdown()
		return nil, nil, err
	}
	return dlock.WithObserver(obs), shutdown, nil
}
