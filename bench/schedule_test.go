package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/memlock" // mem://
	"github.com/dlock-go/dlock/schedule"
	_ "github.com/dlock-go/dlock/sqltable" // pgtable://
)

// scheduleCall is one of BenchmarkSchedule's calls on one Locker: each call
// makes a new run, or uses a new key, so that every one does the whole
// work (Ran) and none finds a record.
type scheduleCall struct {
	name string
	call func(ctx context.Context) error
}

// scheduleBenches are BenchmarkSchedule's backends, those that can keep
// schedule's record: each starts its server and returns a DSN.
var scheduleBenches = []struct {
	name string
	dsn  func(tb testing.TB) string
}{
	{"redis", func(tb testing.TB) string { return testenv.StartRedis(tb).URL() }},
	{"pgtable", func(tb testing.TB) string {
		// Durable commits, as pgtable:// requires and a production server has.
		srv := testenv.StartPostgres(tb, testenv.WithPostgresSetting("fsync", "on"), testenv.WithPostgresSetting("synchronous_commit", "on"))
		return pgtableDSN(srv.URL())
	}},
	{"etcd", func(tb testing.TB) string { return testenv.StartEtcd(tb).URL() + "/bench-schedule" }},
	{"memlock", func(testing.TB) string { return memDSN() }},
}

// pgtableDSN turns a postgres:// URL into a pgtable:// DSN.
func pgtableDSN(url string) string { return "pgtable" + strings.TrimPrefix(url, "postgres") }

// memDSN returns the DSN of a new memlock store.
func memDSN() string { return "mem://bench-schedule-" + strconv.FormatInt(keySeq.Add(1), 10) }

// BenchmarkSchedule measures what package schedule adds to a lock cycle: on
// each backend that can keep its record, from one Locker, a bare cycle
// (TryAcquire + Release of a new key, "bare"), schedule.Run of a new run in
// Mode NotRepeated ("notrepeated") and in Mode RetryLost ("retrylost"), and
// schedule.Once of a new key ("once"), each running a job that does
// nothing, interleaved round by round in a shuffled order (see
// inShuffledRounds). It reports each one's mean ns/op and its ratio to the
// bare cycle.
func BenchmarkSchedule(b *testing.B) {
	for _, sb := range scheduleBenches {
		b.Run(sb.name, func(b *testing.B) {
			calls := scheduleCalls(openDlock(b, sb.dsn(b), benchTTL))
			reportScheduleCalls(b, runScheduleCalls(b, calls, b.N))
		})
	}
}

// scheduleCalls returns the calls BenchmarkSchedule compares on l, the bare
// cycle first.
func scheduleCalls(l dlock.Locker) []scheduleCall {
	nop := func(context.Context, *dlock.Lease) error { return nil }
	ran := func(what string, r schedule.Result, err error) error {
		if err == nil && r.Status != schedule.Ran {
			err = fmt.Errorf("%s: %v, want ran", what, r.Status)
		}
		return err
	}
	// A run of its own job per call site, a new scheduled time per call.
	run := func(mode schedule.Mode, tag string) func(context.Context) error {
		job := schedule.Job{Name: uniqueKey("schedule", tag), AtMost: benchTTL, Mode: mode}
		at, n := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), 0
		return func(ctx context.Context) error {
			n++
			r, err := schedule.Run(ctx, l, job, at.Add(time.Duration(n)*time.Second), nop)
			return ran("run "+tag, r, err)
		}
	}
	bareKey, onceKey := uniqueKey("schedule", "bare"), uniqueKey("schedule", "once")
	bareN, onceN := 0, 0
	return []scheduleCall{
		{name: "bare", call: func(ctx context.Context) error {
			bareN++
			lease, err := l.TryAcquire(ctx, bareKey+"/"+strconv.Itoa(bareN))
			if err != nil {
				return err
			}
			return lease.Release(ctx)
		}},
		{name: "notrepeated", call: run(schedule.NotRepeated, "notrepeated")},
		{name: "retrylost", call: run(schedule.RetryLost, "retrylost")},
		{name: "once", call: func(ctx context.Context) error {
			onceN++
			r, err := schedule.Once(ctx, l, onceKey+"/"+strconv.Itoa(onceN), nop)
			return ran("once", r, err)
		}},
	}
}

// scheduleResult is the total time of n calls of each of calls.
type scheduleResult struct {
	n      int
	names  []string
	totals []time.Duration
}

// runScheduleCalls makes n calls of each of calls, in n rounds of one each in
// a shuffled order, after one warm-up call of each; a failed call fails tb.
func runScheduleCalls(tb testing.TB, calls []scheduleCall, n int) scheduleResult {
	ctx := context.Background()
	res := scheduleResult{n: n, names: make([]string, len(calls)), totals: make([]time.Duration, len(calls))}
	for i, c := range calls {
		res.names[i] = c.name
		if err := c.call(ctx); err != nil {
			tb.Fatalf("%s: warm-up: %v", c.name, err)
		}
	}
	resetTimer(tb)
	inShuffledRounds(len(calls), n, func(i int) {
		start := time.Now()
		if err := calls[i].call(ctx); err != nil {
			tb.Fatalf("%s: %v", calls[i].name, err)
		}
		res.totals[i] += time.Since(start)
	})
	stopTimer(tb)
	return res
}

// reportScheduleCalls reports each call's mean ns/op and, after the first
// (the bare cycle), its ratio to the first.
func reportScheduleCalls(tb testing.TB, r scheduleResult) {
	for i, name := range r.names {
		report(tb, float64(r.totals[i].Nanoseconds())/float64(r.n), name+".ns/op")
		if i > 0 {
			report(tb, float64(r.totals[i])/float64(r.totals[0]), name+"/"+r.names[0])
		}
	}
}
