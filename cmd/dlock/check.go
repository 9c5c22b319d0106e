package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
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
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/postgres"
)

const checkUsage = `Usage: dlock check --dsn DSN [--dsn DSN ...] [flags]

Runs dlock's conformance suite against live deployments: is this Redis,
etcd, ZooKeeper or PostgreSQL setup fit for locking, and how do these
deployments compare? For one deployment it prints the driver's capabilities,
its notes on the deployment (such as a Redis server that can evict or forget
locks) and a pass/fail table. For several (repeat --dsn) it checks them at
once (one after another where they share servers) and prints one table with
a column per deployment: the capabilities, the latency and each test's
result (PASS, FAIL or SKIP, with the reason under the table).

After the suite, dlock measures each deployment's latency for 1.5 seconds:
an uncontended acquire (one client takes and releases a free lock) and the
hand-off from a release to the next holder's grant (two clients contend).

How long it takes, measured (the whole suite and the latency, servers on
loopback, a busy machine with 2 cores): 30 s on Redis, 56 s on etcd (whose
leases last at least 2 s), 82 s on PostgreSQL, and 99 s for the three at
once. A quiet machine takes less; --run picks tests and shortens it.

Tests that make the server forget a holder behind its back (TokensIncrease,
ExpireEndsLease, PausedHolderFenced and others) run with the credentials
given: on Redis dlock deletes the check's own lock key; elsewhere it breaks
the lock as dlock break does, which needs the right to end the holder's
session on PostgreSQL (the same role, pg_signal_backend or a superuser), to
delete the lock's keys on etcd (root, auth disabled, or a read-write role on
the prefix) and the lock's nodes on ZooKeeper (the DSN's digest credentials).
Without it the test is skipped and says which privilege it needs.

What the check uses and removes: locks on keys of its own ("conformance/..."
and "dlock-bench/..."), under a prefix of the run's own where the driver has
one: "<prefix>check-<run id>:" on Redis and Redlock, "<path>/check-<run id>"
on etcd. On PostgreSQL its fence counters go to a table of the run's own,
"<table>_check_<run id>" (default table dlock_fence), so that nothing lands in
yours; if the role cannot create it, the check uses your table instead. When
the run ends, or times out, dlock deletes what it made: Redis keys under the
prefix, locks left under the etcd prefix, the PostgreSQL table (with the
sequence mode's tables and sequences). What it cannot delete (Redlock's fence
counters on each node, the rows of keys "conformance/..." in a MySQL or SQL
table) it lists, with how to remove it. etcd and ZooKeeper keep nothing once
the locks are released (ZooKeeper reaps the empty lock nodes, containers, on
its own); after a timeout, the stopped suite's etcd leases and ZooKeeper
sessions end once their TTL has passed.

Flags:
  --dsn DSN      a deployment to check; repeat to compare (default $DLOCK_DSN)
  --run REGEXP   run only the tests whose names match REGEXP
  --timeout D    give up on a deployment's suite after D (default 10m): dlock
                 prints "DSN: timed out after D in TEST", stops the suite and
                 cleans up
  --out FILE     also write the report to FILE: FILE.html (a page with the
                 table) or FILE.json (as -o json); may be repeated
  -o FORMAT      what to print on standard output: table (default) or json
  -v, --verbose  show every line the tests log, as they run
  --log-format F text (default) or json: standard error's lines (dlock help logging)

JSON (-o json, --out FILE.json) is one object:
  {"dlock": VERSION, "started": RFC3339, "seconds": N, "deployments": [
    {"dsn": DSN (password redacted),
     "result": "pass" | "fail" | "timed-out" | "interrupted" | "unreachable"
       | "not run" (interrupted before its turn),
     "error": why it was unreachable or crashed, if it was,
     "timed_out_in": the test running when --timeout ran out, if it did,
     "seconds": N,
     "capabilities": {"token": "...", "fencing": "strict" | "timing-dependent"
       | "none", "fifo": B, "fault_tolerant": B, "loss_signal": "immediate" |
       "at renewal", "time_authority": "server" | "client", "push_wait": B,
       "shared": B, "native_semaphore": B},
     "latency": {"acquire_p50_ms": N, "acquire_p99_ms": N, "handoff_p50_ms": N,
       "handoff_p99_ms": N, "error": "..."},
     "tests": [{"name": "MutualExclusion", "status": "pass" | "fail" | "skip"
       | "not run", "reason": "...", "seconds": N}],
     "cleanup": "what dlock deleted", "left_behind": ["what remains, and how
       to remove it"]}]}

Exit status:
  0   no test failed (skipped tests do not count)
  1   a test failed, or a suite timed out or crashed
  64  usage error
  69  a deployment cannot be reached

Examples:
  dlock check --dsn redis://127.0.0.1:6379/0
  dlock check --dsn redis://r1:6379/0 --dsn etcd://e1:2379/locks --dsn postgres://app@pg1/app --out report.html
  dlock check --dsn 'etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks' -o json
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
	dsn    string // the DSN the suite opens: the user's, with a prefix or table of the check's own where the driver has one
	user   string // the user's DSN
	shown  string // the user's DSN, redacted
	scheme string
	prefix string // the check's Redis key prefix or etcd path, or ""
	admin  bool   // Redis: Expire and the cleanup work through a plain client
	table  string // PostgreSQL: the check's own fence table, dropped afterwards; "" if none
	remain string // what the check leaves behind, when dlock cannot delete it
}

// pgUserTableRemain is what a check that had to use the user's PostgreSQL
// fence table leaves behind.
const pgUserTableRemain = `one fence counter per key the suite used: rows of your fence table (default dlock_fence) whose key starts with "conformance/" or "dlock-bench/". ` +
	`Delete them, once no check runs, with DELETE FROM dlock_fence WHERE key LIKE 'conformance/%' OR key LIKE 'dlock-bench/%'`

func newCheckPlan(dsn, runID string) (checkPlan, error) {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return checkPlan{}, err
	}
	p := checkPlan{user: dsn, shown: backend.Redact(u), scheme: u.Scheme}
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
	case "etcd", "etcds":
		path := strings.TrimRight(u.Path, "/")
		if path == "" {
			path = etcd.DefaultPrefix
		}
		p.prefix = path + "/check-" + runID
		u.Path, u.RawPath = p.prefix, ""
	case "postgres", "postgresql":
		table := u.Query().Get("table")
		if table == "" {
			table = postgres.DefaultTable
		}
		p.table = table + "_check_" + runID
		q := u.Query()
		q.Set("table", p.table)
		u.RawQuery = q.Encode()
	case "mysql":
		p.remain = "one fence counter per key the suite used: rows of the fence table (default dlock_mysql_fence) whose `key` starts with \"conformance/\" or \"dlock-bench/\". " +
			"Delete them, once no check runs, with DELETE FROM dlock_mysql_fence WHERE `key` LIKE 'conformance/%' OR `key` LIKE 'dlock-bench/%'"
	case "pgtable", "mysqltable":
		p.remain = "one row per key the suite used in the lock table (default dlock_table_locks), whose key starts with \"conformance/\" or \"dlock-bench/\". " +
			"Delete them, once no check runs, with DELETE FROM dlock_table_locks WHERE key LIKE 'conformance/%' OR key LIKE 'dlock-bench/%' (MySQL: `key`)"
	}
	p.dsn = u.String()
	return p, nil
}

// checkSettings are what dlock check's flags say about running the suites.
type checkSettings struct {
	run      string
	timeout  time.Duration
	verbose  bool
	progress io.Writer // where progress goes: standard error
	multi    bool      // several deployments: label the progress lines
}

func checkMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("check")
	var dsns, outs stringsFlag
	fs.Var(&dsns, "dsn", "")
	fs.Var(&outs, "out", "")
	run := fs.String("run", "", "")
	timeout := fs.Duration("timeout", 10*time.Minute, "")
	var format string
	fs.StringVar(&format, "o", "table", "")
	fs.StringVar(&format, "output", "table", "")
	var verbose bool
	fs.BoolVar(&verbose, "v", false, "")
	fs.BoolVar(&verbose, "verbose", false, "")
	if code, ok := parseFlags(fs, args, checkUsage, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, "check", "unexpected argument %q (give each deployment with --dsn)", fs.Arg(0))
	}
	if len(dsns) == 0 {
		dsn, err := resolveDSN("")
		if err != nil {
			return usageError(stderr, "check", "%v", err)
		}
		dsns = append(dsns, dsn)
	}
	for i, dsn := range dsns {
		if err := checkDSN(dsn); err != nil {
			if len(dsns) == 1 {
				return usageError(stderr, "check", "%v", err)
			}
			return usageError(stderr, "check", "--dsn #%d: %v", i+1, err)
		}
	}
	if _, err := regexp.Compile(*run); err != nil {
		return usageError(stderr, "check", "--run: %v", err)
	}
	if *timeout <= 0 {
		return usageError(stderr, "check", "--timeout must be a positive duration such as 10m")
	}
	if format != "table" && format != "json" {
		return usageError(stderr, "check", "-o %q: want table or json", format)
	}
	for _, out := range outs {
		if _, err := checkReportFormat(out); err != nil {
			return usageError(stderr, "check", "--out: %v", err)
		}
		if fi, err := os.Stat(filepath.Dir(out)); err != nil || !fi.IsDir() {
			return usageError(stderr, "check", "--out: no directory %q to write %s in", filepath.Dir(out), filepath.Base(out))
		}
	}
	runID := randomID()
	plans := make([]checkPlan, len(dsns))
	for i, dsn := range dsns {
		p, err := newCheckPlan(dsn, runID)
		if err != nil {
			return usageError(stderr, "check", "%v", err)
		}
		plans[i] = p
	}
	s := checkSettings{run: *run, timeout: *timeout, verbose: verbose, progress: stderr, multi: len(plans) > 1}

	ctx, stop := signalContext()
	defer stop()
	started := time.Now()
	deps := checkAll(ctx, plans, s)
	rep := newCheckReport(started, deps)

	for _, out := range outs {
		if err := writeCheckReport(out, rep, deps); err != nil {
			logError(stderr, "dlock check: ", err.Error())
			return exitFailure
		}
		fmt.Fprintf(stderr, "dlock: wrote %s\n", out)
	}
	noMatch := *run != ""
	for _, d := range deps {
		if d.openErr != nil || d.crash != nil || slices.ContainsFunc(d.results, func(r testResult) bool { return r.Name != "" }) {
			noMatch = false
		}
	}
	switch {
	case noMatch:
		if format != "json" {
			for _, d := range deps {
				if d.cleanup != "" {
					fmt.Fprintln(stdout, d.cleanup)
				}
			}
		}
		return usageError(stderr, "check", "no test matches --run %q", *run)
	case format == "json":
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
	case len(deps) == 1:
		printOne(stdout, stderr, deps[0], time.Since(started))
	default:
		for _, d := range deps {
			if d.openErr != nil {
				logError(stderr, "dlock: ", fmt.Sprintf("%s %s: %s", d.openStep, d.plan.shown, errText(d.openErr)))
			}
		}
		printComparison(stdout, rep, deps, time.Since(started))
	}
	if sig, ok := interrupted(ctx); ok {
		return exitSignal + signalNumber(sig)
	}
	code := exitOK
	for _, d := range deps {
		switch {
		case d.openErr != nil && len(deps) == 1:
			return exitFor(d.openErr)
		case d.openErr != nil:
			return exitUnavailable
		case d.failed() > 0:
			code = exitFailure
		}
	}
	return code
}

// printOne prints the report of a check of one deployment: its
// capabilities, the table of results, what the cleanup did and a summary.
func printOne(stdout, stderr io.Writer, d *deployment, took time.Duration) {
	if d.openErr != nil {
		logError(stderr, "dlock: ", fmt.Sprintf("%s %s: %s", d.openStep, d.plan.shown, errText(d.openErr)))
		return
	}
	printCapabilities(stdout, d.plan, d.caps, d.shortTTL, d.notes)
	failed := printResults(stdout, d.results, d.crash)
	fmt.Fprintln(stdout)
	if l := d.latency.line(); l != "" {
		fmt.Fprintln(stdout, l)
	}
	if d.cleanup != "" {
		fmt.Fprintln(stdout, d.cleanup)
	}
	for _, l := range d.left {
		fmt.Fprintln(stdout, "Left behind: "+l)
	}
	passed, skipped := 0, 0
	for _, r := range d.results {
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
		verdict, passed, skipped, failed, formatDuration(took), d.plan.shown)
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
	label    string // added to each progress line when several deployments are checked
}

// suiteCrash describes a suite that ended without reporting its end.
type suiteCrash struct {
	test     string   // the test that was running
	reason   string   // why the suite ended
	output   []string // the test's output, then the child's standard error
	timedOut bool     // --timeout ran out: reason says so, output is empty
}

// where names the test that was running, or the suite's setup.
func (c *suiteCrash) where() string {
	if c.test == "" {
		return "the suite's setup"
	}
	return c.test
}

// errCheckTimeout is the cause of a suite's context when --timeout ran out.
var errCheckTimeout = errors.New("dlock check: --timeout ran out")

// suite runs the conformance suite in a child process (this program, run as
// checkSuiteCommand) and returns the results. A signal that cancels ctx
// stops the child; so does the end of c.timeout, after which the child is
// killed, without the goroutine dump of go test's own timeout.
func (c *checkRun) suite(ctx context.Context) ([]testResult, *suiteCrash) {
	exe, err := os.Executable()
	if err != nil {
		return nil, &suiteCrash{reason: "cannot find the dlock executable to run the suite: " + err.Error()}
	}
	pattern := "^" + suiteName + "$"
	if c.run != "" {
		pattern += "/(" + c.run + ")"
	}
	// The child's own timeout is a backstop, should this process be stopped.
	cmd := exec.Command(exe, checkSuiteCommand,
		"-test.v=test2json", "-test.count=1", "-test.timeout="+(c.timeout+time.Minute).String(), "-test.run="+pattern)
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
	tctx, cancel := context.WithTimeoutCause(ctx, c.timeout, errCheckTimeout)
	defer cancel()
	stopForward := context.AfterFunc(tctx, func() {
		if context.Cause(tctx) == errCheckTimeout {
			_ = cmd.Process.Kill()
			return
		}
		_ = cmd.Process.Signal(os.Interrupt)
	})
	defer stopForward()

	suffix := ""
	if c.label != "" {
		suffix = "  " + c.label
	}
	p := &outputParser{onResult: func(r testResult) {
		if r.Name != "" {
			fmt.Fprintf(c.progress, "dlock: %-4s  %-32s %6.2fs%s\n", r.Status, r.Name, r.Elapsed.Seconds(), suffix)
		}
	}}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if c.verbose {
			fmt.Fprintln(c.progress, displayLine(line)+suffix)
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
		reason: "the suite ended without finishing (crashed); output below",
		output: append(output, stderr.lines()...),
	}
	switch sig, ok := interrupted(ctx); {
	case ok:
		crash.reason = "interrupted by " + signalName(sig)
	case context.Cause(tctx) == errCheckTimeout:
		crash.reason, crash.output, crash.timedOut = fmt.Sprintf("timed out after %v", c.timeout), nil, true
	}
	return p.results, crash
}

// cleanup deletes what the suite left on the backend, where dlock can, and
// returns a sentence saying what it did, and what remains with how to
// remove it. crashed says the suite did not finish: its holders did not
// release their locks.
func (c *checkRun) cleanup(crashed bool) (done string, left []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c.plan.remain != "" {
		left = append(left, c.plan.remain)
	}
	switch {
	case c.plan.admin:
		admin, err := newRedisAdmin(c.plan.dsn)
		if err != nil {
			return "", append(left, fmt.Sprintf("keys under the prefix %q (cleanup failed: %v). Delete them with\n"+
				"  redis-cli -h HOST -p PORT --scan --pattern '%s*' | xargs redis-cli -h HOST -p PORT del", c.plan.prefix, err, globEscape(c.plan.prefix)))
		}
		defer admin.Close()
		n, err := admin.deletePrefix(ctx)
		if err != nil {
			return "", append(left, fmt.Sprintf("keys under the prefix %q (cleanup failed after deleting %d: %v). Delete them with\n"+
				"  redis-cli -h HOST -p PORT --scan --pattern '%s*' | xargs redis-cli -h HOST -p PORT del", c.plan.prefix, n, err, globEscape(c.plan.prefix)))
		}
		return fmt.Sprintf("Cleanup: deleted %d keys (fence counters) under the prefix %q.", n, c.plan.prefix), left
	case c.plan.table != "":
		if err := dropCheckTables(ctx, c.plan.user, c.plan.table); err != nil {
			return "", append(left, fmt.Sprintf("the check's fence table %s (cleanup failed: %s). Drop it with DROP TABLE IF EXISTS %s, %s_epoch, %s_live; DROP SEQUENCE IF EXISTS %s_seq, %s_mark",
				c.plan.table, errText(err), c.plan.table, c.plan.table, c.plan.table, c.plan.table, c.plan.table))
		}
		return fmt.Sprintf("Cleanup: dropped the check's fence table %s.", c.plan.table), left
	case c.plan.scheme == "etcd" || c.plan.scheme == "etcds":
		n, err := breakLeftovers(ctx, c.plan.dsn)
		if err != nil {
			return "", append(left, fmt.Sprintf("locks under the etcd prefix %s/ (cleanup failed: %s). Delete them with etcdctl del --prefix %s/", c.plan.prefix, errText(err), c.plan.prefix))
		}
		if crashed {
			left = append(left, "the leases of the stopped suite's holders, which etcd revokes once their TTL has passed.")
		}
		if n == 0 {
			return "", left
		}
		return fmt.Sprintf("Cleanup: released %d locks the stopped suite held under %s/.", n, c.plan.prefix), left
	}
	return "", left
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
		if crash.timedOut {
			rows[len(rows)-1].output = []string{crash.reason + "; the suite was stopped."}
		}
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

// Expire makes the server forget key's holder: on Redis it deletes the
// check's own lock key; elsewhere it breaks the lock with dlock.Break (ending
// the holder's session, deleting its keys or nodes). The test is skipped,
// with the privilege it needs, if the credentials lack it, and on a backend
// that cannot break locks.
func (h *checkHarness) Expire(t testing.TB, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if h.admin != nil {
		if err := h.admin.forget(ctx, key); err != nil {
			t.Fatalf("Expire(%q): %v", key, err)
		}
		return
	}
	err := forgetByBreak(ctx, h.NewLocker(t), key)
	switch {
	case err == nil:
	case errors.Is(err, errors.ErrUnsupported):
		t.Skipf("needs the %s server to forget a holder behind its back, and its driver cannot break locks (dlock.Break)", h.scheme)
	case isPrivilegeError(err):
		t.Skipf("needs %s, to make the server forget a holder: %s", privilegeFor(h.scheme), errText(err))
	default:
		t.Fatalf("Expire(%q) by dlock.Break: %v", key, err)
	}
}

func (h *checkHarness) ShortTTL() time.Duration { return h.shortTTL }
