// dlock ls, dlock inspect and dlock break: who holds what, and breaking a
// stuck lock.

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock"
)

const lsUsage = `Usage: dlock ls [--dsn DSN] [PREFIX]

Lists the locks held on the backend whose keys start with PREFIX (all if
none), one line each: key, fencing token, holder's label, owner ID, when the
server expires the lock unless renewed, and how many clients wait for it
("-" where the backend cannot tell).

Exit statuses: 0 listed (even if nothing is held); 64 usage error; 69 the
backend is unreachable.
`

const inspectUsage = `Usage: dlock inspect [--dsn DSN] KEY

Shows the state of the lock KEY: held or not; if held, its fencing token, the
holder's label (by default host:pid) and owner ID, when it was granted and
when the server expires it unless renewed, where the backend records them;
and how many clients wait for it.

Exit statuses: 0 held; 1 not held; 64 usage error; 69 the backend is
unreachable or cannot report its locks.
`

const breakUsage = `Usage: dlock break [--dsn DSN] [--yes] KEY

Force-releases the lock KEY, whoever holds it, and prints what it broke. It
shows the holder and asks for confirmation first, unless --yes.

The broken holder learns it at its next renewal at the latest (at once on
backends that report loss), and the next holder's fencing token is higher, so
a resource that checks tokens rejects the broken holder's writes. A holder
that does not watch its lease may go on working: break only a holder you know
to be stuck. On PostgreSQL, breaking ends the holder's session, and with it
every lock that session holds (dlock's leases of one TTL share a session).

Exit statuses: 0 broken; 1 not held, or not confirmed; 64 usage error; 69 the
backend is unreachable or cannot break locks.
`

// stdin is where dlock break reads its confirmation (a variable for tests).
var stdin io.Reader = os.Stdin

// adminTimeout bounds the requests of ls, inspect and break.
const adminTimeout = 30 * time.Second

func lsMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("ls")
	dsnFlag := fs.String("dsn", "", "")
	if code, ok := parseFlags(fs, args, lsUsage, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 1 {
		return usageError(stderr, "ls", "at most one PREFIX, got %d arguments", fs.NArg())
	}
	l, code := openAdmin(stderr, "ls", *dsnFlag)
	if l == nil {
		return code
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	infos, err := dlock.List(ctx, l, fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "dlock ls: %v\n", err)
		return adminExit(err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tTOKEN\tLABEL\tOWNER\tEXPIRES\tWAITERS")
	for _, info := range infos {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", info.Key, info.Token, orDash(info.Label), orDash(info.Owner),
			expiresText(info.Expires), waitersText(info.Waiters))
	}
	_ = tw.Flush()
	return exitOK
}

func inspectMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("inspect")
	dsnFlag := fs.String("dsn", "", "")
	if code, ok := parseFlags(fs, args, inspectUsage, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return usageError(stderr, "inspect", "want one KEY, got %d arguments", fs.NArg())
	}
	l, code := openAdmin(stderr, "inspect", *dsnFlag)
	if l == nil {
		return code
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	info, err := dlock.Inspect(ctx, l, fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "dlock inspect: %v\n", err)
		return adminExit(err)
	}
	printInfo(stdout, info)
	if !info.Held {
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
	l, code := openAdmin(stderr, "break", *dsnFlag)
	if l == nil {
		return code
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if !*yes {
		info, err := dlock.Inspect(ctx, l, key)
		if err != nil && !errors.Is(err, errors.ErrUnsupported) {
			fmt.Fprintf(stderr, "dlock break: %v\n", err)
			return adminExit(err)
		}
		if err == nil && !info.Held {
			fmt.Fprintf(stderr, "dlock break: %q is not held\n", key)
			return exitFailure
		}
		if err == nil {
			printInfo(stderr, info)
		}
		fmt.Fprintf(stderr, "Break the lock %q? Its holder may still be working. [y/N] ", key)
		answer, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			fmt.Fprintln(stderr, "dlock break: not broken")
			return exitFailure
		}
	}
	info, err := dlock.Break(ctx, l, key)
	if errors.Is(err, dlock.ErrNotHeld) {
		fmt.Fprintf(stderr, "dlock break: %q is not held\n", key)
		return exitFailure
	}
	if err != nil {
		fmt.Fprintf(stderr, "dlock break: %v\n", err)
		return adminExit(err)
	}
	fmt.Fprintln(stdout, "broke:")
	printInfo(stdout, info)
	return exitOK
}

// openAdmin opens the DSN for an admin command; a nil Locker means exit with
// code.
func openAdmin(stderr io.Writer, cmd, dsnFlag string) (dlock.Locker, int) {
	dsn, err := resolveDSN(dsnFlag)
	if err != nil {
		return nil, usageError(stderr, cmd, "%v", err)
	}
	l, err := openLocker(context.Background(), dsn)
	if err != nil {
		fmt.Fprintf(stderr, "dlock %s: %v\n", cmd, err)
		return nil, exitFor(err)
	}
	return l, exitOK
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
