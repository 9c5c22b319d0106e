// dlock elect and dlock leader: run a command only while leading an
// election, and show who leads (package election).

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock/election"
)

const electUsage = `Usage: dlock elect [flags] NAME -- COMMAND [ARG...]

Campaigns in the election NAME and runs COMMAND only while leading: dlock
waits until this candidate leads, publishes --value as the leader's value
(what 'dlock leader NAME' and other candidates read), starts COMMAND with the
term's fencing token in $DLOCK_TOKEN, the election in $DLOCK_KEY and the value
in $DLOCK_VALUE, renews the term while COMMAND runs, and resigns when COMMAND
exits. Run it again (a loop, a service manager) to campaign again.

The election is a lock whose label is the leader's value (package election);
on etcd its layout is concurrency.Election's, so 'etcdctl elect' and Go
programs using concurrency.Election take part in the same election.

If leadership is lost while COMMAND runs, dlock stops COMMAND as dlock run
does (SIGTERM, SIGKILL after --grace) and exits 76. Pass $DLOCK_TOKEN with
every write: a deposed leader that has not noticed yet is rejected by a
resource that checks tokens.

Flags:
  --dsn DSN      the backend (default $DLOCK_DSN)
  --value V      the value this candidate publishes while leading (default
                 host:pid); at most 128 bytes of printable UTF-8
  --ttl D        how long the backend keeps leadership if dlock dies
                 (default: the DSN's ttl parameter, else 15s)
  --wait D       give up after campaigning for D (default: as long as it takes)
  --no-wait      give up at once if another candidate leads
  --grace D      after leadership is lost, the time from SIGTERM to SIGKILL
                 (default 10s)
  -v, --verbose  report the token, the term's start and end
  --log-format F text (default) or json
` + allowMemUsage + `

Exit statuses: those of dlock run (see dlock help run): COMMAND's own; 64
usage; 69 backend unavailable; 75 another candidate leads (--no-wait, or
--wait ran out); 76 leadership lost while COMMAND ran; 126, 127 COMMAND could
not be started or found.

Examples:
  dlock elect --value "$(hostname):8080" scheduler -- ./scheduler
  until dlock elect compactor -- ./compact --fence "$DLOCK_TOKEN"; do sleep 1; done
`

const leaderUsage = `Usage: dlock leader [--dsn DSN] [-o table|json] [--watch] [--interval D] NAME

Shows who leads the election NAME: the leader's value, its term's fencing
token and when the server ends the term unless renewed. With --watch, prints
a line each time the leader changes (reading every --interval, default 1s)
until interrupted.

With -o json, it prints one JSON object (with --watch, one per line, each
with the time of the change):
  election  NAME
  led       true if someone leads
  value     the leader's value ("" if nobody leads)
  token     the term's fencing token (0 if nobody leads, or the backend
            cannot tell)
  expires   when the server ends the term unless renewed; null if nobody
            leads, or the term lasts as long as the leader's session
  time      --watch only: when the change was seen

Flags:
  --dsn DSN        the backend (default $DLOCK_DSN)
  -o, --output F   table (default) or json
  --watch          follow the changes until interrupted
  --interval D     with --watch, how often to read (default 1s)
  --log-format F   text (default) or json (see dlock help logging)

Exit statuses: 0 someone leads (with --watch: interrupted); 1 nobody leads;
64 usage error; 69 the backend is unreachable or cannot report its locks.
`

func electMain(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseRunArgs("elect", args, stdout, stderr)
	if !ok {
		return code
	}
	if o.verbose {
		logLevel.Set(slog.LevelDebug)
	}
	return o.run(stderr)
}

func leaderMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("leader")
	dsnFlag := fs.String("dsn", "", "")
	watch := fs.Bool("watch", false, "")
	every := fs.Duration("interval", election.DefaultObserveInterval, "")
	output := outputFlag(fs)
	if code, ok := parseFlags(fs, args, leaderUsage, stdout, stderr); !ok {
		return code
	}
	if code, ok := checkOutput(stderr, "leader", *output); !ok {
		return code
	}
	switch {
	case fs.NArg() != 1:
		return usageError(stderr, "leader", "want one NAME, got %d arguments", fs.NArg())
	case *every <= 0:
		return usageError(stderr, "leader", "--interval must be a positive duration such as 1s")
	}
	name := fs.Arg(0)
	l, _, code := openAdmin(stderr, "leader", *dsnFlag)
	if l == nil {
		return code
	}
	defer l.Close()
	if !*watch {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		in, err := election.Leader(ctx, l, name)
		if err != nil {
			logTo(stderr, slog.LevelError, "dlock leader: ", err.Error(), "key", name)
			return adminExit(err)
		}
		if *output == "json" {
			writeJSON(stdout, leaderJSON(in, nil))
		} else {
			printLeader(stdout, in)
		}
		if !in.Led {
			return exitFailure
		}
		return exitOK
	}
	ctx, stop := signal.NotifyContext(context.Background(), forwardSignals...)
	defer stop()
	// The first read reports a backend that cannot tell who leads.
	if _, err := election.Leader(ctx, l, name); err != nil {
		logTo(stderr, slog.LevelError, "dlock leader: ", err.Error(), "key", name)
		return adminExit(err)
	}
	seen, err := election.Observe(ctx, l, name, election.WithInterval(*every))
	if err != nil {
		return usageError(stderr, "leader", "%v", err)
	}
	enc := json.NewEncoder(stdout)
	for in := range seen {
		now := time.Now()
		switch {
		case *output == "json":
			_ = enc.Encode(leaderJSON(in, &now))
		case in.Led:
			fmt.Fprintf(stdout, "%s\tleader %s\ttoken %d\n", now.Format(time.RFC3339), in.Value, in.Token)
		default:
			fmt.Fprintf(stdout, "%s\tno leader\n", now.Format(time.RFC3339))
		}
	}
	return exitOK
}

func printLeader(w io.Writer, in election.Info) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "election:\t%s\n", in.Name)
	if !in.Led {
		fmt.Fprintf(tw, "leader:\tnone\n")
	} else {
		fmt.Fprintf(tw, "leader:\t%s\n", orDash(in.Value))
		fmt.Fprintf(tw, "token:\t%d\n", in.Token)
		fmt.Fprintf(tw, "expires:\t%s\n", expiresText(in.Expires))
	}
	_ = tw.Flush()
}

// leaderView is dlock leader's JSON (see leaderUsage).
type leaderView struct {
	Election string     `json:"election"`
	Led      bool       `json:"led"`
	Value    string     `json:"value"`
	Token    uint64     `json:"token"`
	Expires  *time.Time `json:"expires"`
	Time     *time.Time `json:"time,omitempty"`
}

// leaderJSON returns the JSON of in, seen at the time seen (nil but with
// --watch).
func leaderJSON(in election.Info, seen *time.Time) leaderView {
	v := leaderView{Election: in.Name, Led: in.Led, Value: in.Value, Token: uint64(in.Token), Time: seen}
	if in.Led && !in.Expires.IsZero() {
		t := in.Expires.UTC()
		v.Expires = &t
	}
	if seen != nil {
		t := seen.UTC()
		v.Time = &t
	}
	return v
}
