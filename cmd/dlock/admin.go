// dlock ls, dlock inspect and dlock break: who holds what, and breaking a
// stuck lock.

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock"
)

const lsUsage = `Usage: dlock ls [--dsn DSN] [-o table|json] [PREFIX]

Lists what is held on the backend under PREFIX (everything if none): locks,
semaphores (package semaphore) and read/write locks (package rwlock), one
line each, the permits of a semaphore and the readers of a read/write lock
on lines of their own below it. Columns: key, kind (lock, semaphore, permit,
rwlock, reader), how it is held ("yes", "2 of 4 permits", "3 readers",
"writer"), fencing token, holder's label (by default host:pid), owner ID, when
the server expires it unless renewed, and how many clients wait for it ("-"
where the backend cannot tell).

A semaphore is recognised by its slots' keys, NAME/permits/I; a read/write
lock by its read slots, NAME/read/permits/I, and its write lock NAME/write,
or, on backends that hold locks shared (PostgreSQL, etcd, ZooKeeper, Redis),
by a key held shared by its readers (held exclusively, a read/write lock's
writer looks like a lock's holder there).

With -o json, it prints a JSON array with one object per line of the table
that is not indented, as dlock inspect -o json prints one (see dlock help
inspect for the object's fields).

Flags:
  --dsn DSN        the backend (default $DLOCK_DSN)
  -o, --output F   table (default) or json
  --log-format F   text (default) or json (see dlock help logging)

Exit statuses: 0 listed (even if nothing is held); 64 usage error; 69 the
backend is unreachable.
`

const inspectUsage = `Usage: dlock inspect [--dsn DSN] [-o table|json] KEY

Shows the state of KEY: a lock, a semaphore or a read/write lock.

A lock: held or not; if held, its fencing token, the holder's label (by
default host:pid) and owner ID, when it was granted and when the server
expires it unless renewed, where the backend records them; and how many
clients wait for it. On backends that hold locks shared (PostgreSQL, etcd,
ZooKeeper, Redis), a read/write lock is such a lock: "for reading, by 3
readers" when its readers hold it, and held exclusively by its writer.

A semaphore (KEY's slots, KEY/permits/I, are held): "3 of 4 permits held,
by ...", each permit's slot, token, holder and expiry, and how many wait.
The number of permits comes from the permits' labels (portable layout), or
from the backend's own layout on Redis and etcd; on ZooKeeper, and where
dlock cannot read it, inspect says it does not know it.

A read/write lock in the portable layout (KEY/write and KEY/read/permits/I:
Redlock, MySQL, the table locks, Redis with fair=true): "for writing" with
the writer, or "for reading, by N readers" with each reader.

Where the backend cannot list its locks (PostgreSQL with tokens=sequence),
inspect says it cannot tell whether KEY is a semaphore.

With -o json, it prints one JSON object:
  key           KEY
  kind          "lock", "semaphore" or "rwlock"
  held          true or false
  mode          when held: "exclusive" (lock), "write" or "read" (rwlock)
  readers       rwlock held for reading: how many readers
  permits       semaphore: its number of permits (absent where unknown)
  permits_held  semaphore: how many are held
  holders       array of {key, role, token, label, owner, granted, expires}:
                the lock's holder (for readers held shared: the one the
                backend reports), each permit (key: its slot), the writer
                or each reader. token 0: the backend cannot tell; granted
                null: not recorded; expires null: held as long as the
                holder's session
  waiters       how many wait; null where the backend cannot tell
  notes         array of what the backend cannot tell (absent if none)

Flags:
  --dsn DSN        the backend (default $DLOCK_DSN)
  -o, --output F   table (default) or json
  --log-format F   text (default) or json (see dlock help logging)

Exit statuses: 0 held; 1 not held; 64 usage error; 69 the backend is
unreachable or cannot report its locks.
`

const breakUsage = `Usage: dlock break [--dsn DSN] [--yes] KEY

Force-releases the lock KEY, whoever holds it, and prints what it broke. It
shows the holder and asks for confirmation first, unless --yes. A
semaphore's permit is broken by its slot's key (KEY/permits/I, as dlock
inspect shows it); a read/write lock held shared by its key, which breaks
every reader.

The broken holder learns it at its next renewal at the latest (at once on
backends that report loss), and the next holder's fencing token is higher, so
a resource that checks tokens rejects the broken holder's writes. A holder
that does not watch its lease may go on working: break only a holder you know
to be stuck. On PostgreSQL, breaking ends the holder's session, and with it
every lock that session holds (dlock's leases of one TTL share a session).

Flags:
  --dsn DSN        the backend (default $DLOCK_DSN)
  --yes            do not ask
  --log-format F   text (default) or json (see dlock help logging)

Exit statuses: 0 broken; 1 not held, or not confirmed; 64 usage error; 69 the
backend is unreachable or cannot break locks.
`

// stdin is where dlock break reads its confirmation (a variable for tests).
var stdin io.Reader = os.Stdin

// adminTimeout bounds the requests of ls, inspect and break.
const adminTimeout = 30 * time.Second

// outputFlag adds -o and --output (table or json) to fs.
func outputFlag(fs *flag.FlagSet) *string {
	o := fs.String("o", "table", "")
	fs.StringVar(o, "output", "table", "")
	return o
}

// checkOutput returns a usage error unless -o is table or json.
func checkOutput(stderr io.Writer, cmd, o string) (int, bool) {
	if o != "table" && o != "json" {
		return usageError(stderr, cmd, "-o must be table or json, got %q", o), false
	}
	return 0, true
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func lsMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("ls")
	dsnFlag := fs.String("dsn", "", "")
	output := outputFlag(fs)
	if code, ok := parseFlags(fs, args, lsUsage, stdout, stderr); !ok {
		return code
	}
	if code, ok := checkOutput(stderr, "ls", *output); !ok {
		return code
	}
	if fs.NArg() > 1 {
		return usageError(stderr, "ls", "at most one PREFIX, got %d arguments", fs.NArg())
	}
	l, dsn, code := openAdmin(stderr, "ls", *dsnFlag)
	if l == nil {
		return code
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	infos, err := dlock.List(ctx, l, fs.Arg(0))
	if err != nil {
		logTo(stderr, slog.LevelError, "dlock ls: ", err.Error())
		return adminExit(err)
	}
	d := &describer{l: l, dsn: dsn}
	views := d.group(ctx, infos)
	if *output == "json" {
		if views == nil {
			views = []view{}
		}
		writeJSON(stdout, views)
		return exitOK
	}
	rows := [][]string{{"KEY", "KIND", "HELD", "TOKEN", "LABEL", "OWNER", "EXPIRES", "WAITERS"}}
	for _, v := range views {
		row := []string{v.Key, v.Kind, heldText(v), "-", "-", "-", "-", waitersPtrText(v.Waiters)}
		if len(v.Holders) == 1 && v.Kind != kindSemaphore {
			h := v.Holders[0]
			row[3], row[4], row[5], row[6] = tokenText(h.Token), orDash(h.Label), orDash(h.Owner), expiresPtrText(h.Expires)
		}
		rows = append(rows, row)
		if len(v.Holders) > 1 || v.Kind == kindSemaphore {
			for _, h := range v.Holders {
				rows = append(rows, []string{"  " + h.Key, h.Role, "yes", tokenText(h.Token), orDash(h.Label), orDash(h.Owner), expiresPtrText(h.Expires), "-"})
			}
		}
	}
	writeTable(stdout, rows)
	return exitOK
}

func inspectMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("inspect")
	dsnFlag := fs.String("dsn", "", "")
	output := outputFlag(fs)
	if code, ok := parseFlags(fs, args, inspectUsage, stdout, stderr); !ok {
		return code
	}
	if code, ok := checkOutput(stderr, "inspect", *output); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return usageError(stderr, "inspect", "want one KEY, got %d arguments", fs.NArg())
	}
	l, dsn, code := openAdmin(stderr, "inspect", *dsnFlag)
	if l == nil {
		return code
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	d := &describer{l: l, dsn: dsn}
	v, err := d.inspect(ctx, fs.Arg(0))
	if err != nil {
		logTo(stderr, slog.LevelError, "dlock inspect: ", err.Error(), "key", fs.Arg(0))
		return adminExit(err)
	}
	if *output == "json" {
		writeJSON(stdout, v)
	} else {
		printView(stdout, v)
	}
	if !v.Held {
		return exitFailure
	}
	return exitOK
}

func breakMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("break")
	dsnFlag := fs.String("dsn", "", "")
	yes := fs.Bool("yes", false, "")
	if code, ok := parseFlags(fs, args, breakUsage, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return usageError(stderr, "break", "want one KEY, got %d arguments", fs.NArg())
	}
	key := fs.Arg(0)
	l, _, code := openAdmin(stderr, "break", *dsnFlag)
	if l == nil {
		return code
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	notHeld := func() int {
		logTo(stderr, slog.LevelError, "dlock break: ", fmt.Sprintf("%q is not held", key), "key", key)
		return exitFailure
	}
	if !*yes {
		info, err := dlock.Inspect(ctx, l, key)
		if err != nil && !errors.Is(err, errors.ErrUnsupported) {
			logTo(stderr, slog.LevelError, "dlock break: ", err.Error(), "key", key)
			return adminExit(err)
		}
		if err == nil && !info.Held {
			return notHeld()
		}
		prompt := fmt.Sprintf("Break the lock %q? Its holder may still be working. [y/N] ", key)
		if jsonLogs(stderr) {
			if err == nil {
				logTo(stderr, slog.LevelInfo, "", fmt.Sprintf("the lock %q is held", key), holderAttrs(info)...)
			}
			logTo(stderr, slog.LevelInfo, "", prompt, "key", key)
		} else {
			if err == nil {
				printInfo(stderr, info)
			}
			fmt.Fprint(stderr, prompt)
		}
		answer, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			logTo(stderr, slog.LevelInfo, "dlock break: ", "not broken", "key", key)
			return exitFailure
		}
	}
	info, err := dlock.Break(ctx, l, key)
	if errors.Is(err, dlock.ErrNotHeld) {
		return notHeld()
	}
	if err != nil {
		logTo(stderr, slog.LevelError, "dlock break: ", err.Error(), "key", key)
		return adminExit(err)
	}
	fmt.Fprintln(stdout, "broke:")
	printInfo(stdout, info)
	return exitOK
}

// holderAttrs returns the fields of a log record about info's holder.
func holderAttrs(info dlock.LockInfo) []any {
	return []any{"key", info.Key, "token", info.Token, "label", info.Label, "owner", info.Owner, "shared", info.Shared}
}

// openAdmin opens the DSN for an admin command; a nil Locker means exit with
// code.
func openAdmin(stderr io.Writer, cmd, dsnFlag string) (l dlock.Locker, dsn string, code int) {
	dsn, err := resolveDSN(dsnFlag)
	if err == nil {
		err = checkCrossProcess(dsn, nil) // a new process's in-process store is empty
	}
	if err != nil {
		return nil, "", usageError(stderr, cmd, "%v", err)
	}
	l, err = openLocker(context.Background(), dsn)
	if err != nil {
		logTo(stderr, slog.LevelError, "dlock "+cmd+": ", err.Error())
		return nil, "", exitFor(err)
	}
	return l, dsn, exitOK
}

// adminExit is the exit status for an error of Inspect, List or Break.
func adminExit(err error) int {
	if errors.Is(err, dlock.ErrInvalidKey) || errors.Is(err, dlock.ErrInvalidOption) {
		return exitUsage
	}
	return exitUnavailable
}

func printInfo(w io.Writer, info dlock.LockInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "key:\t%s\n", info.Key)
	if !info.Held {
		fmt.Fprintf(tw, "held:\tno\n")
	} else {
		if info.Shared > 0 {
			fmt.Fprintf(tw, "held:\tshared by %d (below: one of them)\n", info.Shared)
		} else {
			fmt.Fprintf(tw, "held:\tyes\n")
		}
		fmt.Fprintf(tw, "token:\t%d\n", info.Token)
		fmt.Fprintf(tw, "label:\t%s\n", orDash(info.Label))
		fmt.Fprintf(tw, "owner:\t%s\n", orDash(info.Owner))
		granted := "-"
		if !info.Granted.IsZero() {
			granted = info.Granted.Format(time.RFC3339Nano)
		}
		fmt.Fprintf(tw, "granted:\t%s\n", granted)
		fmt.Fprintf(tw, "expires:\t%s\n", expiresText(info.Expires))
	}
	fmt.Fprintf(tw, "waiters:\t%s\n", waitersText(info.Waiters))
	_ = tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func expiresText(t time.Time) string {
	if t.IsZero() {
		return "with its session"
	}
	return fmt.Sprintf("%s (in %v)", t.Format(time.RFC3339), time.Until(t).Round(time.Second))
}

func waitersText(n int) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func expiresPtrText(t *time.Time) string {
	if t == nil {
		return "with its session"
	}
	return expiresText(*t)
}

func waitersPtrText(n *int) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}

func tokenText(t uint64) string {
	if t == 0 {
		return "-"
	}
	return fmt.Sprint(t)
}

// heldText says how v is held, in a word or a few.
func heldText(v view) string {
	switch {
	case !v.Held:
		return "no"
	case v.Kind == kindSemaphore && v.Permits != nil:
		return fmt.Sprintf("%d of %d permits", *v.PermitsHeld, *v.Permits)
	case v.Kind == kindSemaphore:
		return fmt.Sprintf("%d of ? permits", *v.PermitsHeld)
	case v.Kind == kindRWLock && v.Mode == "read":
		if v.Readers == 1 {
			return "1 reader"
		}
		return fmt.Sprintf("%d readers", v.Readers)
	case v.Kind == kindRWLock:
		return "writer"
	}
	return "yes"
}

// holdersText names v's holders by label (else owner ID).
func holdersText(v view) string {
	names := make([]string, 0, len(v.Holders))
	for _, h := range v.Holders {
		switch {
		case h.Label != "":
			names = append(names, h.Label)
		case h.Owner != "":
			names = append(names, h.Owner)
		default:
			names = append(names, "(unlabelled)")
		}
	}
	return strings.Join(names, ", ")
}

// printView prints what dlock inspect shows of v.
func printView(w io.Writer, v view) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "key:\t%s\n", v.Key)
	one := func(h holder) {
		fmt.Fprintf(tw, "token:\t%s\n", tokenText(h.Token))
		fmt.Fprintf(tw, "label:\t%s\n", orDash(h.Label))
		fmt.Fprintf(tw, "owner:\t%s\n", orDash(h.Owner))
		granted := "-"
		if h.Granted != nil {
			granted = h.Granted.Format(time.RFC3339Nano)
		}
		fmt.Fprintf(tw, "granted:\t%s\n", granted)
		fmt.Fprintf(tw, "expires:\t%s\n", expiresPtrText(h.Expires))
	}
	switch {
	case v.Kind == kindSemaphore:
		fmt.Fprintf(tw, "kind:\tsemaphore\n")
		if v.Permits != nil {
			fmt.Fprintf(tw, "held:\t%d of %d permits held, by %s\n", *v.PermitsHeld, *v.Permits, holdersText(v))
		} else {
			fmt.Fprintf(tw, "held:\t%d permits held (of how many, the backend does not say), by %s\n", *v.PermitsHeld, holdersText(v))
		}
	case v.Kind == kindRWLock && v.Mode == "read":
		fmt.Fprintf(tw, "kind:\tread/write lock\n")
		fmt.Fprintf(tw, "held:\tfor reading, by %s\n", heldText(v))
		if len(v.Holders) == 1 {
			one(v.Holders[0])
		}
	case v.Kind == kindRWLock:
		fmt.Fprintf(tw, "kind:\tread/write lock\n")
		fmt.Fprintf(tw, "held:\tfor writing, by the writer %s\n", holdersText(v))
		one(v.Holders[0])
	case !v.Held:
		fmt.Fprintf(tw, "held:\tno\n")
	default:
		fmt.Fprintf(tw, "held:\tyes\n")
		one(v.Holders[0])
	}
	fmt.Fprintf(tw, "waiters:\t%s\n", waitersPtrText(v.Waiters))
	for _, n := range v.Notes {
		fmt.Fprintf(tw, "note:\t%s\n", n)
	}
	_ = tw.Flush()
	if len(v.Holders) > 1 || v.Kind == kindSemaphore {
		fmt.Fprintln(w)
		rows := [][]string{{"SLOT", "TOKEN", "LABEL", "OWNER", "EXPIRES"}}
		for _, h := range v.Holders {
			rows = append(rows, []string{h.Key, tokenText(h.Token), orDash(h.Label), orDash(h.Owner), expiresPtrText(h.Expires)})
		}
		writeTable(w, rows)
	}
}
