package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/schedule"
	"github.com/dlock-go/dlock/schedule/internal/hook"
)

// TestEveryCountsFromTheUnixEpoch: with a period that does not divide the
// time from year 1 to 1970 (7 minutes), Every's run is at a multiple of the
// period counted from the Unix epoch. The clock Every reads starts 20 ms
// before such a multiple.
func TestEveryCountsFromTheUnixEpoch(t *testing.T) {
	const period = 7 * time.Minute
	epoch := time.Unix(0, 0)
	want := epoch.Add((time.Since(epoch)/period + 1) * period)
	var start time.Time // the clock's first reading: want - 20ms
	clock := func() time.Time {
		if start.IsZero() {
			start = time.Now()
		}
		return want.Add(-20 * time.Millisecond).Add(time.Since(start))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = context.WithValue(ctx, hook.ClockKey{}, clock)
	l, err := dlock.Open(ctx, "mem://"+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var got time.Time
	err = schedule.Every(ctx, l, schedule.Job{Name: "epoch", AtMost: 5 * time.Second}, period,
		func(context.Context, *dlock.Lease) error { return nil },
		func(at time.Time, _ schedule.Result, err error) {
			if err != nil {
				t.Errorf("the run at %v: %v", at, err)
			}
			got = at
			cancel()
		})
	if got.IsZero() {
		t.Fatalf("Every made no run in 5s (%v); want one at %v, 20ms after the clock it read, a multiple of %v since the Unix epoch",
			err, want.UTC(), period)
	}
	if !got.Equal(want) || got.Unix()%int64(period/time.Second) != 0 {
		t.Fatalf("Every's run is at %v; want %v, a multiple of %v since the Unix epoch", got.UTC(), want.UTC(), period)
	}
}

// TestEveryCallsAgainARunTheJobKeptWaiting: while the job's lease is held
// by another run for three times RetryWithin, the first run due reports
// InProgress; Every calls it again, not the next one, and once the lease
// is free it makes every run from that first one on, none skipped.
func TestEveryCallsAgainARunTheJobKeptWaiting(t *testing.T) {
	const (
		period = 40 * time.Millisecond
		within = 60 * time.Millisecond
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := dlock.Open(ctx, "mem://"+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	blocker, err := l.Acquire(ctx, "schedule/job/kept", dlock.WithLabel("another run=19700101T000000.000000000Z"))
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(3*within, func() { _ = blocker.Release(context.Background()) })

	var (
		first time.Time
		ran   []time.Time
		busy  int
	)
	err = schedule.Every(ctx, l, schedule.Job{Name: "kept", AtMost: time.Second, RetryWithin: within, Retention: time.Minute}, period,
		func(fctx context.Context, _ *dlock.Lease) error {
			at, _ := schedule.ScheduledAt(fctx)
			ran = append(ran, at)
			return nil
		},
		func(at time.Time, r schedule.Result, err error) {
			if err != nil {
				t.Errorf("the run at %v: %v", at, err)
			}
			if first.IsZero() {
				first = at
			}
			if r.Status == schedule.InProgress {
				busy++
				if !at.Equal(first) {
					t.Errorf("InProgress for the run at %v, after the first (%v): Every moved on", at.Format("15:04:05.000"), first.Format("15:04:05.000"))
				}
			}
			if len(ran) >= 5 {
				cancel()
			}
		})
	if len(ran) < 5 {
		t.Fatalf("Every made %d runs (%v); want 5", len(ran), err)
	}
	if busy < 2 {
		t.Fatalf("the first run was reported InProgress %d times; want at least 2 (the lease was held for 3×RetryWithin)", busy)
	}
	for i, at := range ran {
		if want := first.Add(time.Duration(i) * period); !at.Equal(want) {
			t.Fatalf("run %d is at %v, want %v: runs skipped while the job was busy (made: %v)", i, at.Format("15:04:05.000"), want.Format("15:04:05.000"), ran)
		}
	}
}
