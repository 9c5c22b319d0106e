package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule"
	"github.com/dlock-go/dlock/semaphore"
)

const runUsage = `Usage: dlock run [flags] KEY -- COMMAND [ARG...]
       dlock run [flags] -c SHELL-COMMAND KEY
       dlock run --once-per PERIOD [--at-least D] [--at-most D] KEY -- COMMAND [ARG...]

Runs COMMAND while holding the lock KEY: like flock(1) or 'etcdctl lock', but
distributed and fenced. dlock waits for the lock, starts COMMAND with the
lease's fencing token in $DLOCK_TOKEN and the key in $DLOCK_KEY, renews the
lease while COMMAND runs, and releases it when COMMAND exits (even if COMMAND
left processes running in the background).

Pass $DLOCK_TOKEN with every write to the resource the lock protects, and have
the resource reject tokens lower than the highest it has seen: a lock can be
lost without its holder knowing (a pause, a partition), and the token is what
keeps such a holder out.

If the lease is lost while COMMAND runs, dlock sends SIGTERM to COMMAND's
process group, SIGKILL to what is left of it after --grace, and exits 76.

With --once-per PERIOD, a crontab line on every host runs COMMAND once per
period across the hosts (package schedule):
  */5 * * * * dlock run --dsn redis://redis:6379/0 --once-per 5m report -- ./report.sh
The run is named by the start of the current period: the time, by this
host's clock, truncated to a multiple of PERIOD (counted in UTC from
midnight for a PERIOD that divides a day), in $DLOCK_RUN (RFC 3339, UTC). The
first invocation of that run to claim the job KEY runs COMMAND; it records
the run on the backend, with its token, before COMMAND starts, and every
later or concurrent invocation of the same run finds the record and exits
79 without running COMMAND, whatever its clock says: the record lives on the
backend's clock, for a day (two periods if longer). Clock skew between hosts
does not change the run's name, since cron fires on each host by that host's
clock; an invocation that starts a full PERIOD late names the next run. A
run whose host dies, or whose COMMAND fails, is not repeated in its period.
Give PERIOD as the crontab line's interval, and fire at its boundaries. The
record needs a backend whose locks outlive the client: redis://, etcd://,
pgtable://, mysqltable:// (and mem:// in one process); postgres://,
mysql://, zk://, nats:// and redlock:// are refused (exit 64).

COMMAND runs in a process group of its own; dlock forwards SIGINT, SIGTERM,
SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to that group. In the foreground of a
terminal, COMMAND gets the terminal (Ctrl-C reaches it directly). On Linux,
COMMAND gets SIGKILL if dlock itself dies.

Flags (they may also come between KEY and COMMAND):
  --dsn DSN      the backend (default $DLOCK_DSN), e.g. redis://127.0.0.1:6379/0
  -c SHELL-COMMAND
                 run SHELL-COMMAND with /bin/sh -c, as flock -c does, instead
                 of a COMMAND after KEY (give one or the other)
  --ttl D        how long the backend keeps the lock if dlock dies without
                 releasing it (default: the DSN's ttl parameter, else 15s);
                 dlock renews the lease every TTL/3 while COMMAND runs
  --wait D       give up after waiting D for the lock (default: wait as long
                 as it takes)
  --no-wait      give up at once if the lock is held
  --busy-exit N  the exit status when the lock is held with --no-wait, or
                 still held when --wait runs out, as flock -E (0..255;
                 default 75)
  --shared       run while holding a read hold (package rwlock): readers hold
                 KEY together, and exclude and are excluded by 'dlock run KEY'
                 and 'dlock lock KEY' without --shared. Only on backends with
                 shared locks of their own: redis:// (without fair=true),
                 etcd://, zk://, postgres://; refused elsewhere (exit 64)
  --permits N    run while holding one of N permits of the semaphore KEY
                 instead of the lock KEY, as 'consul lock -n N' does: at most N
                 commands run at once (package semaphore). $DLOCK_KEY is then
                 the permit's slot (KEY/permits/I), whose token $DLOCK_TOKEN
                 is; every caller must use the same N, or the later one is
                 refused (exit 64)
  --once-per PERIOD
                 run COMMAND once per PERIOD across every host that runs this
                 line (see above); $DLOCK_KEY is then the job's lease key,
                 schedule/job/KEY. Excludes --shared, --permits, --no-wait and
                 --ttl; --wait D bounds the wait for another run holding the
                 job (default: --at-most)
  --at-most D    with --once-per: the run's lease lasts D and is not renewed,
                 so a COMMAND still running after D is stopped as on a lost
                 lease (exit 76), and a dead host frees the job within D
                 (default: PERIOD)
  --at-least D   with --once-per: no other run of the job starts within D of
                 this one's start, however soon it ends (at most --at-most)
  --grace D      after the lease is lost, the time from SIGTERM to SIGKILL
                 (default 10s; 0 sends SIGKILL at once)
  -v, --verbose  report the token, acquire and release, and the driver's
                 notes, on standard error
  --log-format F text (default) or json: every line on standard error, the
                 lease's events included (dlock help logging)
                 on standard error (a failed renewal, a lost lease with its
                 cause; with -v also each grant, renewal and release); json
                 writes one slog JSON object per line
` + allowMemUsage + `

OpenTelemetry: set the standard OTEL_ variables (OTEL_TRACES_EXPORTER,
OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, ...) and dlock run exports
the lease's metrics and spans (package dlockotel) through them; with none
set, it exports nothing.

Exit status:
  COMMAND's own status, or 128+N if COMMAND was killed by signal N
  64    usage error: a bad flag, DSN, key or TTL; --shared on a backend
        without shared locks
  69    backend unavailable: could not connect, or could not take the lock for
        a reason other than its being held
  75    lock held by another owner: with --no-wait, or --wait ran out
        (see --busy-exit); with --once-per, the job was still held by
        another run when the wait ran out, so this period's run may not have
        been made
  76    the lease was lost while COMMAND ran (with --once-per: or it ran past
        --at-most): COMMAND was stopped, and may not have run alone
  79    --once-per: this period's run was already made, or is being made, by
        another invocation; COMMAND did not run here (silent unless -v)
  126   COMMAND could not be started
  127   COMMAND was not found
  128+N dlock got signal N while waiting for the lock

Examples:
  export DLOCK_DSN=redis://127.0.0.1:6379/0
  dlock run nightly-report -- ./report.sh --full
  dlock run --no-wait backup -c 'pg_dump app > /backup/app.sql'
  dlock run --no-wait --busy-exit 0 cron-sync -- ./sync    # busy: skip, exit 0
  dlock run --shared config -- ./read-config
  dlock run --wait 5m --ttl 1m migrate -- ./migrate up
  dlock run --permits 4 gpu -- ./train.sh
  dlock run --once-per 1h --at-most 50m --at-least 1m sync -- ./sync.sh   # hourly cron line
  dlock run --dsn etcd://10.0.0.1:2379/locks deploy -- sh -c 'deploy --fence "$DLOCK_TOKEN"'
`

// defaultGrace is the default of --grace.
const defaultGrace = 10 * time.Second

// releaseTimeout bounds the release after COMMAND exits.
const releaseTimeout = 10 * time.Second

// shellPath is the shell that runs the command of dlock run -c.
const shellPath = "/bin/sh"

// runOptions are the parsed arguments of dlock run, of dlock elect (dlock run
// with the candidate's value as the lock's label) and of dlock lock (dlock run
// without a command).
type runOptions struct {
	cmd      string // "run", "elect" or "lock"
	dsn      string
	key      string
	value    string                // elect: the value the leader publishes
	command  []string              // nil for lock; run -c: shellPath, "-c", the string
	lockOpt  []dlock.AcquireOption // --ttl
	wait     time.Duration         // 0: as long as it takes
	noWait   bool
	busyExit int       // the exit status for a busy lock (--busy-exit)
	shared   bool      // run, lock: a read hold of the rwlock KEY
	permits  int       // run: > 0 holds a permit of a semaphore of this many instead of the lock
	env      bool      // lock: print DLOCK_ lines for eval
	stdout   io.Writer // lock: where the token goes
	grace    time.Duration
	verbose  bool
	logJSON  bool // --log-format json

	oncePer time.Duration   // run: > 0 runs COMMAND once per period across hosts (package schedule)
	atLeast time.Duration   // run --once-per: Job.AtLeast
	atMost  time.Duration   // run --once-per: Job.AtMost; 0: the period
	runAt   time.Time       // run --once-per: the scheduled time of the run claimed
	claim   *schedule.Claim // run --once-per: the run this invocation makes
}

// what names what dlock holds, for messages: the lock KEY, or the
// leadership of the election NAME.
func (o *runOptions) what() string {
	if o.cmd == "elect" {
		return fmt.Sprintf("the leadership of election %q", o.key)
	}
	if o.oncePer > 0 {
		return fmt.Sprintf("the run %s of job %q", runAtText(o.runAt), o.key)
	}
	if o.permits > 0 {
		return fmt.Sprintf("a permit of the semaphore %q (%d permits)", o.key, o.permits)
	}
	if o.shared {
		return fmt.Sprintf("a read hold of the lock %q", o.key)
	}
	return fmt.Sprintf("the lock %q", o.key)
}

func runMain(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseRunArgs("run", args, stdout, stderr)
	if !ok {
		return code
	}
	if o.verbose {
		logLevel.Set(slog.LevelDebug)
	}
	return o.run(stderr)
}

// parseRunArgs parses the arguments of dlock run, elect or lock (cmd). ok is
// false when the caller should exit with code.
func parseRunArgs(cmd string, args []string, stdout, stderr io.Writer) (o runOptions, code int, ok bool) {
	o.cmd, o.busyExit = cmd, exitBusy
	fs := newFlagSet(cmd)
	dsn := fs.String("dsn", "", "")
	usage, what := runUsage, "KEY"
	switch cmd {
	case "elect":
		usage, what = electUsage, "NAME"
		fs.StringVar(&o.value, "value", dlock.DefaultLabel, "")
	case "lock":
		usage = lockUsage
		fs.BoolVar(&o.env, "env", false, "")
	}
	ttl := fs.Duration("ttl", 0, "")
	fs.DurationVar(&o.wait, "wait", 0, "")
	fs.BoolVar(&o.noWait, "no-wait", false, "")
	shell := new(string)
	if cmd == "run" {
		fs.IntVar(&o.permits, "permits", 0, "")
		fs.StringVar(shell, "c", "", "")
		fs.DurationVar(&o.oncePer, "once-per", 0, "")
		fs.DurationVar(&o.atLeast, "at-least", 0, "")
		fs.DurationVar(&o.atMost, "at-most", 0, "")
	}
	if cmd != "elect" {
		fs.IntVar(&o.busyExit, "busy-exit", exitBusy, "")
		fs.BoolVar(&o.shared, "shared", false, "")
	}
	if cmd != "lock" {
		fs.DurationVar(&o.grace, "grace", defaultGrace, "")
	}
	fs.BoolVar(&o.verbose, "v", false, "")
	fs.BoolVar(&o.verbose, "verbose", false, "")
	logFormat := fs.String("log-format", "text", "")
	allowMem := addAllowMemFlag(fs)
	if code, ok := parseFlags(fs, args, usage, stdout, stderr); !ok {
		return o, code, false
	}
	synopsis := fmt.Sprintf("dlock %s [flags] %s -- COMMAND [ARG...]", cmd, what)
	if cmd == "run" {
		synopsis += " or dlock run [flags] -c SHELL-COMMAND KEY"
	}
	rest := fs.Args()
	if len(rest) == 0 {
		if cmd == "lock" {
			return o, usageError(stderr, cmd, "missing KEY: dlock lock [flags] KEY"), false
		}
		return o, usageError(stderr, cmd, "missing %s and COMMAND: %s", what, synopsis), false
	}
	o.key, rest = rest[0], rest[1:]
	// Flags may also come after KEY: before "--", or before COMMAND.
	if i := slices.Index(rest, "--"); i >= 0 && cmd != "lock" {
		if err := fs.Parse(rest[:i]); err != nil {
			return o, usageError(stderr, cmd, "%v", err), false
		}
		if extra := fs.Args(); len(extra) > 0 {
			return o, usageError(stderr, cmd, "unexpected argument %q between %s and --: COMMAND goes after --", extra[0], what), false
		}
		rest = rest[i+1:]
	} else if len(rest) > 0 && strings.HasPrefix(rest[0], "-") {
		if err := fs.Parse(rest); err != nil {
			return o, usageError(stderr, cmd, "%v", err), false
		}
		rest = fs.Args()
	}

	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case cmd == "lock" && len(rest) > 0:
		return o, usageError(stderr, cmd, "unexpected argument %q after KEY: dlock lock takes no command (dlock run does)", rest[0]), false
	case cmd == "lock":
	case set["c"] && len(rest) > 0:
		return o, usageError(stderr, cmd, "-c and COMMAND exclude each other: give the command after -- or as one shell string with -c"), false
	case set["c"] && strings.TrimSpace(*shell) == "":
		return o, usageError(stderr, cmd, "-c needs a shell command, such as -c 'make deploy'"), false
	case set["c"]:
		o.command = []string{shellPath, "-c", *shell}
	case len(rest) == 0:
		return o, usageError(stderr, cmd, "missing COMMAND: %s", synopsis), false
	default:
		o.command = rest
	}
	if code, ok := o.checkOnce(set, stderr); !ok {
		return o, code, false
	}
	switch {
	case set["busy-exit"] && (o.busyExit < 0 || o.busyExit > 255):
		return o, usageError(stderr, cmd, "--busy-exit must be 0..255, got %d", o.busyExit), false
	case set["busy-exit"] && !o.noWait && !set["wait"] && o.oncePer == 0:
		return o, usageError(stderr, cmd, "--busy-exit applies only with --no-wait or --wait: without them dlock waits as long as it takes"), false
	case o.shared && o.permits > 0:
		return o, usageError(stderr, cmd, "--shared and --permits exclude each other"), false
	case o.noWait && set["wait"]:
		return o, usageError(stderr, cmd, "--wait and --no-wait exclude each other"), false
	case set["wait"] && o.wait <= 0:
		return o, usageError(stderr, cmd, "--wait must be a positive duration such as 30s (use --no-wait not to wait)"), false
	case set["ttl"] && *ttl <= 0:
		return o, usageError(stderr, cmd, "--ttl must be a positive duration such as 30s"), false
	case o.grace < 0:
		return o, usageError(stderr, cmd, "--grace must not be negative"), false
	case set["permits"] && (o.permits < 1 || o.permits > semaphore.MaxPermits):
		return o, usageError(stderr, cmd, "--permits must be 1..%d, got %d", semaphore.MaxPermits, o.permits), false
	case *logFormat != "text" && *logFormat != "json":
		return o, usageError(stderr, cmd, "--log-format must be text or json, got %q", *logFormat), false
	}
	o.logJSON = *logFormat == "json"
	if set["ttl"] {
		o.lockOpt = append(o.lockOpt, dlock.WithTTL(*ttl))
	}
	if cmd == "elect" {
		// A campaign is an acquire whose label is the candidate's value
		// (package election).
		o.lockOpt = append(o.lockOpt, dlock.WithLabel(o.value))
	}
	var err error
	if o.dsn, err = resolveDSN(*dsn); err != nil {
		return o, usageError(stderr, cmd, "%v", err), false
	}
	if err := checkCrossProcess(o.dsn, allowMem); err != nil {
		return o, usageError(stderr, cmd, "%v", err), false
	}
	return o, 0, true
}

// signalError is the cause of a context cancelled because dlock got a signal.
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return "got signal " + signalName(e.sig) }

// interrupted returns the signal that cancelled ctx, if one did.
func interrupted(ctx context.Context) (os.Signal, bool) {
	var se *signalError
	if errors.As(context.Cause(ctx), &se) {
		return se.sig, true
	}
	return nil, false
}

// run takes the lock, runs the command under it and returns the exit status.
// leaseLogger is the logger of the lease's events (dlock.WithLogger): in
// text, dlock's own one-line format, warnings and errors only unless -v (-v
// prints the grant and release itself); in JSON, every event at the -v
// level.
func (o *runOptions) leaseLogger(stderr io.Writer) *slog.Logger {
	if o.logJSON {
		return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: &logLevel}))
	}
	return slog.New(&lineHandler{level: slog.LevelWarn, out: func(line string) { fmt.Fprintln(stderr, line) }})
}

func (o *runOptions) run(stderr io.Writer) int {
	logf := cmdLogf(stderr, o.key)

	// Find the command before touching the lock.
	var path string
	if o.command != nil {
		var err error
		if path, err = exec.LookPath(o.command[0]); err != nil {
			logf("cannot run %s", execErrText(o.command[0], err))
			if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
				return exitNotFound
			}
			return exitCannotRun
		}
	}

	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, signalsFor(o)...)
	defer signal.Stop(sigs)

	// Until the command starts, a signal means: stop waiting, leave nothing behind.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stopWatch, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case s := <-sigs:
			cancel(&signalError{s})
		case <-stopWatch:
		}
	}()
	endWatch := func() {
		close(stopWatch)
		<-watchDone
	}

	otelOpt, otelShutdown, err := setupOTel(ctx)
	if err != nil {
		endWatch()
		logf("OpenTelemetry export (OTEL_ variables): %v", err)
		return exitUsage
	}
	defer otelShutdown()
	lockerOpts := []dlock.Option{dlock.WithLogger(o.leaseLogger(stderr))}
	if otelOpt != nil {
		lockerOpts = append(lockerOpts, otelOpt)
	}
	locker, err := openLocker(ctx, o.dsn, lockerOpts...)
	if err != nil {
		endWatch()
		if sig, ok := interrupted(ctx); ok {
			logf("interrupted by %s while connecting to %s", signalName(sig), redactDSN(o.dsn))
			return exitSignal + signalNumber(sig)
		}
		logf("cannot open %s: %s", redactDSN(o.dsn), errText(err))
		return exitFor(err)
	}
	defer locker.Close()

	var lease *dlock.Lease
	var code int
	if o.oncePer > 0 {
		lease, code = o.claimRun(ctx, locker, logf)
	} else {
		lease, code = o.acquire(ctx, locker, logf)
	}
	endWatch()
	if lease == nil {
		return code
	}
	if sig, ok := interrupted(ctx); ok { // the signal raced the grant
		_ = lease.Release(context.Background())
		logf("interrupted by %s", signalName(sig))
		if o.claim != nil {
			logf("%s is recorded as claimed but the command did not run: it will not be made in this period", o.what())
		}
		return exitSignal + signalNumber(sig)
	}
	if o.command == nil {
		return o.hold(lease, sigs, logf)
	}
	code = o.supervise(lease, path, sigs, logf)
	if o.claim != nil {
		// The lease is released already; End completes the run's bookkeeping.
		var jobErr error
		if code != exitOK {
			jobErr = fmt.Errorf("exit status %d", code)
		}
		_, _ = o.claim.End(context.Background(), jobErr)
	}
	return code
}

// acquire takes the lock as the flags say. On failure it reports why and
// returns a nil lease and the exit status.
func (o *runOptions) acquire(ctx context.Context, locker dlock.Locker, logf func(string, ...any)) (*dlock.Lease, int) {
	actx := ctx
	if o.wait > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, o.wait)
		defer cancel()
	}
	start := time.Now()
	lease, err := o.take(actx, locker)
	if err == nil {
		if o.verbose {
			logf("acquired %q with token %d after %s", lease.Key(), lease.Token(), formatDuration(time.Since(start)))
		}
		return lease, exitOK
	}
	if o.verbose {
		logf("%s", errText(err))
	}
	if sig, ok := interrupted(ctx); ok {
		logf("interrupted by %s while waiting for %s", signalName(sig), o.what())
		return nil, exitSignal + signalNumber(sig)
	}
	if errors.Is(err, dlock.ErrNotAcquired) {
		switch {
		case o.noWait && o.permits > 0:
			logf("all %d permits of the semaphore %q are held (--no-wait)", o.permits, o.key)
			return nil, o.busyExit
		case o.noWait && o.shared:
			logf("the lock %q is held by a writer (--no-wait)", o.key)
			return nil, o.busyExit
		case o.noWait:
			logf("%s is held by another owner (--no-wait)", o.what())
			return nil, o.busyExit
		case errors.Is(err, context.DeadlineExceeded) && o.permits > 0:
			logf("all %d permits of the semaphore %q are still held after waiting %v (--wait)", o.permits, o.key, o.wait)
			return nil, o.busyExit
		case errors.Is(err, context.DeadlineExceeded) && o.shared:
			logf("the lock %q is still held by a writer after waiting %v (--wait)", o.key, o.wait)
			return nil, o.busyExit
		case errors.Is(err, context.DeadlineExceeded):
			logf("%s is still held by another owner after waiting %v (--wait)", o.what(), o.wait)
			return nil, o.busyExit
		}
	}
	logf("cannot take %s %s", o.what(), causeText(err))
	if errors.Is(err, semaphore.ErrSizeMismatch) || errors.Is(err, errNoSharedLocks) {
		return nil, exitUsage
	}
	return nil, exitFor(err)
}

// take acquires the lock KEY, or with --permits a permit of the semaphore
// KEY, waiting or not as the flags say; a permit is the lease on its slot.
func (o *runOptions) take(ctx context.Context, locker dlock.Locker) (*dlock.Lease, error) {
	if o.shared {
		return o.takeShared(ctx, locker)
	}
	if o.permits == 0 {
		if o.noWait {
			return locker.TryAcquire(ctx, o.key, o.lockOpt...)
		}
		return locker.Acquire(ctx, o.key, o.lockOpt...)
	}
	sem, err := semaphore.New(locker, o.key, o.permits, semaphore.WithLeaseOptions(o.lockOpt...))
	if err != nil {
		return nil, err
	}
	var p *semaphore.Permit
	if o.noWait {
		p, err = sem.TryAcquire(ctx)
	} else {
		p, err = sem.Acquire(ctx)
	}
	if err != nil {
		return nil, err
	}
	return p.Lease(), nil
}

// supervise runs the command while lease is held, and returns dlock's exit
// status.
func (o *runOptions) supervise(lease *dlock.Lease, path string, sigs <-chan os.Signal, logf func(string, ...any)) int {
	cmd := exec.Command(path, o.command[1:]...)
	cmd.Args[0] = o.command[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = childEnv(os.Environ(), lease.Key(), lease.Token())
	if o.cmd == "elect" {
		cmd.Env = append(slices.DeleteFunc(cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, "DLOCK_VALUE=") }),
			"DLOCK_VALUE="+o.value)
	}
	if o.oncePer > 0 {
		cmd.Env = append(slices.DeleteFunc(cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, "DLOCK_RUN=") }),
			"DLOCK_RUN="+runAtText(o.runAt))
	}
	child, err := startChild(cmd)
	if err != nil {
		_ = lease.Release(context.Background())
		logf("cannot run %s", execErrText(o.command[0], err))
		return exitCannotRun
	}

	lost := false
	leaseDone := lease.Done()
	var kill <-chan time.Time // fires when the grace period after a loss ends
loop:
	for {
		select {
		case s := <-sigs:
			child.forward(s)
		case <-leaseDone:
			leaseDone = nil
			lost = true
			logf("lost %s %s", o.what(), causeText(lease.Err()))
			if o.claim != nil {
				logf("the command ran past --at-most (%v), or the backend dropped the run's lease", o.onceJob().AtMost)
			}
			if o.grace > 0 {
				logf("stopping the command: SIGTERM now, SIGKILL in %v", o.grace)
				child.stop(false)
				kill = time.After(o.grace)
			} else {
				logf("stopping the command: SIGKILL")
				child.stop(true)
			}
		case <-kill:
			kill = nil
			logf("the command is still running %v after SIGTERM: SIGKILL", o.grace)
			child.stop(true)
		case <-child.done:
			break loop
		}
	}
	child.restoreTerminal()
	status := exitStatus(child.cmd.ProcessState)

	if lost {
		if kill != nil {
			// The command's leader exited; stop what it left in its group.
			child.waitGroup(kill)
		}
		logf("the command was stopped because %s was lost: it may not have run alone (its own exit status was %d)", o.what(), status)
		return exitLost
	}

	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	switch err := lease.Release(ctx); {
	case err == nil:
		if o.verbose {
			logf("released %q", lease.Key())
		}
	case errors.Is(err, dlock.ErrLeaseLost):
		logf("%s was lost before the command finished %s", o.what(), causeText(err))
		logf("the command may not have run alone (its own exit status was %d)", status)
		return exitLost
	default:
		logf("release of %s not confirmed %s; it frees itself when its TTL runs out", o.what(), causeText(err))
	}
	return status
}

// causeText formats an error from dlock about a known key as "(BACKEND):
// CAUSE", for messages that name the key themselves.
func causeText(err error) string {
	var de *dlock.Error
	if errors.As(err, &de) && de.Err != nil {
		return fmt.Sprintf("(%s): %v", de.Backend, de.Err)
	}
	return ": " + errText(err)
}

// execErrText says why the command name could not be run, without the
// wrapping of os/exec.
func execErrText(name string, err error) string {
	var ee *exec.Error
	if errors.As(err, &ee) {
		err = ee.Err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Sprintf("%q: %v", name, err)
}

// childEnv returns env with DLOCK_KEY and DLOCK_TOKEN set for the command.
func childEnv(env []string, key string, token dlock.Token) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if strings.HasPrefix(kv, "DLOCK_KEY=") || strings.HasPrefix(kv, "DLOCK_TOKEN=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "DLOCK_KEY="+key, "DLOCK_TOKEN="+token.String())
}

// child is the running command.
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait has returned
	fg   bool          // the command's process group was given the terminal
}

// startChild starts cmd in a process group of its own (see prepareChild)
// and waits for it in the background.
func startChild(cmd *exec.Cmd) (*child, error) {
	c := &child{cmd: cmd, done: make(chan struct{})}
	c.fg = prepareChild(cmd)
	started := make(chan error, 1)
	go func() {
		// On Linux the parent-death signal (see prepareChild) is sent when the
		// thread that started the child ends, not the process: keep this
		// goroutine on that thread for the child's life.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait() // the status is in cmd.ProcessState
		close(c.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	c.started()
	return c, nil
}

// waitGroup waits until the command's process group is empty. If kill fires
// first, it kills what is left.
func (c *child) waitGroup(kill <-chan time.Time) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for c.groupAlive() {
		select {
		case <-tick.C:
		case <-kill:
			c.stop(true)
			return
		}
	}
}
