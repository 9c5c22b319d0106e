package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/testenv"
)

func TestBench(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	out := filepath.Join(t.TempDir(), "report.html")
	r := runCLI(t, nil, "bench", "--dsn", "mem://bench", "--dsn", srv.URL(), "--clients", "3", "--duration", "1s", "--out", out)
	r.expectCode(t, 0)
	rows := regexp.MustCompile(`(?m)^(\S+) +strict +\S+ +\S+ +[\d,.]+ grants/s +\S+ +\S+ +\d+%$`).FindAllStringSubmatch(r.stdout, -1)
	if len(rows) != 2 || rows[0][1] != "mem://bench" || rows[1][1] != srv.URL() {
		t.Errorf("table rows %q\n%s", rows, r.stdout)
	}
	for _, want := range []string{"[1/2] mem://bench  acquire", "[2/2] " + srv.URL() + "  contended", "dlock: wrote " + out} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}

	html, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	svgs := regexp.MustCompile(`(?s)<svg.*?</svg>`).FindAll(html, -1)
	if len(svgs) != 3 {
		t.Fatalf("report has %d SVG charts, want 3", len(svgs))
	}
	bars := 0
	for _, svg := range svgs {
		bars += checkSVG(t, svg)
	}
	if bars != 2*(2+1+2) { // 2 backends × (p50, p99; throughput; p50, p99)
		t.Errorf("%d bars in the charts, want 10", bars)
	}
	if !bytes.Contains(html, []byte("<td>"+srv.URL()+"</td>")) {
		t.Errorf("report table lacks the backend %s", srv.URL())
	}
	checkRendered(t, out, []string{"mem://bench", srv.URL()})

	// The benchmark's fence counters were deleted.
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer raw.Close()
	if keys, err := raw.Keys(context.Background(), "*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("keys left on the server: %q, %v", keys, err)
	}
}

func TestBenchUnreachable(t *testing.T) {
	t.Parallel()
	dsn := "redis://:sekret@127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	r := runCLI(t, nil, "bench", "--dsn", "mem://bench2", "--dsn", dsn, "--clients", "2", "--duration", "200ms")
	r.expectCode(t, exitUnavailable)
	if !strings.Contains(r.stdout, "mem://bench2") || !strings.Contains(r.stdout, "redis://:xxxxx@") || strings.Contains(r.stdout+r.stderr, "sekret") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
}

// checkSVG fails the test unless svg is well-formed XML with an <svg> root,
// and returns the number of bars in it.
func checkSVG(t *testing.T, svg []byte) int {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	d.Strict = true
	bars, depth := 0, 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v\n%s", err, svg)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if depth == 0 && e.Name.Local != "svg" {
				t.Fatalf("root element <%s>, want <svg>", e.Name.Local)
			}
			depth++
			for _, a := range e.Attr {
				if e.Name.Local == "rect" && a.Name.Local == "class" && a.Value == "bar" {
					bars++
				}
			}
		case xml.EndElement:
			depth--
		}
	}
	if depth != 0 {
		t.Fatalf("SVG ends inside an element")
	}
	return bars
}

func TestReportFormats(t *testing.T) {
	results := []benchResult{
		{DSN: `mem://<a & "b">`, Caps: backend.Capabilities{Fencing: backend.FencingStrict}, Acquires: 10,
			AcquireP50: time.Microsecond, AcquireP99: 3 * time.Microsecond, Clients: 2, Grants: 100, Throughput: 12345.6,
			HandoffP50: 2 * time.Microsecond, HandoffP99: 9 * time.Microsecond, ChangedHands: 50},
		{DSN: "redis://h:6379/0", Err: errors.New("dlock: open (redis): connection refused"), Unreachable: true, Clients: 2},
	}
	dir := t.TempDir()
	s := benchSettings{clients: 2, duration: time.Second}

	svgPath := filepath.Join(dir, "r.svg")
	if err := writeReport(svgPath, "svg", results, s); err != nil {
		t.Fatal(err)
	}
	svg, _ := os.ReadFile(svgPath)
	if bars := checkSVG(t, svg[bytes.Index(svg, []byte("<svg")):]); bars != 10 {
		t.Errorf("%d bars, want 10", bars)
	}
	if !bytes.Contains(svg, []byte("mem://&lt;a &amp; &#34;b&#34;&gt;")) {
		t.Errorf("label not escaped:\n%s", svg)
	}

	htmlPath := filepath.Join(dir, "r.html")
	if err := writeReport(htmlPath, "html", results, s); err != nil {
		t.Fatal(err)
	}
	html, _ := os.ReadFile(htmlPath)
	for _, want := range []string{"<td>mem://&lt;a &amp; &#34;b&#34;&gt;</td>", "12,346 grants/s", "open (redis): connection refused"} {
		if !bytes.Contains(html, []byte(want)) {
			t.Errorf("HTML lacks %q", want)
		}
	}

	for name, want := range map[string]string{"r.htm": "html", "R.SVG": "svg", "r.png": "", "r": ""} {
		if got, _ := reportFormat(name); got != want {
			t.Errorf("reportFormat(%q) = %q, want %q", name, got, want)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"bench", "--dsn", "mem://x", "--out", filepath.Join(dir, "r.png")}, &stdout, &stderr); code != exitUsage ||
		!strings.Contains(stderr.String(), "PNG is not supported") {
		t.Errorf("--out r.png: status %d, stderr %q", code, stderr.String())
	}
}

func TestBenchUsage(t *testing.T) {
	t.Setenv("DLOCK_DSN", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench"}, "no backend"},
		{[]string{"bench", "--dsn", "mem://x", "--clients", "1"}, "--clients must be from 2 to 1000"},
		{[]string{"bench", "--dsn", "mem://x", "--duration", "10ms"}, "--duration must be at least 200ms"},
		{[]string{"bench", "--dsn", "mem://x", "--dsn", "nope://x"}, `--dsn #2: unknown DSN scheme "nope"`},
		{[]string{"bench", "--dsn", "mem://x", "--out", "/no/such/dir/r.html"}, `no directory "/no/such/dir"`},
		{[]string{"bench", "mem://x"}, "give each backend with --dsn"},
	} {
		var stdout, stderr bytes.Buffer
		if code := dispatch(c.args, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: status %d, stderr %q; want %d and %q", c.args, code, stderr.String(), exitUsage, c.want)
		}
	}
}

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "-", 950: "950ns", 1234: "1.2µs", 12345: "12µs", 123456: "123µs",
		1234567: "1.2ms", 25 * time.Millisecond: "25ms", 2500 * time.Millisecond: "2.5s",
	} {
		if got := formatDuration(d); got != want {
			t.Errorf("formatDuration(%d) = %q, want %q", d, got, want)
		}
	}
	for v, want := range map[float64]string{3.214: "3.2", 45.6: "46", 789: "789", 12345.4: "12,345", 1234567: "1,234,567"} {
		if got := formatRate(v); got != want {
			t.Errorf("formatRate(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestSampler(t *testing.T) {
	var s sampler
	if s.percentile(50) != 0 {
		t.Error("percentile of nothing is not 0")
	}
	for i := 1; i <= 3*maxSamples; i++ {
		s.add(time.Duration(i))
	}
	if s.n != 3*maxSamples || len(s.buf) != maxSamples {
		t.Fatalf("n %d, kept %d", s.n, len(s.buf))
	}
	// A uniform sample of 1..300000: p50 near 150000, p99 near 297000.
	if p := s.percentile(50); p < 140000 || p > 160000 {
		t.Errorf("p50 = %d", p)
	}
	if p := s.percentile(99); p < 290000 {
		t.Errorf("p99 = %d", p)
	}
	var small sampler
	for _, d := range []time.Duration{5, 1, 4, 2, 3} {
		small.add(d)
	}
	if small.percentile(50) != 3 || small.percentile(99) != 5 || small.percentile(0) != 1 {
		t.Errorf("percentiles of 1..5: %d %d %d", small.percentile(50), small.percentile(99), small.percentile(0))
	}
}
