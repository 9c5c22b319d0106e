// Command dlock runs a command under a distributed lock, checks that a
// deployment is fit for locking, and compares backends.
//
// Install it with
//
//	go install github.com/dlock-go/dlock/cmd/dlock@latest
//
// Every subcommand takes the backend as a DSN, with --dsn or in the
// environment variable DLOCK_DSN. Every scheme of dlock's drivers works:
// redis and rediss (with their +sentinel and +cluster forms), redlock,
// redlocks, etcd, etcds, zk, postgres, postgresql, mysql, pgtable,
// mysqltable and migrate. mem (in-process) is refused, since a lock that
// lives in one dlock process protects nothing between commands, unless
// --allow-mem is given for a demo.
// Passwords in DSNs are never printed. Messages go to standard error,
// prefixed "dlock: ", and so do the drivers' warnings (such as the Redis
// driver's about a server configured to evict keys); -v shows the drivers'
// notes too. With --log-format json, which every command takes, each line
// on standard error is a JSON object instead, errors included (`dlock help
// logging` has the schema). `dlock help COMMAND` shows a command's flags and
// exit statuses.
//
// # dlock run
//
//	dlock run [--dsn DSN] [--ttl 30s] [--wait 1m | --no-wait] [--grace 10s] [-v] KEY -- COMMAND [ARG...]
//	dlock run [flags] -c SHELL-COMMAND KEY
//	dlock run --once-per PERIOD [--at-least D] [--at-most D] [flags] KEY -- COMMAND [ARG...]
//
// Like flock(1) or `etcdctl lock`, but distributed and fenced: dlock waits for
// the lock KEY, starts COMMAND with the lease's fencing token in $DLOCK_TOKEN
// and the key in $DLOCK_KEY, renews the lease while COMMAND runs, and releases
// it when COMMAND exits. COMMAND should pass $DLOCK_TOKEN with every write to
// the resource the lock protects, and the resource should reject tokens lower
// than the highest it has seen: that is what keeps out a holder that lost its
// lock without knowing (a pause, a partition).
//
// COMMAND runs in a process group of its own. dlock forwards SIGINT, SIGTERM,
// SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to that group. When dlock runs in the
// foreground of a terminal, it hands the terminal to COMMAND's group, so
// COMMAND can read from it and Ctrl-C reaches COMMAND directly; dlock takes the
// terminal back when COMMAND exits. Job control (Ctrl-Z) is not supported.
// dlock releases the lock when COMMAND exits, even if COMMAND left processes
// running in the background.
//
// If the lease is lost while COMMAND runs — a renewal failed, or the backend
// dropped the lock — dlock sends SIGTERM to COMMAND's process group, SIGKILL
// to whatever is left of the group after the grace period (--grace), and
// exits with status 76. On Linux, COMMAND also gets SIGKILL if dlock itself
// dies, since nothing renews the lease then.
//
// Exit statuses of dlock run:
//
//	N      COMMAND's own exit status N
//	128+N  COMMAND was killed by signal N; or dlock got signal N while waiting for the lock
//	64     usage error: a bad flag, DSN, key or TTL (EX_USAGE)
//	69     backend unavailable: dlock could not connect, or could not take the
//	       lock for a reason other than its being held (EX_UNAVAILABLE)
//	75     lock held by another owner: with --no-wait, or --wait ran out (EX_TEMPFAIL)
//	76     the lease was lost while COMMAND ran: COMMAND was stopped, and may not
//	       have run alone
//	79     --once-per: another invocation already made, or is making, this
//	       period's run; COMMAND did not run here
//	126    COMMAND could not be started
//	127    COMMAND was not found
//
// -c runs a shell string with /bin/sh -c, as flock -c does; --busy-exit N
// replaces 75, as flock -E does; --shared takes a read hold (package rwlock)
// where the backend has shared locks of its own. --once-per PERIOD runs
// COMMAND once per period across the hosts whose crontab runs the same line
// (package schedule), --at-most and --at-least bounding each run's hold.
//
// # dlock lock
//
//	dlock lock [--dsn DSN] [--ttl 30s] [--wait 1m | --no-wait] [--shared] [--env] KEY
//
// Takes the lock KEY, prints its token (DLOCK_KEY and DLOCK_TOKEN lines for
// eval with --env) and holds it until SIGINT or SIGTERM, then releases it and
// exits 0, as `etcdctl lock KEY` does without a command; exit 76 if the lease
// is lost meanwhile.
//
// # dlock check
//
//	dlock check [--dsn DSN ...] [--run REGEXP] [--timeout 10m] [--out report.html] [-o json] [-v]
//
// Runs dlock's conformance suite (package conformance) against live
// deployments, and prints the driver's capabilities, its notes on the
// deployment, and a pass/fail table: is this Redis, etcd, ZooKeeper or
// PostgreSQL setup fit for locking? With several --dsn it checks them at once
// (one after another on the same servers) and prints one table with a column
// per deployment: capabilities, a short latency measurement, and each test's
// result; --out writes it as an HTML page or JSON, -o json prints the JSON.
// The suite runs in a child process of dlock, under package testing, as go
// test would run it.
//
// The suite takes locks on keys of its own ("conformance/..."), under a key
// prefix of its own on Redis, Redlock and etcd and a fence table of its own
// on PostgreSQL. Afterwards, or when --timeout stops it, dlock deletes what
// the backend keeps where it can, and lists what remains with how to remove
// it. The tests that need the server to forget a holder behind its back run
// with the credentials given: on Redis dlock deletes the check's own lock
// key, elsewhere it breaks the lock (dlock.Break); a test whose credentials
// lack the privilege is skipped and names it. Exit status: 0 if no test
// failed, 1 if one did, 64 on a usage error, 69 if a deployment cannot be
// reached.
//
// # dlock bench
//
//	dlock bench --dsn A [--dsn B ...] [--clients 8] [--duration 10s] [--out report.html]
//
// Measures each backend in turn, for --duration: the latency of an
// uncontended acquire (p50/p99); then the grants per second when --clients
// clients contend for one key, and the hand-off latency from a release to the
// next holder's grant (p50/p99). It shows progress on standard error and
// prints a table; --out also writes a chart comparing the backends, as a
// self-contained HTML page (.html) or an SVG image (.svg). Exit status: 0, 1
// if a measurement failed, 64 on a usage error, 69 if a backend cannot be
// reached.
//
// # dlock ls, dlock inspect, dlock break
//
//	dlock ls [--dsn DSN] [-o json] [PREFIX]
//	dlock inspect [--dsn DSN] [-o json] KEY
//	dlock break [--dsn DSN] [--yes] KEY
//
// ls lists what is held under PREFIX with the holders: token, label (by
// default host:pid), owner ID, expiry and waiters; semaphores ("2 of 4
// permits") and read/write locks ("3 readers", "writer") are grouped with
// their permits and readers. inspect shows one lock, semaphore or
// read/write lock (exit 1 if nobody holds it). -o json prints either as
// JSON, in the shape `dlock help inspect` describes. break force-releases a
// stuck lock, after showing its holder and asking for confirmation unless
// --yes (exit 1 if it was not held or not confirmed). A broken holder learns it at its next
// renewal at the latest, and the next holder's fencing token is higher.
// (Redlock reports no token.)
//
// # dlock elect, dlock leader
//
//	dlock elect [--dsn DSN] [--value V] [--ttl 30s] [--wait 1m | --no-wait] [--grace 10s] NAME -- COMMAND [ARG...]
//	dlock leader [--dsn DSN] [-o json] [--watch] [--interval 1s] NAME
//
// elect campaigns in the election NAME (package election) and runs COMMAND
// only while leading, as dlock run does under a lock: the term's token in
// $DLOCK_TOKEN, the election in $DLOCK_KEY, the published value (--value,
// default host:pid) in $DLOCK_VALUE; stopped on loss (exit 76); resigned when
// it exits. leader shows who leads (exit 1 if nobody); --watch prints each
// change.
//
// # dlock migrate
//
//	dlock migrate dsn --from OLD --to NEW [--mode new]
//	dlock migrate switch-tokens --from OLD --to NEW [--margin 24h | --base N]
//	dlock migrate status --to NEW [--from OLD]
//
// Moves a running fleet from Redis (or another backend) to etcd or ZooKeeper
// with configuration changes only: dsn prints the migrate:// DSN to deploy,
// switch-tokens records, once, the point from which tokens come from NEW
// (mapped above every token OLD gave), and status shows that record. See
// docs/MIGRATING.md and `dlock help migrate`.
//
// # Examples
//
//	export DLOCK_DSN=redis://127.0.0.1:6379/0
//	dlock run nightly-report -- ./report.sh --full
//	dlock run --no-wait --ttl 10s backup -- sh -c 'pg_dump app > /backup/app.sql'
//	dlock check --dsn 'etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks'
//	dlock bench --dsn redis://127.0.0.1:6379/0 --dsn etcd://127.0.0.1:2379 --out report.html
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// Exit statuses. See the package documentation.
const (
	exitOK          = 0
	exitFailure     = 1   // check: a test failed; bench: a measurement failed
	exitUsage       = 64  // EX_USAGE
	exitUnavailable = 69  // EX_UNAVAILABLE
	exitBusy        = 75  // EX_TEMPFAIL: lock held (--no-wait) or --wait ran out
	exitLost        = 76  // lease lost while the command ran
	exitDone        = 79  // run --once-per: another invocation already claimed this period's run
	exitCannotRun   = 126 // the command could not be started
	exitNotFound    = 127 // the command was not found
	exitSignal      = 128 // + the signal's number
)

const usageText = `dlock runs commands under distributed locks with fencing tokens,
checks that a deployment is fit for locking, and compares backends.

Usage:
  dlock run [flags] KEY -- COMMAND [ARG...]   run COMMAND while holding the lock KEY
  dlock run [flags] -c SHELL-COMMAND KEY      the same, through /bin/sh -c
  dlock lock [flags] KEY                      hold KEY, print its token, release on SIGTERM
  dlock check [flags]                         run the conformance suite; compare deployments
  dlock bench [flags]                         compare backends: latency, throughput, hand-off
  dlock migrate dsn|switch-tokens|status      move a fleet from Redis to etcd/ZooKeeper
  dlock ls [flags] [PREFIX]                   list held locks, semaphores, read/write locks
  dlock inspect [flags] KEY                   who holds KEY (a lock, semaphore or rwlock)
  dlock break [flags] KEY                     force-release a stuck lock (asks first)
  dlock elect [flags] NAME -- COMMAND [ARG...] run COMMAND only while leading the election NAME
  dlock leader [flags] NAME                   who leads the election NAME (--watch to follow)
  dlock help [COMMAND]                        show a command's flags and exit statuses
  dlock help logging                          --log-format json: the schema of every line on stderr
  dlock version                               print dlock's version

The backend is a DSN, given with --dsn or in $DLOCK_DSN:
  redis://[user:password@]host:6379/0?ttl=15s    rediss:// for TLS
  redlock://host1:6379,host2:6379,host3:6379      a quorum of independent Redis masters
  etcd://host1:2379,host2:2379/locks              etcds:// for TLS
  zk://host1:2181,host2:2181/dlock                ZooKeeper
  postgres://user:password@host:5432/db           PostgreSQL advisory locks
  mysql://user:password@host:3306/db              MySQL and MariaDB GET_LOCK
  pgtable://, mysqltable://                       a lock table (through PgBouncer and other proxies)
  nats://host1:4222,host2:4222/locks              NATS JetStream key-value bucket
  mem://NAME                                      in-process: refused, as it protects nothing
                                                  between commands, but with --allow-mem (demos);
                                                  check and bench accept it, as one self-contained run
Passwords in DSNs are never printed (but by dlock migrate dsn --show-passwords).

Output for scripts: ls, inspect and leader print JSON with -o json (its shape
is in their help); every command takes --log-format json, which makes each
line on standard error one JSON object (dlock help logging has the schema).

Examples:
  export DLOCK_DSN=redis://127.0.0.1:6379/0
  dlock run nightly-report -- ./report.sh --full
  dlock run --no-wait backup -- sh -c 'pg_dump app > /backup/app.sql'
  dlock check --dsn 'etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks'
  dlock bench --dsn redis://127.0.0.1:6379/0 --dsn etcd://127.0.0.1:2379 --out report.html
`

func main() {
	// go-redis logs connection errors on its own; dlock reports them itself.
	goredis.SetLogger(quietLogger{})
	slog.SetDefault(slog.New(newLineHandler(os.Stderr, &logLevel)))
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

// quietLogger discards go-redis's log.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// dispatch runs the subcommand named by args[0] and returns the exit status.
func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	stderr, restore := setupLogging(args, stderr)
	defer restore()
	switch cmd, rest := args[0], args[1:]; cmd {
	case "run":
		return runMain(rest, stdout, stderr)
	case "lock":
		return lockMain(rest, stdout, stderr)
	case "check":
		return checkMain(rest, stdout, stderr)
	case "bench":
		return benchMain(rest, stdout, stderr)
	case "migrate":
		return migrateMain(rest, stdout, stderr)
	case "ls":
		return lsMain(rest, stdout, stderr)
	case "inspect":
		return inspectMain(rest, stdout, stderr)
	case "break":
		return breakMain(rest, stdout, stderr)
	case "elect":
		return electMain(rest, stdout, stderr)
	case "leader":
		return leaderMain(rest, stdout, stderr)
	case checkSuiteCommand:
		return checkSuiteMain(rest)
	case "help", "-h", "-help", "--help":
		return helpMain(rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "dlock", version())
		return exitOK
	default:
		if strings.HasPrefix(cmd, "-") {
			logTo(stderr, slog.LevelError, "dlock: ", fmt.Sprintf("flag %s before the command: flags go after it, as in dlock run --dsn DSN KEY -- COMMAND (see dlock help)", cmd))
			return exitUsage
		}
		logTo(stderr, slog.LevelError, "dlock: ", fmt.Sprintf("unknown command %q: want run, lock, check, bench, migrate, ls, inspect, break, elect or leader (see dlock help)", cmd))
		return exitUsage
	}
}

func helpMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stdout, usageText)
		return exitOK
	}
	switch args[0] {
	case "run":
		fmt.Fprint(stdout, runUsage)
	case "lock":
		fmt.Fprint(stdout, lockUsage)
	case "check":
		fmt.Fprint(stdout, checkUsage)
	case "bench":
		fmt.Fprint(stdout, benchUsage)
	case "migrate":
		fmt.Fprint(stdout, migrateUsage)
	case "ls":
		fmt.Fprint(stdout, lsUsage)
	case "inspect":
		fmt.Fprint(stdout, inspectUsage)
	case "break":
		fmt.Fprint(stdout, breakUsage)
	case "elect":
		fmt.Fprint(stdout, electUsage)
	case "leader":
		fmt.Fprint(stdout, leaderUsage)
	case "logging":
		fmt.Fprint(stdout, loggingUsage)
	default:
		logTo(stderr, slog.LevelError, "dlock: ", fmt.Sprintf("no help for %q: want run, lock, check, bench, migrate, ls, inspect, break, elect, leader or logging", args[0]))
		return exitUsage
	}
	return exitOK
}

// version is the module version dlock was built from ("(devel)" in a
// working tree).
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// newFlagSet returns a flag set for a subcommand that reports errors to the
// caller instead of printing them.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args into fs. On --help it prints usage to stdout; on an
// error it says what is wrong and where to look. ok is false when the caller
// should return code.
func parseFlags(fs *flag.FlagSet, args []string, usage string, stdout, stderr io.Writer) (code int, ok bool) {
	logFormat := fs.Lookup("log-format") // every command takes it (see dlock help logging)
	if logFormat == nil {
		fs.String("log-format", "text", "")
		logFormat = fs.Lookup("log-format")
	}
	err := fs.Parse(args)
	switch {
	case err == nil && logFormat.Value.String() != "text" && logFormat.Value.String() != "json":
		return usageError(stderr, fs.Name(), "--log-format must be text or json, got %q", logFormat.Value.String()), false
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage)
		return exitOK, false
	default:
		return usageError(stderr, fs.Name(), "%v", err), false
	}
}

// usageError prints a usage error for subcommand cmd and returns exitUsage.
func usageError(stderr io.Writer, cmd, format string, args ...any) int {
	hint := fmt.Sprintf("Run 'dlock help %s' for usage.", cmd)
	if jsonLogs(stderr) {
		logTo(stderr, slog.LevelError, "", fmt.Sprintf(format, args...), "hint", hint)
	} else {
		fmt.Fprintf(stderr, "dlock %s: %s\n%s\n", cmd, fmt.Sprintf(format, args...), hint)
	}
	return exitUsage
}

// stringsFlag is a flag that may be repeated.
type stringsFlag []string

func (s *stringsFlag) String() string     { return strings.Join(*s, ",") }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

// resolveDSN returns the DSN given with --dsn, or else $DLOCK_DSN, parsed
// and checked against the registered schemes. Its errors never contain the
// DSN.
func resolveDSN(flagValue string) (string, error) {
	dsn := flagValue
	if dsn == "" {
		dsn = os.Getenv("DLOCK_DSN")
	}
	if dsn == "" {
		return "", errors.New("no backend: pass --dsn DSN or set $DLOCK_DSN (e.g. redis://127.0.0.1:6379/0)")
	}
	if err := checkDSN(dsn); err != nil {
		return "", err
	}
	return dsn, nil
}

// checkDSN parses dsn and checks that a driver is registered for its scheme.
// Its errors never contain the DSN.
func checkDSN(dsn string) error {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return err
	}
	if _, ok := backend.Lookup(u.Scheme); !ok {
		return fmt.Errorf("unknown DSN scheme %q: want one of %s", u.Scheme, strings.Join(backend.Schemes(), ", "))
	}
	return nil
}

// redactDSN returns dsn with its password replaced by "xxxxx", for printing.
func redactDSN(dsn string) string {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return "(malformed DSN)"
	}
	return backend.Redact(u)
}

// openTimeout bounds opening a backend (connecting, checking the server).
const openTimeout = 30 * time.Second

// openLocker opens dsn, bounded by ctx and by openTimeout.
func openLocker(ctx context.Context, dsn string, opts ...dlock.Option) (dlock.Locker, error) {
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	return dlock.Open(ctx, dsn, opts...)
}

// exitFor returns the exit status for an error from dlock.Open or from an
// acquire that was not about the lock being held: a usage error if the input
// was bad, else the backend is unavailable.
func exitFor(err error) int {
	if errors.Is(err, dlock.ErrInvalidOption) || errors.Is(err, dlock.ErrInvalidKey) || errors.Is(err, dlock.ErrUnknownScheme) {
		return exitUsage
	}
	return exitUnavailable
}

// errText returns err's message without dlock's "dlock: " prefix, for
// messages that have their own.
func errText(err error) string {
	return strings.TrimPrefix(err.Error(), "dlock: ")
}

// writeTable prints rows in columns two spaces apart, without trailing
// blanks.
func writeTable(w io.Writer, rows [][]string) {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
	for line := range strings.Lines(b.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
}
