package schedule

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule/internal/hook"
)

// nowIn returns the time on the clock ctx carries: time.Now unless a test
// set another.
func nowIn(ctx context.Context) time.Time {
	if f, ok := ctx.Value(hook.ClockKey{}).(func() time.Time); ok {
		return f()
	}
	return time.Now()
}

// unixEpoch is where Every counts its periods from.
var unixEpoch = time.Unix(0, 0)

// Every calls Run for job at every multiple of period counted from the Unix
// epoch (1970-01-01 00:00 UTC; a period of a week runs on Thursdays at 00:00
// UTC), by the local clock, with that multiple as the run's scheduled time,
// until ctx ends; then it returns ctx's cause. It makes one call at a time:
// a call that outlasts the period (a long run, a wait for the job) delays the
// next ones, and Every then calls Run for every multiple it passed, up to
// the job's Retention back, so that a run due while every node was busy is
// still made (the others return Done at the cost of one read). A run that
// Run reports InProgress because the job's lease stayed held all through
// RetryWithin (by other runs, on a busy or slow backend, or by this run on
// a node that may die) is called again before the next, while it is less
// than Retention old: a run is not skipped because every node waited for
// the job at once. One stopped by an earlier run's AtLeast hold is not
// called again. report, if not nil, is called after each call with the
// run's scheduled time, Result and error. A period ≤ 0 is an error matching
// ErrInvalidJob.
func Every(ctx context.Context, l dlock.Locker, job Job, period time.Duration, fn Func, report func(at time.Time, r Result, err error)) error {
	if period <= 0 {
		return errorf("every", job.Name, fmt.Errorf("%w: period must be > 0, got %v", ErrInvalidJob, period))
	}
	checked, err := job.check()
	if err != nil {
		return errorf("every", job.Name, err)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	var last time.Time
	again := false // the run at last is to be called again
	for {
		now := nowIn(ctx)
		at := unixEpoch.Add(now.Sub(unixEpoch).Truncate(period) + period).In(now.Location())
		switch next := last.Add(period); {
		case again:
			at = last
		case !last.IsZero() && now.Sub(next) < checked.Retention:
			at = next // catch up on the runs due while this node was busy
		}
		last = at
		timer.Reset(max(at.Sub(now), 0))
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-timer.C:
		}
		r, busy, err := run(ctx, l, job, at, fn)
		if report != nil {
			report(at, r, err)
		}
		again = busy && nowIn(ctx).Sub(at) < checked.Retention
	}
}
