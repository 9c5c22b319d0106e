package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/migrate"
)

const migrateUsage = `Usage:
  dlock migrate dsn --from OLD --to NEW [--mode new] [--show-passwords]
  dlock migrate switch-tokens --from OLD --to NEW [--margin 24h | --base N] [--timeout 1m]
  dlock migrate status --to NEW [--from OLD] [--timeout 1m]

Moves a running fleet from one lock backend (OLD, e.g. redis://...) to etcd or
ZooKeeper (NEW, etcd://... or zk://...) with configuration changes only; see
docs/MIGRATING.md.

  dsn            prints the migrate:// DSN to deploy: first without --mode
                 (migrating: both locks), then, after the switch, with
                 --mode new (the new lock only). Passwords show as xxxxx
                 unless --show-passwords. It refuses (exit 64), without
                 connecting, what dlock run would refuse of that DSN: an
                 unknown scheme, a new backend other than etcd or ZooKeeper,
                 a nested migrate:// DSN, ttl or autorenew on OLD or NEW
                 (they go on the migrate:// DSN), and mem://. The drivers'
                 own parameters are checked only when run connects.
  switch-tokens  records the token switch in NEW, once every client runs the
                 migrating DSN (no OLD-only client left). From then on every
                 grant's token comes from NEW, mapped above every token OLD
                 has given. Idempotent: run again, it reports the record.
  status         says whether the switch is recorded in NEW, and what it says.

Flags:
  --from DSN        the old backend's DSN (as the clients use it)
  --to DSN          the new backend's DSN (etcd://, etcds:// or zk://)
  --mode new        dsn: the new-only DSN
  --log-format F    text (default) or json: standard error's lines (dlock help logging)
  --show-passwords  dsn: print the DSN whole, passwords included, to deploy it
                    as it is. Dangerous: the output is then a secret, kept by
                    terminal scrollback, CI logs and whatever records output;
                    redirect it straight into your secret store
  --margin 24h      switch-tokens: added to OLD's clock (read through a token on
                    the key ".dlock-migrate-probe") to make the base (default 24h)
  --base N          switch-tokens: record N as the base instead of probing; for an
                    OLD whose tokens are not floored at a clock (not Redis). N must
                    be above every token OLD has given.
  --timeout 1m      bound on the whole command (default 1m)

Exit statuses:
  0   done (status: the switch is recorded)
  1   status: the switch is not recorded; switch-tokens: the record names another
      old backend, or the check after it failed
  64  usage error: a bad flag or DSN (mem:// is refused: it is in-process)
  69  a backend could not be reached
Passwords in DSNs are printed only by dsn --show-passwords.
`

// migrateMain runs `dlock migrate`.
func migrateMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, migrateUsage)
		return exitUsage
	}
	sub, args := args[0], args[1:]
	fs := newFlagSet("migrate " + sub)
	from := fs.String("from", "", "")
	to := fs.String("to", "", "")
	mode := fs.String("mode", "", "")
	margin := fs.Duration("margin", migrate.DefaultMargin, "")
	base := fs.String("base", "", "")
	timeout := fs.Duration("timeout", time.Minute, "")
	showPasswords := fs.Bool("show-passwords", false, "")
	switch sub {
	case "dsn", "switch-tokens", "status":
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, migrateUsage)
		return exitOK
	default:
		return usageError(stderr, "migrate", "unknown subcommand %q: want dsn, switch-tokens or status", sub)
	}
	if code, ok := parseFlags(fs, args, migrateUsage, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(stderr, "migrate", "unexpected argument %q", fs.Arg(0))
	}
	if *to == "" {
		return usageError(stderr, "migrate", "%s needs --to (the new backend's DSN)", sub)
	}
	if *from == "" && sub != "status" {
		return usageError(stderr, "migrate", "%s needs --from (the old backend's DSN)", sub)
	}
	if *timeout <= 0 {
		return usageError(stderr, "migrate", "--timeout must be positive")
	}
	if *showPasswords && sub != "dsn" {
		return usageError(stderr, "migrate", "--show-passwords is a flag of dsn, not of %s", sub)
	}
	for _, d := range []struct{ flag, dsn string }{{"--from", *from}, {"--to", *to}} {
		if d.dsn == "" {
			continue
		}
		if err := checkCrossProcess(d.dsn, nil); err != nil {
			return usageError(stderr, "migrate", "%s: %v", d.flag, err)
		}
	}
	if sub == "dsn" {
		if err := checkMigrateDSNs(*from, *to); err != nil {
			return usageError(stderr, "migrate", "%v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	switch sub {
	case "dsn":
		if *mode != "" && *mode != migrate.ModeNew && *mode != migrate.ModeMigrate {
			return usageError(stderr, "migrate", "--mode %q: want new (or migrate, the default)", *mode)
		}
		if *showPasswords {
			fmt.Fprintln(stdout, migrate.DSN(*from, *to, *mode))
			return exitOK
		}
		shownFrom, maskedFrom := maskedDSN(*from)
		shownTo, maskedTo := maskedDSN(*to)
		fmt.Fprintln(stdout, migrate.DSN(shownFrom, shownTo, *mode))
		if maskedFrom || maskedTo {
			fmt.Fprintln(stderr, "dlock migrate dsn: passwords are shown as xxxxx; --show-passwords prints them (see dlock help migrate)")
		}
		return exitOK

	case "switch-tokens":
		o := &migrate.SwitchOptions{Margin: *margin}
		if *base != "" {
			n, err := strconv.ParseUint(*base, 10, 64)
			if err != nil || n == 0 {
				return usageError(stderr, "migrate", "--base %q: want a positive whole number", *base)
			}
			o.Base = n
		}
		if *margin <= 0 {
			return usageError(stderr, "migrate", "--margin must be positive")
		}
		rec, created, err := migrate.Switch(ctx, *from, *to, o)
		if rec != nil {
			if created {
				fmt.Fprintln(stdout, "switched: tokens now come from the new backend, mapped above the base")
			} else {
				fmt.Fprintln(stdout, "already switched")
			}
			printRecord(stdout, rec)
		}
		if err != nil {
			return migrateError(stderr, sub, err)
		}
		return exitOK

	default: // status
		rec, err := migrate.ReadSwitch(ctx, *to)
		if errors.Is(err, migrate.ErrNotSwitched) {
			fmt.Fprintln(stdout, "not switched: tokens come from the old backend")
			return exitFailure
		}
		if err != nil {
			return migrateError(stderr, sub, err)
		}
		fmt.Fprintln(stdout, "switched")
		printRecord(stdout, rec)
		if *from != "" {
			id, err := migrate.BackendID(*from)
			if err != nil {
				return usageError(stderr, "migrate", "--from: %v", err)
			}
			if id != rec.From {
				logError(stderr, "dlock migrate status: ", fmt.Sprintf("%v: it names the old backend %s, --from is %s", migrate.ErrMismatch, rec.From, id))
				return exitFailure
			}
		}
		return exitOK
	}
}

// migrateTargets are the schemes the migrate:// driver accepts for the new
// backend (it keeps the switch record there).
var migrateTargets = []string{"etcd", "etcds", "zk"}

// checkMigrateDSNs refuses, without connecting, the old and new DSNs that the
// migrate:// driver refuses when dlock run opens the DSN migrate dsn prints
// with them. Its errors never contain a DSN.
func checkMigrateDSNs(from, to string) error {
	for _, d := range []struct{ flag, dsn string }{{"--from", from}, {"--to", to}} {
		if err := checkDSN(d.dsn); err != nil {
			return fmt.Errorf("%s: %w", d.flag, err)
		}
		u, err := backend.ParseDSN(d.dsn)
		if err != nil {
			return fmt.Errorf("%s: %w", d.flag, err)
		}
		if u.Scheme == migrate.Scheme {
			return fmt.Errorf("%s: a migrate:// DSN cannot nest another: give the backend's own DSN", d.flag)
		}
		q := u.Query()
		for _, name := range []string{"ttl", "autorenew"} {
			if q.Has(name) {
				return fmt.Errorf("%s: parameter %s: put %s=%s on the migrate:// DSN, which applies it to both locks", d.flag, name, name, q.Get(name))
			}
		}
		if d.flag == "--to" && !slices.Contains(migrateTargets, u.Scheme) {
			return fmt.Errorf("--to: the new backend must be etcd (etcd://, etcds://) or ZooKeeper (zk://), not %s://", u.Scheme)
		}
	}
	return nil
}

// maskedDSN returns dsn as it is if it holds no secret, else redacted as
// redactDSN does; masked reports which.
func maskedDSN(dsn string) (shown string, masked bool) {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return redactDSN(dsn), true
	}
	if r := backend.Redact(u); r != u.String() {
		return r, true
	}
	return dsn, false
}

// printRecord prints a switch record, one field a line.
func printRecord(w io.Writer, rec *migrate.Record) {
	fmt.Fprintf(w, "  old backend: %s\n  base:        %d\n  at:          %s\n", rec.From, rec.Base, rec.At.Format(time.RFC3339))
}

// migrateError prints err and returns the exit status for it.
func migrateError(stderr io.Writer, sub string, err error) int {
	logError(stderr, "dlock migrate "+sub+": ", err.Error())
	switch {
	case errors.Is(err, dlock.ErrInvalidOption):
		return exitUsage
	case errors.Is(err, migrate.ErrMismatch), errors.Is(err, migrate.ErrTokenBackwards):
		return exitFailure
	}
	return exitUnavailable
}
