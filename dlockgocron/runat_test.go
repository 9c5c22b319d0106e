package dlockgocron

import (
	"testing"
	"time"
)

// TestRunAtCountsFromTheUnixEpoch: Lock names a run by the multiple of the
// period counted from the Unix epoch, the runs schedule.Every makes, also
// for periods that do not divide the time from year 1 to 1970.
func TestRunAtCountsFromTheUnixEpoch(t *testing.T) {
	for _, period := range []time.Duration{time.Minute, 7 * time.Minute, 7 * 24 * time.Hour, 1500 * time.Millisecond} {
		epoch := time.Unix(0, 0)
		due := epoch.Add(time.Duration(56*365*24*time.Hour/period) * period) // in 2025

		for _, off := range []time.Duration{-period/2 + 1, -time.Nanosecond, 0, time.Millisecond, period/2 - 1} {
			got := runAt(due.Add(off), period)
			if !got.Equal(due) {
				t.Errorf("period %v, %v off the run at %v: named the run at %v", period, off, due.UTC(), got.UTC())
			}
		}
	}
}
