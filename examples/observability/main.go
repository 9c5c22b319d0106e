// Command observability wires dlock's lease events into the OpenTelemetry
// SDK with a Prometheus exporter, runs a small workload (workers taking turns
// on a few keys, one of them seeing its lease broken), and prints the dlock
// metrics a Prometheus server would scrape, with the log lines
// dlock.WithLogger writes on the way.
//
//	cd examples && go run ./observability                 # on mem://, in-process
//	cd examples && go run ./observability -dsn redis://127.0.0.1:6379/0
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	_ "github.com/dlock-go/dlock/memlock"
	_ "github.com/dlock-go/dlock/redis"
)

func main() {
	dsn := flag.String("dsn", "mem://observability", "the backend")
	flag.Parse()
	if err := run(context.Background(), *dsn, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "observability:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn string, stdout, logs io.Writer) error {
	// The SDK: a MeterProvider whose reader is a Prometheus exporter on a
	// registry of our own.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(ctx)
	obs, err := dlockotel.New(dlockotel.WithMeterProvider(mp))
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	locker, err := dlock.Open(ctx, dsn, dlock.WithObserver(obs), dlock.WithLogger(logger))
	if err != nil {
		return err
	}
	defer locker.Close()

	// The workload: 4 workers, 3 keys, 20 rounds each.
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 20 {
				key := fmt.Sprintf("jobs/%d", (w+i)%3)
				_ = dlock.Do(ctx, locker, key, func(context.Context, *dlock.Lease) error { return nil })
			}
		})
	}
	wg.Wait()
	// One lease broken behind its holder's back: counted as lost, and logged.
	lease, err := locker.Acquire(ctx, "jobs/stuck")
	if err != nil {
		return err
	}
	if _, err := dlock.Break(ctx, locker, "jobs/stuck"); err != nil {
		return err
	}
	<-lease.Done()

	// What Prometheus would scrape.
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "dlock_") && !strings.Contains(line, "_bucket{") {
			fmt.Fprintln(stdout, line)
		}
	}
	return sc.Err()
}
