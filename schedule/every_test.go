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
