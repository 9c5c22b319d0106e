// Package dlockcron wraps robfig/cron (github.com/robfig/cron/v3) jobs so that
// each run is made once across every process that schedules them on a shared
// backend, with package schedule's record of the run. docs/schedule.md has
// the guarantees.
package dlockcron

import (
	"context"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule"
)

// Job is a cron.Job that makes each activation of its schedule one run of a
// schedule.Job across the fleet.
type Job struct {
	locker dlock.Locker
	job    schedule.Job
	sched  cron.Schedule
	fn     schedule.Func
	report func(at time.Time, r schedule.Result, err error)
}

var _ cron.Job = (*Job)(nil)

// NewJob returns a cron.Job that, each time cron runs it, calls
// schedule.Run for job on l with the run's scheduled time: the latest
// activation of sched not after the local clock's now, the same on every
// process whose clock is off by less than the time between two activations.
// sched must be the schedule the job is added with (cron.Cron.Schedule),
// and one whose activations are the same on every process: a cron
// expression (cron.ParseStandard), not "@every", whose activations count
// from each process's start. report, if not nil, is called after each run
// with its scheduled time, Result and error.
func NewJob(l dlock.Locker, job schedule.Job, sched cron.Schedule, fn schedule.Func, report func(at time.Time, r schedule.Result, err error)) (*Job, error) {
	if l == nil || sched == nil || fn == nil {
		return nil, fmt.Errorf("dlockcron: %w: a Locker, a schedule and a function are required", schedule.ErrInvalidJob)
	}
	if err := job.Validate(); err != nil {
		return nil, fmt.Errorf("dlockcron: %w", err)
	}
	return &Job{locker: l, job: job, sched: sched, fn: fn, report: report}, nil
}

// Add adds fn to c on the cron expression spec (cron.ParseStandard's
// syntax) as a Job made once per activation across the fleet (see NewJob).
func Add(c *cron.Cron, spec string, l dlock.Locker, job schedule.Job, fn schedule.Func, report func(at time.Time, r schedule.Result, err error)) (cron.EntryID, error) {
	sched, err := cron.ParseStandard(spec)
	if err != nil {
		return 0, fmt.Errorf("dlockcron: %w: %w", schedule.ErrInvalidJob, err)
	}
	j, err := NewJob(l, job, sched, fn, report)
	if err != nil {
		return 0, err
	}
	return c.Schedule(sched, j), nil
}

// Run implements cron.Job: it makes the run due now, unless another process
// made it or is making it.
func (j *Job) Run() {
	at := latest(j.sched, time.Now())
	r, err := schedule.Run(context.Background(), j.locker, j.job, at, j.fn)
	if j.report != nil {
		j.report(at, r, err)
	}
}

// latest returns the latest activation of sched not after now (now itself
// if none is found within a year).
func latest(sched cron.Schedule, now time.Time) time.Time {
	for back := time.Second; back <= 366*24*time.Hour; back *= 2 {
		t := sched.Next(now.Add(-back))
		if t.IsZero() || t.After(now) {
			continue
		}
		for {
			n := sched.Next(t)
			if n.IsZero() || n.After(now) {
				return t
			}
			t = n
		}
	}
	return now
}
