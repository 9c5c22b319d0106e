package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule"
)

// onceBackends names the backends that keep a run's record, for the message
// that refuses the others.
const onceBackends = "redis://, etcd://, pgtable:// or mysqltable://"

// runAtText formats the scheduled time of a run, as $DLOCK_RUN has it.
func runAtText(at time.Time) string { return at.UTC().Format(time.RFC3339Nano) }

// onceJob is the schedule.Job of dlock run --once-per: KEY is its name,
// --at-most (default: the period) its lease's TTL, --wait how long to wait
// for another run holding it. The record is kept for a day, or two periods
// if longer, so that an invocation up to a period late still finds it.
func (o *runOptions) onceJob() schedule.Job {
	atMost := o.atMost
	if atMost == 0 {
		atMost = o.oncePer
	}
	return schedule.Job{
		Name:        o.key,
		AtMost:      atMost,
		AtLeast:     o.atLeast,
		Retention:   max(schedule.DefaultRetention, 2*o.oncePer, atMost),
		RetryWithin: o.wait,
	}
}

// claimRun claims the current period's run of the job KEY (package
// schedule): the run named by the time now truncated to the period. It
// returns the run's lease if this invocation is to run the command; else a
// nil lease and the exit status, having said why (a run already made
// elsewhere is reported only with -v, so that cron mails nothing).
func (o *runOptions) claimRun(ctx context.Context, locker dlock.Locker, logf func(string, ...any)) (*dlock.Lease, int) {
	o.runAt = time.Now().Truncate(o.oncePer)
	c, r, err := schedule.Begin(ctx, locker, o.onceJob(), o.runAt)
	if c != nil {
		o.claim = c
		if o.verbose {
			logf("claimed %s with token %d", o.what(), c.Lease().Token())
		}
		return c.Lease(), exitOK
	}
	if sig, ok := interrupted(ctx); ok {
		logf("interrupted by %s while claiming %s", signalName(sig), o.what())
		return nil, exitSignal + signalNumber(sig)
	}
	switch {
	case err == nil && r.Status == schedule.Done:
		if o.verbose {
			logf("%s was already made by another invocation (token %d): not running the command", o.what(), r.Token)
		}
		return nil, exitDone
	case err == nil && r.Status == schedule.InProgress:
		holder := ""
		if r.Holder != "" {
			holder = fmt.Sprintf(" (%s)", r.Holder)
		}
		job := o.onceJob()
		waited := cmp.Or(job.RetryWithin, job.AtMost)
		logf("not running %s: the job %q is still held by another run%s after waiting %v", o.what(), o.key, holder, waited)
		return nil, o.busyExit
	case errors.Is(err, dlock.ErrLeaseLost):
		logf("not running %s: the job's lease was lost before the run was recorded %s; another invocation may be making it", o.what(), causeText(err))
		return nil, o.busyExit
	case errors.Is(err, errors.ErrUnsupported):
		backend := "this backend"
		var de *dlock.Error
		if errors.As(err, &de) && de.Backend != "" {
			backend = de.Backend
		}
		hint := ""
		switch backend {
		case "postgres":
			hint = " (pgtable:// keeps it in a table of the same database)"
		case "mysql":
			hint = " (mysqltable:// keeps it in a table of the same database)"
		}
		logf("--once-per needs a backend that keeps a run's record after dlock exits, and %s cannot "+
			"(its locks live with the client's session, or it cannot leave a lock to expire on its own): use %s%s",
			backend, onceBackends, hint)
		if o.verbose {
			logf("%s", errText(err))
		}
		return nil, exitUsage
	}
	logf("cannot claim %s %s", o.what(), causeText(err))
	return nil, exitFor(err)
}

// checkOnce checks the flags of dlock run --once-per (set holds the flags
// given). ok is false when the caller should exit with code, a usage error.
func (o *runOptions) checkOnce(set map[string]bool, stderr io.Writer) (code int, ok bool) {
	bad := func(format string, args ...any) (int, bool) { return usageError(stderr, o.cmd, format, args...), false }
	if !set["once-per"] {
		if set["at-least"] || set["at-most"] {
			return bad("--at-least and --at-most need --once-per: they are the holds of a run made once per period")
		}
		return 0, true
	}
	for _, f := range []string{"shared", "permits", "no-wait", "ttl"} {
		if set[f] {
			return bad("--once-per excludes --%s: a run holds the job KEY for --at-most, unrenewed", f)
		}
	}
	switch {
	case o.oncePer <= 0:
		return bad("--once-per must be a positive duration such as 5m, got %v", o.oncePer)
	case set["at-most"] && o.atMost <= 0:
		return bad("--at-most must be a positive duration such as 10m, got %v", o.atMost)
	case set["at-least"] && o.atLeast <= 0:
		return bad("--at-least must be a positive duration such as 30s, got %v", o.atLeast)
	case set["at-most"] && o.atLeast > o.atMost:
		return bad("--at-least (%v) exceeds --at-most (%v)", o.atLeast, o.atMost)
	case !set["at-most"] && o.atLeast > o.oncePer:
		return bad("--at-least (%v) exceeds --at-most (default: the period, %v)", o.atLeast, o.oncePer)
	}
	if err := o.onceJob().Validate(); err != nil {
		return bad("%v", err)
	}
	return 0, true
}
