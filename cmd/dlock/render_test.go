package main

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testenv"
)

// checkRendered renders the HTML report at path in headless Chromium, as
// someone opening it would see it, and checks what is on the page: three
// charts, each with its title, a label for every backend, values with their
// units, its axis line, and bars in the series' colours on the screenshot.
// The screenshot is kept in $DLOCK_ARTIFACTS when that is set.
func checkRendered(t *testing.T, path string, backends []string) {
	t.Helper()
	chromium := testenv.Binary(t, "chromium", "chromium")
	dir := t.TempDir()
	shot := filepath.Join(dir, "report.png")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=1100,1400"}
	url := "file://" + path
	if out, err := exec.CommandContext(ctx, chromium, append(flags, "--screenshot="+shot, url)...).CombinedOutput(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, out)
	}
	dom, err := exec.CommandContext(ctx, chromium, append(flags, "--dump-dom", url)...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	if dir := os.Getenv("DLOCK_ARTIFACTS"); dir != "" {
		if b, err := os.ReadFile(shot); err == nil && os.MkdirAll(dir, 0o755) == nil {
			_ = os.WriteFile(filepath.Join(dir, "bench-report.png"), b, 0o644)
		}
	}

	// The rendered page: three charts, titled, each labelling every backend.
	svgs := regexp.MustCompile(`(?s)<svg.*?</svg>`).FindAll(dom, -1)
	if len(svgs) != 3 {
		t.Fatalf("the rendered page has %d charts, want 3", len(svgs))
	}
	titles := []string{"Uncontended acquire latency", "Contended throughput", "Hand-off latency"}
	axes := []string{"time from acquire call to grant", "grants per second", "time from a release to the next holder"}
	for i, svg := range svgs {
		if !bytes.Contains(svg, []byte(titles[i])) {
			t.Errorf("chart %d has no title %q", i+1, titles[i])
		}
		for _, b := range backends {
			if !bytes.Contains(svg, []byte(">"+b+"<")) {
				t.Errorf("chart %d (%s) does not label backend %s", i+1, titles[i], b)
			}
		}
		if !bytes.Contains(svg, []byte(`class="axis"`)) {
			t.Errorf("chart %d (%s) has no value axis", i+1, titles[i])
		}
		if !bytes.Contains(svg, []byte(axes[i])) {
			t.Errorf("chart %d (%s) has no axis caption %q", i+1, titles[i], axes[i])
		}
	}
	unit := map[int]*regexp.Regexp{
		0: regexp.MustCompile(`>[\d.]+ ?(ns|µs|ms|s)<`),
		1: regexp.MustCompile(`>[\d.,]+k?/s<`),
		2: regexp.MustCompile(`>[\d.]+ ?(ns|µs|ms|s)<`),
	}
	for i, re := range unit {
		if len(re.FindAll(svgs[i], -1)) < len(backends) {
			t.Errorf("chart %d (%s): fewer than %d values with units (%s):\n%s", i+1, titles[i], len(backends), re, svgs[i])
		}
	}

	// The screenshot: the bars are drawn, in each series' colour.
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	for name, c := range map[string][3]uint32{"p50 (blue)": {0x4e, 0x79, 0xa7}, "p99 (orange)": {0xf2, 0x8e, 0x2b}, "throughput (green)": {0x59, 0xa1, 0x4f}} {
		if n := countColor(img, c); n < 40 {
			t.Errorf("the screenshot has %d pixels of the %s bars' colour, want a visible bar", n, name)
		}
	}
	if t.Failed() {
		t.Logf("rendered page:\n%s", strings.TrimSpace(string(dom)))
	}
}

// countColor counts the pixels of img with colour c (8-bit RGB).
func countColor(img image.Image, c [3]uint32) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r>>8 == c[0] && g>>8 == c[1] && bl>>8 == c[2] {
				n++
			}
		}
	}
	return n
}

// checkRenderedCheck renders dlock check's HTML report at path in headless
// Chromium and checks what is on the page: a column for each deployment, the
// capability rows, and the results in their colours on the screenshot.
func checkRenderedCheck(t *testing.T, path string, deployments []string) {
	t.Helper()
	chromium := testenv.Binary(t, "chromium", "chromium")
	dir := t.TempDir()
	shot := filepath.Join(dir, "check.png")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=1300,1000"}
	// One run takes the screenshot and prints the DOM: each start of
	// Chromium takes seconds.
	dom, err := exec.CommandContext(ctx, chromium, append(flags, "--screenshot="+shot, "--dump-dom", "file://"+path)...).Output()
	if err != nil {
		t.Fatalf("chromium --screenshot --dump-dom: %v", err)
	}
	if dir := os.Getenv("DLOCK_ARTIFACTS"); dir != "" {
		if b, err := os.ReadFile(shot); err == nil && os.MkdirAll(dir, 0o755) == nil {
			_ = os.WriteFile(filepath.Join(dir, "check-report.png"), b, 0o644)
		}
	}
	for _, d := range deployments {
		if !bytes.Contains(dom, []byte("<th>"+d+"</th>")) {
			t.Errorf("the rendered page has no column for %s", d)
		}
	}
	for _, want := range []string{"<td>fencing</td>", "<td>loss signal</td>", "<td>TokensIncrease</td>", `class="pass"`} {
		if !bytes.Contains(dom, []byte(want)) {
			t.Errorf("the rendered page lacks %s", want)
		}
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if n := countColor(img, passColor); n < 200 {
		t.Errorf("the screenshot has %d pixels of the PASS cells' colour, want visible cells", n)
	}
	if t.Failed() {
		t.Logf("rendered page:\n%s", strings.TrimSpace(string(dom)))
	}
}

// passColor is the background of a PASS cell in dlock check's report (#d4edda).
var passColor = [3]uint32{0xd4, 0xed, 0xda}
