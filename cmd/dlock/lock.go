// dlock lock: hold a lock until told to let go, as `etcdctl lock` does
// without a command; and the read holds of --shared (package rwlock).

package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/rwlock"
)

const lockUsage = `Usage: dlock lock [flags] KEY

Takes the lock KEY and holds it, renewing the lease, until dlock gets SIGINT
or SIGTERM: then it releases the lock and exits 0. Like 'etcdctl lock KEY'
without a command, for scripts that cannot run their work as one command.
Once the lock is held, dlock prints its fencing token on standard output, one
line; with --env it prints instead

  DLOCK_KEY='KEY'
  DLOCK_TOKEN=TOKEN

for a shell's eval. Pass the token with every write to the resource the lock
protects, and have the resource reject tokens lower than the highest it has
seen. If the lease is lost while held, dlock says so on standard error and
exits 76 at once: whatever relies on the lock may no longer run alone. Any
other signal ends dlock without a release; the lock then frees itself when
its TTL runs out.

Flags:
  --dsn DSN      the backend (default $DLOCK_DSN), e.g. redis://127.0.0.1:6379/0
  --ttl D        how long the backend keeps the lock if dlock dies without
                 releasing it (default: the DSN's ttl parameter, else 15s);
                 dlock renews the lease every TTL/3
  --wait D       give up after waiting D for the lock (default: wait as long
                 as it takes)
  --no-wait      give up at once if the lock is held
  --busy-exit N  the exit status when the lock is held with --no-wait, or
                 still held when --wait runs out (0..255; default 75)
  --shared       take a read hold (package rwlock): readers hold KEY together,
                 and exclude and are excluded by 'dlock lock KEY' and
                 'dlock run KEY' without --shared. Only on backends with shared
                 locks of their own: redis:// (without fair=true), etcd://,
                 zk://, postgres://; refused elsewhere (exit 64)
  --env          print DLOCK_KEY and DLOCK_TOKEN lines for eval
  -v, --verbose  report the token, acquire and release, and the driver's
                 notes, on standard error
  --log-format F text (default) or json: how the lease's events are logged
                 on standard error
` + allowMemUsage + `

Exit status:
  0     released after SIGINT or SIGTERM
  64    usage error: a bad flag, DSN, key or TTL; --shared on a backend
        without shared locks
  69    backend unavailable: could not connect, could not take the lock for
        a reason other than its being held, or the release was not confirmed
  75    lock held by another owner: with --no-wait, or --wait ran out
        (see --busy-exit)
  76    the lease was lost while held
  128+N dlock got signal N while waiting for the lock

Examples:
  export DLOCK_DSN=redis://127.0.0.1:6379/0
  dlock lock --env deploy > lock.env & holder=$!
  until grep -qs DLOCK_TOKEN lock.env; do kill -0 $holder || exit 1; sleep 0.2; done
  eval "$(cat lock.env)"; ./deploy --fence "$DLOCK_TOKEN"
  kill $holder; wait $holder    # releases; 76 if the lock was lost meanwhile
`

// releaseSignals are the signals on which dlock lock releases the lock and
// exits.
var releaseSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM}

// errNoSharedLocks refuses --shared on a backend without shared locks of its
// own.
var errNoSharedLocks = errors.New("the backend has no shared locks of its own, so a --shared reader would not " +
	"exclude 'dlock run KEY'; --shared works on redis:// (without fair=true), etcd://, zk:// and postgres://")

func lockMain(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseRunArgs("lock", args, stdout, stderr)
	if !ok {
		return code
	}
	if o.verbose {
		logLevel.Set(slog.LevelDebug)
	}
	o.stdout = stdout
	return o.run(stderr)
}

// takeShared takes a read hold of the rwlock KEY, waiting or not as the flags
// say, where the backend holds locks shared: the hold is then one lease on
// KEY, and the exclusive holds of dlock run and lock are the rwlock's write
// holds.
func (o *runOptions) takeShared(ctx context.Context, locker dlock.Locker) (*dlock.Lease, error) {
	if !locker.Capabilities().Shared {
		return nil, errNoSharedLocks
	}
	m, err := rwlock.New(locker, o.key, o.lockOpt...)
	if err != nil {
		return nil, err
	}
	var h *rwlock.Hold
	if o.noWait {
		h, err = m.TryRLock(ctx)
	} else {
		h, err = m.RLock(ctx)
	}
	if err != nil {
		return nil, err
	}
	return h.Lease(), nil
}

// hold prints lease's token and holds it until a signal (release, exit 0) or
// its loss (exit 76).
func (o *runOptions) hold(lease *dlock.Lease, sigs <-chan os.Signal, logf func(string, ...any)) int {
	out := lease.Token().String() + "\n"
	if o.env {
		out = "DLOCK_KEY=" + shellQuote(lease.Key()) + "\nDLOCK_TOKEN=" + lease.Token().String() + "\n"
	}
	if _, err := io.WriteString(o.stdout, out); err != nil {
		logf("cannot print the token: %v", err)
	}
	select {
	case <-lease.Done():
		logf("lost %s %s", o.what(), causeText(lease.Err()))
		logf("whatever relied on it may not have run alone")
		return exitLost
	case s := <-sigs:
		if o.verbose {
			logf("got %s: releasing %q", signalName(s), lease.Key())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	switch err := lease.Release(ctx); {
	case err == nil:
		if o.verbose {
			logf("released %q", lease.Key())
		}
		return exitOK
	case errors.Is(err, dlock.ErrLeaseLost):
		logf("%s was lost before the release %s", o.what(), causeText(err))
		logf("whatever relied on it may not have run alone")
		return exitLost
	default:
		logf("release of %s not confirmed %s; it frees itself when its TTL runs out", o.what(), causeText(err))
		return exitUnavailable
	}
}

// shellQuote quotes s for a POSIX shell, in single quotes.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// signalsFor returns the signals dlock catches while it holds a lock: those
// it forwards to COMMAND, or without one those that end the hold.
func signalsFor(o *runOptions) []os.Signal {
	if o.command == nil {
		return releaseSignals
	}
	return forwardSignals
}
