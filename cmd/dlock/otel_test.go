package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestRunExportsOTel: with the standard OTEL_ variables naming an OTLP/HTTP
// endpoint, dlock run exports the lease's spans and metrics there.
func TestRunExportsOTel(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	got := map[string][]byte{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got[r.URL.Path] = append(got[r.URL.Path], body...)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	env := []string{
		"DLOCK_DSN=mem://otel",
		"OTEL_TRACES_EXPORTER=otlp", "OTEL_METRICS_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL,
	}
	runCLI(t, env, "run", "--allow-mem", "jobs/otel", "--", "true").expectCode(t, 0)
	mu.Lock()
	defer mu.Unlock()
	for path, want := range map[string][]string{
		"/v1/traces":  {"dlock.acquire", "dlock.release", "jobs/otel"},
		"/v1/metrics": {"dlock.acquire.duration", "dlock.releases", "dlock.leases.held"},
	} {
		for _, w := range want {
			if !bytes.Contains(got[path], []byte(w)) {
				t.Errorf("%s received no %q (%d bytes)", path, w, len(got[path]))
			}
		}
	}
}

// TestOTelWanted: only an exporter or endpoint variable turns export on
// (the SDK's default would send OTLP to localhost).
func TestOTelWanted(t *testing.T) {
	for _, v := range []string{"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		t.Setenv(v, "")
	}
	if otelWanted() {
		t.Fatal("export wanted with no OTEL_ variable set")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	if otelWanted() {
		t.Fatal("export wanted with only the protocol set")
	}
	t.Setenv("OTEL_METRICS_EXPORTER", "console")
	if !otelWanted() {
		t.Fatal("export not wanted with OTEL_METRICS_EXPORTER set")
	}
}
