package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

const benchUsage = `Usage: dlock bench --dsn DSN [--dsn DSN ...] [flags]

Compares backends. For each DSN in turn, dlock measures
  acquire    the latency of an uncontended acquire (one client takes and
             releases a free lock in a loop): p50 and p99
  contended  the grants per second when --clients clients, each with
             connections of its own, contend for one key, each looping
             acquire -> release
  hand-off   under that contention, the time from the start of a release to
             the next holder's grant (p50 and p99), and the share of grants
             that went to another client than the previous one
Each backend gets --duration: half uncontended, half contended. Progress goes
to standard error, the table to standard output. Locks are taken on keys of
the run's own ("dlock-bench/<run id>/..."); on Redis their fence counters are
deleted afterwards.

Numbers depend on the network, the servers' load and this machine: compare
backends measured in one run, on a quiet machine.

Flags:
  --dsn DSN      a backend to measure; repeat to compare (default $DLOCK_DSN)
  --clients N    contending clients (default 8)
  --duration D   time per backend (default 10s)
  --out FILE     also write a chart comparing the backends: FILE.html (a
                 self-contained page with the table and SVG charts) or FILE.svg
  --log-format F text (default) or json: standard error's lines (dlock help logging)

Exit status:
  0   every backend was measured
  1   a measurement failed (the output says which and why)
  64  usage error
  69  a backend cannot be reached

Examples:
  dlock bench --dsn redis://127.0.0.1:6379/0 --dsn etcd://127.0.0.1:2379 --out report.html
  dlock bench --dsn mem://try --clients 4 --duration 4s
`

// benchResult is what dlock bench measured on one backend.
type benchResult struct {
	DSN  string // redacted
	Caps backend.Capabilities

	Acquires               int           // uncontended acquires measured
	AcquireP50, AcquireP99 time.Duration // uncontended acquire latency

	Clients                int
	Grants                 int     // grants under contention
	Throughput             float64 // grants per second under contention
	HandoffP50, HandoffP99 time.Duration
	ChangedHands           float64 // percent of grants that went to another client

	Err         error
	Unreachable bool // Err is from opening the backend
}

// benchSettings are dlock bench's parsed flags.
type benchSettings struct {
	dsns     []string
	clients  int
	duration time.Duration
	out      string
	format   string // "html" or "svg", when out is set
}

func benchMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bench")
	var s benchSettings
	var dsns stringsFlag
	fs.Var(&dsns, "dsn", "")
	fs.IntVar(&s.clients, "clients", 8, "")
	fs.DurationVar(&s.duration, "duration", 10*time.Second, "")
	fs.StringVar(&s.out, "out", "", "")
	if code, ok := parseFlags(fs, args, benchUsage, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, "bench", "unexpected argument %q (give each backend with --dsn)", fs.Arg(0))
	}
	if len(dsns) == 0 {
		dsn, err := resolveDSN("")
		if err != nil {
			return usageError(stderr, "bench", "%v", err)
		}
		dsns = append(dsns, dsn)
	}
	for i, dsn := range dsns {
		if err := checkDSN(dsn); err != nil {
			return usageError(stderr, "bench", "--dsn #%d: %v", i+1, err)
		}
	}
	s.dsns = dsns
	switch {
	case s.clients < 2 || s.clients > 1000:
		return usageError(stderr, "bench", "--clients must be from 2 to 1000, got %d", s.clients)
	case s.duration < 200*time.Millisecond:
		return usageError(stderr, "bench", "--duration must be at least 200ms, got %v", s.duration)
	}
	if s.out != "" {
		var err error
		if s.format, err = reportFormat(s.out); err != nil {
			return usageError(stderr, "bench", "--out: %v", err)
		}
		if fi, err := os.Stat(filepath.Dir(s.out)); err != nil || !fi.IsDir() {
			return usageError(stderr, "bench", "--out: no directory %q to write %s in", filepath.Dir(s.out), filepath.Base(s.out))
		}
	}

	ctx, stop := signalContext()
	defer stop()
	prog := newProgress(stderr)
	results := make([]benchResult, 0, len(s.dsns))
	for i, dsn := range s.dsns {
		label := fmt.Sprintf("[%d/%d] %s", i+1, len(s.dsns), redactDSN(dsn))
		r := benchBackend(ctx, dsn, s.clients, s.duration, prog.with(label))
		results = append(results, r)
		if r.Err != nil {
			logError(stderr, "dlock: ", r.DSN+": "+errText(r.Err))
		}
		if ctx.Err() != nil {
			break
		}
	}

	printBenchTable(stdout, results)
	if s.out != "" {
		if err := writeReport(s.out, s.format, results, s); err != nil {
			logError(stderr, "dlock: ", err.Error())
			return exitFailure
		}
		fmt.Fprintf(stderr, "dlock: wrote %s\n", s.out)
	}
	if sig, ok := interrupted(ctx); ok {
		return exitSignal + signalNumber(sig)
	}
	code := exitOK
	for _, r := range results {
		switch {
		case r.Unreachable:
			return exitUnavailable
		case r.Err != nil:
			code = exitFailure
		}
	}
	return code
}

// reportFormat returns the format of a report file, from its extension.
func reportFormat(path string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".html", ".htm":
		return "html", nil
	case ".svg":
		return "svg", nil
	case ".png":
		return "", errors.New("PNG is not supported: write .svg (convert it with e.g. rsvg-convert report.svg -o report.png) or .html")
	default:
		return "", fmt.Errorf("cannot tell the format of %q: name it .html or .svg", path)
	}
}

// benchBackend measures one backend.
func benchBackend(ctx context.Context, dsn string, clients int, d time.Duration, prog *progress) benchResult {
	r := benchResult{DSN: redactDSN(dsn), Clients: clients}
	lockers := make([]dlock.Locker, 0, clients)
	defer func() {
		for _, l := range lockers {
			_ = l.Close()
		}
	}()
	for range clients {
		l, err := openLocker(ctx, dsn)
		if err != nil {
			r.Err, r.Unreachable = err, ctx.Err() == nil
			return r
		}
		lockers = append(lockers, l)
	}
	r.Caps = lockers[0].Capabilities()

	base := "dlock-bench/" + randomID()
	free, contended := base+"/uncontended", base+"/contended"
	defer cleanupBench(dsn, free, contended)

	if err := measureAcquire(ctx, lockers[0], free, d/2, prog, &r); err != nil {
		r.Err = fmt.Errorf("uncontended acquire: %w", err)
		return r
	}
	if err := measureContended(ctx, lockers, contended, d/2, prog, &r); err != nil {
		r.Err = fmt.Errorf("contended acquire: %w", err)
	}
	return r
}

// benchTTL is the TTL of the benchmark's leases: long, so that renewals never
// run during a measurement.
const benchTTL = time.Minute

// measureAcquire loops TryAcquire → Release on a free key for d and records
// the latency of each TryAcquire.
func measureAcquire(ctx context.Context, l dlock.Locker, key string, d time.Duration, prog *progress, r *benchResult) error {
	var s sampler
	var n atomic.Int64
	defer prog.phase("acquire", d, &n, "acquires")()
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		start := time.Now()
		lease, err := l.TryAcquire(ctx, key, dlock.WithTTL(benchTTL))
		took := time.Since(start)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		if err := lease.Release(context.Background()); err != nil {
			return err
		}
		s.add(took)
		n.Add(1)
	}
	r.Acquires = s.n
	r.AcquireP50, r.AcquireP99 = s.percentile(50), s.percentile(99)
	return nil
}

// measureContended has every locker loop Acquire → Release on one key for d,
// as conformance.MeasureHandoff does, and records the throughput and the
// hand-off latency. It fails if two lockers ever hold the lock at once.
func measureContended(ctx context.Context, lockers []dlock.Locker, key string, d time.Duration, prog *progress, r *benchResult) error {
	var n atomic.Int64
	defer prog.phase("contended", d, &n, "grants")()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var (
		mu          sync.Mutex
		firstErr    error
		lastHolder  = -1
		lastRelease time.Time
		handoffs    sampler
		changed     int
		inside      atomic.Int32
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i, l := range lockers {
		wg.Go(func() {
			for ctx.Err() == nil {
				lease, err := l.Acquire(ctx, key, dlock.WithTTL(benchTTL))
				if err != nil {
					if ctx.Err() == nil {
						fail(err)
					}
					return
				}
				got := time.Now()
				if inside.Add(1) != 1 {
					fail(errors.New("two clients held the lock at once"))
				}
				mu.Lock()
				if lastHolder >= 0 {
					handoffs.add(got.Sub(lastRelease))
					if lastHolder != i {
						changed++
					}
				}
				lastHolder = i
				lastRelease = time.Now()
				mu.Unlock()
				n.Add(1)
				inside.Add(-1)
				if err := lease.Release(context.Background()); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := min(time.Since(start), d)
	r.Grants = int(n.Load())
	r.Throughput = float64(r.Grants) / elapsed.Seconds()
	r.HandoffP50, r.HandoffP99 = handoffs.percentile(50), handoffs.percentile(99)
	if handoffs.n > 0 {
		r.ChangedHands = 100 * float64(changed) / float64(handoffs.n)
	}
	return firstErr
}

// cleanupBench deletes the fence counters the benchmark's keys left on a
// Redis server. Other backends keep nothing (etcd, ZooKeeper), or keep one
// small counter per key (PostgreSQL, Redlock), which stays.
func cleanupBench(dsn string, keys ...string) {
	u, err := backend.ParseDSN(dsn)
	if err != nil || !isRedis(u) {
		return
	}
	admin, err := newRedisAdmin(dsn)
	if err != nil {
		return
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = admin.deleteFences(ctx, keys...)
}

// sampler keeps a uniform random sample of at most maxSamples durations
// (reservoir sampling), so that a fast backend cannot fill the memory.
type sampler struct {
	n   int
	buf []time.Duration
}

const maxSamples = 100_000

func (s *sampler) add(d time.Duration) {
	s.n++
	if len(s.buf) < maxSamples {
		s.buf = append(s.buf, d)
		return
	}
	if j := rand.IntN(s.n); j < maxSamples {
		s.buf[j] = d
	}
}

// percentile returns the p-th percentile (nearest rank) of the sample, or 0
// if it is empty.
func (s *sampler) percentile(p int) time.Duration {
	if len(s.buf) == 0 {
		return 0
	}
	sorted := slices.Clone(s.buf)
	slices.Sort(sorted)
	i := (len(sorted)*p + 99) / 100 // ceil(len·p/100)
	return sorted[max(i-1, 0)]
}

func printBenchTable(w io.Writer, results []benchResult) {
	table := [][]string{{"BACKEND", "FENCING", "ACQUIRE p50", "p99", "CONTENDED", "HAND-OFF p50", "p99", "CHANGED HANDS"}}
	for _, r := range results {
		row := []string{r.DSN, "-", "-", "-", "-", "-", "-", "-"}
		if !r.Unreachable {
			row[1] = r.Caps.Fencing.String()
		}
		if r.Acquires > 0 {
			row[2], row[3] = formatDuration(r.AcquireP50), formatDuration(r.AcquireP99)
		}
		if r.Grants > 0 {
			row[4] = formatRate(r.Throughput) + " grants/s"
			row[5], row[6] = formatDuration(r.HandoffP50), formatDuration(r.HandoffP99)
			row[7] = fmt.Sprintf("%.0f%%", r.ChangedHands)
		}
		table = append(table, row)
	}
	writeTable(w, table)
	if len(results) > 0 {
		fmt.Fprintf(w, "(%d clients contending)\n", results[0].Clients)
	}
	for _, r := range results {
		if r.Err != nil {
			fmt.Fprintf(w, "%s: %s\n", r.DSN, errText(r.Err))
		}
	}
}

// formatDuration prints d with three significant digits: 950ns, 12.3µs,
// 1.23ms, 2.5s.
func formatDuration(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	units := []struct {
		unit time.Duration
		name string
	}{{time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "µs"}}
	for _, u := range units {
		if d >= u.unit {
			v := float64(d) / float64(u.unit)
			return strconv.FormatFloat(v, 'f', max(0, 2-digitsBeforePoint(v)), 64) + u.name
		}
	}
	return strconv.FormatInt(int64(d), 10) + "ns"
}

func digitsBeforePoint(v float64) int {
	switch {
	case v >= 100:
		return 3
	case v >= 10:
		return 2
	}
	return 1
}

// formatRate prints a rate per second: 3.21, 45.6, 789, 12,345.
func formatRate(v float64) string {
	if v < 1000 {
		return strconv.FormatFloat(v, 'f', max(0, 2-digitsBeforePoint(v)), 64)
	}
	return formatCount(int(v + 0.5))
}

// formatCount prints n with thousands separators.
func formatCount(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// progress reports on standard error what dlock bench is measuring: a line
// that updates in place on a terminal, a line per measurement otherwise.
type progress struct {
	w     io.Writer
	tty   bool
	label string
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// with returns a progress reporter for one backend.
func (p *progress) with(label string) *progress {
	q := *p
	q.label = label
	return &q
}

// phase reports a measurement of length d whose count of operations is n,
// and returns the function that reports its end.
func (p *progress) phase(name string, d time.Duration, n *atomic.Int64, unit string) (end func()) {
	start := time.Now()
	line := func() string {
		el := min(time.Since(start), d)
		return fmt.Sprintf("dlock: %s  %-9s %4.1fs/%v  %s %s", p.label, name, el.Seconds(), d, formatCount(int(n.Load())), unit)
	}
	if !p.tty {
		fmt.Fprintf(p.w, "dlock: %s  %-9s measuring for %v\n", p.label, name, d)
		return func() { fmt.Fprintln(p.w, line()) }
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			fmt.Fprintf(p.w, "\r\033[K%s", line())
			select {
			case <-t.C:
			case <-stop:
				return
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		fmt.Fprintf(p.w, "\r\033[K%s\n", line())
	}
}
