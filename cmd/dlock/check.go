package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/conformance"
)

const checkUsage = `Usage: dlock check [flags]

Runs dlock's conformance suite against a live deployment and prints the
driver's capabilities, its notes on the deployment (such as a Redis server
that can evict or forget locks) and a pass/fail table: is this Redis, etcd,
ZooKeeper or PostgreSQL setup fit for locking?

The suite takes locks on keys of its own ("conformance/..."); on Redis and
Redlock it also uses a key prefix of its own ("<prefix>check-<run id>:"). It
takes about 15 seconds, longer on backends whose leases last at least a few
seconds (etcd). Afterwards dlock deletes what the backend keeps (on Redis: the
fence counters under that prefix) and says what remains elsewhere. Tests that
need administrative access to make the server forget a holder behind its back
run on Redis (a DEL of the check's own lock key) and are reported as skipped
on other backends.

Flags:
  --dsn DSN      the deployment (default $DLOCK_DSN)
  --run REGEXP   run only the tests whose names match REGEXP
  --timeout D    give up on the suite after D (default 10m)
  -v, --verbose  show every line the tests log, as they run

Exit status:
  0   no test failed (skipped tests do not count)
  1   a test failed
  64  usage error
  69  the backend cannot be reached

Examples:
  dlock check --dsn redis://127.0.0.1:6379/0
  dlock check --dsn 'etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks'
  DLOCK_DSN=zk://zk1:2181/dlock dlock check --run 'Tokens|Paused'
`

// checkSuiteCommand is the hidden subcommand that dlock check runs in a
// child process of its own: the conformance suite, under package testing,
// exactly as go test would run it.
const checkSuiteCommand = "__check-suite"

// Environment of the child process.
const (
	envCheckDSN      = "DLOCK_CHECK_DSN"
	envCheckShortTTL = "DLOCK_CHECK_SHORT_TTL"
	envCheckAdmin    = "DLOCK_CHECK_ADMIN" // "redis" if Expire may DEL the lock key
)

// checkPlan says how a check treats one deployment.
type checkPlan struct {
	dsn    string // the DSN the suite opens: the user's, with a prefix of the check's own where the driver has one
	shown  string // the user's DSN, redacted
	prefix string // the check's key prefix, or ""
	admin  bool   // Redis: Expire and the cleanup work through a plain client
	remain string // what the check leaves behind, when dlock cannot delete it
}

func newCheckPlan(dsn, runID string) (checkPlan, error) {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return checkPlan{}, err
	}
	p := checkPlan{shown: backend.Redact(u)}
	switch u.Scheme {
	case "redis", "rediss", "redlock", "redlocks":
		p.prefix = redisPrefix(u) + "check-" + runID + ":"
		q := u.Query()
		q.Set("prefix", p.prefix)
		u.RawQuery = q.Encode()
		p.admin = isRedis(u)
		if !p.admin {
			p.remain = fmt.Sprintf("fence counters under the prefix %q on each node. Delete them with\n"+
				"  redis-cli -h HOST -p PORT --scan --pattern '%s*' | xargs redis-cli -h HOST -p PORT del", p.prefix, globEscape(p.prefix))
		}
	case "postgres", "postgresql":
		p.remain = `one fence counter per key the suite used: rows of the fence table (default dlock_fence) whose key starts with "conformance/".`
	}
	p.dsn = u.String()
	return p, nil
}

func checkMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("check")
	dsnFlag := fs.String("dsn", "", "")
	run := fs.String("run", "", "")
	timeout := fs.Duration("timeout", 10*time.Minute, "")
	var verbose bool
	fs.BoolVar(&verbose, "v", false, "")
	fs.BoolVar(&verbose, "verbose", false, "")
	if code, ok := parseFlags(fs, args, checkUsage, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, "check", "unexpected argument %q", fs.Arg(0))
	}
	dsn, err := resolveDSN(*dsnFlag)
	if err != nil {
		return usageError(stderr, "check", "%v", err)
	}
	if _, err := regexp.Compile(*run); err != nil {
		return usageError(stderr, "check", "--run: %v", err)
	}
	if *timeout <= 0 {
		return usageError(stderr, "check", "--timeout must be a positive duration such as 10m")
	}
	plan, err := newCheckPlan(dsn, randomID())
	if err != nil {
		return usageError(stderr, "check", "%v", err)
	}

	ctx, stop := signalContext()
	defer stop()
	started := time.Now()
	stopCollect := collectLogs()
	caps, shortTTL, err := probe(ctx, plan.dsn)
	notes := stopCollect()
	if err != nil {
		if sig, ok := interrupted(ctx); ok {
			return exitSignal + signalNumber(sig)
		}
		step := "cannot open"
		var se *stepError
		if errors.As(err, &se) {
			step, err = se.step, se.err
		}
		fmt.Fprintf(stderr, "dlock: %s %s: %s\n", step, plan.shown, errText(err))
		return exitFor(err)
	}
	printCapabilities(stdout, plan, caps, shortTTL, notes)

	c := &checkRun{plan: plan, shortTTL: shortTTL, run: *run, timeout: *timeout, verbose: verbose, progress: stderr}
	results, crash := c.suite(ctx)
	cleanup := c.cleanup()
	if crash == nil && *run != "" && !slices.ContainsFunc(results, func(r testResult) bool { return r.Name != "" }) {
		if cleanup != "" {
			fmt.Fprintln(stdout, cleanup)
		}
		return usageError(stderr, "check", "no test matches --run %q", *run)
	}

	failed := printResults(stdout, results, crash)
	fmt.Fprintln(stdout)
	if cleanup != "" {
		fmt.Fprintln(stdout, cleanup)
	}
	passed, skipped := 0, 0
	for _, r := range results {
		switch {
		case r.Name == "":
		case r.Status == "PASS":
			passed++
		case r.Status == "SKIP":
			skipped++
		}
	}
	verdict := "PASS"
	if failed > 0 {
		verdict = "FAIL"
	}
	fmt.Fprintf(stdout, "%s: %d passed, %d skipped, %d failed in %s against %s\n",
		verdict, passed, skipped, failed, formatDuration(time.Since(started)), plan.shown)
	if sig, ok := interrupted(ctx); ok {
		return exitSignal + signalNumber(sig)
	}
	if failed > 0 {
		return exitFailure
	}
	return exitOK
}

// stopSignals are the signals that make dlock check and dlock bench stop.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

// signalContext returns a context cancelled, with a *signalError as its
// cause, when the process gets SIGINT, SIGTERM or SIGHUP.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, stopSignals...)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			cancel(&signalError{s})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}

// randomID returns 8 random hex digits, to tell runs apart.
func randomID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// probe opens dsn, reads the driver's capabilities, and finds the shortest
// TTL the backend honours: the suite's default, unless a lease granted for it
// lasts longer (etcd raises short TTLs to its minimum).
func probe(ctx context.Context, dsn string) (backend.Capabilities, time.Duration, error) {
	l, err := openLocker(ctx, dsn)
	if err != nil {
		return backend.Capabilities{}, 0, &stepError{"cannot open", err}
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, "conformance/ttl-probe/"+randomID(),
		dlock.WithTTL(conformance.DefaultShortTTL), dlock.WithAutoRenew(false))
	if err != nil {
		return backend.Capabilities{}, 0, &stepError{"cannot take a lock on", err}
	}
	left := time.Until(lease.Deadline()) // at most the validity granted
	_ = lease.Release(ctx)
	ttl := conformance.DefaultShortTTL
	if left > ttl {
		ttl = left.Truncate(100*time.Millisecond) + 100*time.Millisecond
	}
	return l.Capabilities(), ttl, nil
}

// stepError says which step of the probe failed.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + errText(e.err) }
func (e *stepError) Unwrap() error { return e.err }

func printCapabilities(w io.Writer, plan checkPlan, c backend.Capabilities, shortTTL time.Duration, notes []string) {
	fencing := map[backend.FencingLevel]string{
		backend.FencingStrict:          "tokens strictly increase per key, whatever the timing",
		backend.FencingTimingDependent: "tokens increase only while clocks and delays stay within bounds",
		backend.FencingNone:            "no usable fencing token",
	}[c.Fencing]
	authority := map[backend.TimeAuthority]string{
		backend.TimeServer: "the server expires locks on its own clock",
		backend.TimeClient: "the client's clock decides validity (bounded drift assumed)",
	}[c.TimeAuthority]

	fmt.Fprintf(w, "dlock check %s\n\n", plan.shown)
	explain := func(b bool, yes, no string) string {
		if b {
			return yes
		}
		return no
	}
	yesNo := func(b bool) string { return explain(b, "yes", "no") }
	writeTable(w, [][]string{
		{"CAPABILITY", "VALUE", "MEANING"},
		{"fencing", c.Fencing.String(), fencing},
		{"fifo", yesNo(c.FIFO), explain(c.FIFO, "waiters are granted the lock in arrival order", "waiters are not served in arrival order")},
		{"fault-tolerant", yesNo(c.FaultTolerant), explain(c.FaultTolerant, "locks survive the loss of a minority of servers", "one server is a single point of failure")},
		{"time-authority", c.TimeAuthority.String(), authority},
		{"push-wait", yesNo(c.PushWait), explain(c.PushWait, "the backend wakes waiters on release", "waiters poll")},
		{"loss-notify", yesNo(c.LossNotify), explain(c.LossNotify, "a lost lock is reported as it happens", "a lost lock is noticed at the next renewal")},
		{"shared", yesNo(c.Shared), explain(c.Shared, "locks can be held shared (package rwlock's readers), in the backend's own layout", "no shared locks: rwlock uses its portable layout")},
		{"native-semaphore", yesNo(c.NativeSemaphore), explain(c.NativeSemaphore, "semaphores in the backend's own layout (package semaphore's permits)", "no semaphore layout of its own: package semaphore uses slot locks")},
	})
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nThe driver's notes on the deployment:")
		for _, n := range notes {
			fmt.Fprintf(w, "  %s\n", strings.TrimPrefix(n, "dlock: "))
		}
	}
	fmt.Fprintf(w, "\nShortest TTL the suite uses: %v", shortTTL)
	if plan.prefix != "" {
		fmt.Fprintf(w, "; keys under the prefix %q", plan.prefix)
	}
	fmt.Fprint(w, "\n\n")
}

// checkRun runs the suite in a child process and cleans up after it.
type checkRun struct {
	plan     checkPlan
	shortTTL time.Duration
	run      string
	timeout  time.Duration
	verbose  bool
	progress io.Writer
}

// suiteCrash describes a suite that ended without reporting its end.
type suiteCrash struct {
	test   string   // the test that was running
	reason string   // why the suite ended
	output []string // the test's output, then the child's standard error
}

// suite runs the conformance suite in a child process (this program, run as
// checkSuiteCommand) and returns the results. A signal that cancels ctx
// stops the child.
func (c *checkRun) suite(ctx context.Context) ([]testResult, *suiteCrash) {
	exe, err := os.Executable()
	if err != nil {
		return nil, &suiteCrash{reason: "cannot find the dlock executable to run the suite: " + err.Error()}
	}
	pattern := "^" + suiteName + "$"
	if c.run != "" {
		pattern += "/(" + c.run + ")"
	}
	cmd := exec.Command(exe, checkSuiteCommand,
		"-test.v=test2json", "-test.count=1", "-test.timeout="+c.timeout.String(), "-test.run="+pattern)
	cmd.Env = append(os.Environ(),
		envCheckDSN+"="+c.plan.dsn,
		envCheckShortTTL+"="+c.shortTTL.String(),
	)
	if c.plan.admin {
		cmd.Env = append(cmd.Env, envCheckAdmin+"=redis")
	}
	var stderr tailBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, &suiteCrash{reason: err.Error()}
	}
	if err := cmd.Start(); err != nil {
		return nil, &suiteCrash{reason: "cannot run the suite: " + err.Error()}
	}
	stopForward := context.AfterFunc(ctx, func() { _ = cmd.Process.Signal(os.Interrupt) })
	defer stopForward()

	p := &outputParser{onResult: func(r testResult) {
		if r.Name != "" {
			fmt.Fprintf(c.progress, "dlock: %-4s  %-32s %6.2fs\n", r.Status, r.Name, r.Elapsed.Seconds())
		}
	}}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if c.verbose {
			fmt.Fprintln(c.progress, displayLine(line))
		}
		p.line(line)
	}
	_ = cmd.Wait()
	if p.finished {
		return p.results, nil
	}
	test, output := p.running()
	crash := &suiteCrash{
		test:   strings.TrimPrefix(strings.TrimPrefix(test, suiteName), "/"),
		reason: "the suite ended without finishing (timed out or crashed); output below",
		output: append(output, stderr.lines()...),
	}
	if sig, ok := interrupted(ctx); ok {
		crash.reason = "interrupted by " + signalName(sig)
	}
	return p.results, crash
}

// cleanup deletes what the suite left on the backend, where dlock can, and
// returns a sentence saying what it did or what remains.
func (c *checkRun) cleanup() string {
	if !c.plan.admin {
		if c.plan.remain != "" {
			return "Left behind: " + c.plan.remain
		}
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := newRedisAdmin(c.plan.dsn)
	if err != nil {
		return fmt.Sprintf("Cleanup failed: %v; keys remain under the prefix %q.", err, c.plan.prefix)
	}
	defer admin.Close()
	n, err := admin.deletePrefix(ctx)
	if err != nil {
		return fmt.Sprintf("Cleanup failed after deleting %d keys: %v; keys remain under the prefix %q.", n, err, c.plan.prefix)
	}
	return fmt.Sprintf("Cleanup: deleted %d keys (fence counters) under the prefix %q.", n, c.plan.prefix)
}

// printResults prints the table of results and the output of each failed
// test, and returns the number of failures.
func printResults(w io.Writer, results []testResult, crash *suiteCrash) int {
	type row struct {
		name, status, elapsed, note string
		output                      []string
	}
	var rows []row
	anyFailed := false
	var suite *testResult
	for i, r := range results {
		if r.Name == "" {
			suite = &results[i]
			continue
		}
		rows = append(rows, row{r.Name, r.Status, fmt.Sprintf("%.2fs", r.Elapsed.Seconds()), r.note(), r.Output})
		anyFailed = anyFailed || r.Status == "FAIL"
	}
	if suite != nil && suite.Status == "FAIL" && !anyFailed {
		// The suite failed outside any test: it could not even start.
		rows = append(rows, row{"(setup)", "FAIL", fmt.Sprintf("%.2fs", suite.Elapsed.Seconds()), suite.note(), suite.Output})
	}
	if crash != nil {
		name := crash.test
		if name == "" {
			name = "(suite)"
		}
		rows = append(rows, row{name, "FAIL", "-", crash.reason, crash.output})
	}

	table := [][]string{{"TEST", "RESULT", "TIME", "NOTE"}}
	failed := 0
	for _, r := range rows {
		if r.status == "FAIL" {
			failed++
		}
		table = append(table, []string{r.name, r.status, r.elapsed, shorten(r.note, 100)})
	}
	writeTable(w, table)
	for _, r := range rows {
		if r.status != "FAIL" {
			continue
		}
		fmt.Fprintf(w, "\n--- %s\n", r.name)
		for _, l := range r.output {
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
	return failed
}

// shorten cuts s to at most n runes.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// tailBuffer keeps the last 64 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - 64*1024; over > 0 {
		b.buf = b.buf[over:]
	}
	return len(p), nil
}

func (b *tailBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := strings.TrimRight(string(b.buf), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// checkHarness is the conformance harness of dlock check: every locker is a
// client of its own on the live deployment.
type checkHarness struct {
	dsn      string
	scheme   string
	shortTTL time.Duration
	admin    *redisAdmin // nil unless Redis
}

var (
	_ conformance.Harness        = (*checkHarness)(nil)
	_ conformance.ShortTTLer     = (*checkHarness)(nil)
	_ conformance.DSNer          = (*checkHarness)(nil)
	_ conformance.LiveDeployment = (*checkHarness)(nil)
)

// DSN is the deployment's DSN: the suite opens a bare driver on it to check
// the Close rule.
func (h *checkHarness) DSN(testing.TB) string { return h.dsn }

// LiveDeployment: the suite does not try wrong passwords on the operator's
// servers.
func (*checkHarness) LiveDeployment() {}

func (h *checkHarness) NewLocker(t testing.TB) dlock.Locker {
	t.Helper()
	l, err := openLocker(context.Background(), h.dsn)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// Expire deletes the check's own lock key on Redis. Elsewhere making the
// server forget a holder takes administrative access (revoking an etcd
// lease, expiring a ZooKeeper session, terminating a PostgreSQL backend),
// which dlock check does not use: the test is skipped.
func (h *checkHarness) Expire(t testing.TB, key string) {
	t.Helper()
	if h.admin == nil {
		t.Skipf("needs admin access to make the %s server forget a holder; not run against a live deployment", h.scheme)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.admin.forget(ctx, key); err != nil {
		t.Fatalf("Expire(%q): %v", key, err)
	}
}

func (h *checkHarness) ShortTTL() time.Duration { return h.shortTTL }
