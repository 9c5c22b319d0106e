package clock

import (
	"runtime"
	"testing"
	"time"
)

func TestSystemIsBoottimeOnLinux(t *testing.T) {
	if runtime.GOOS == "linux" && !SuspendAware() {
		t.Fatal("CLOCK_BOOTTIME not readable on Linux; leases would not count a suspend")
	}
}

func TestSystemAdvancesWithMonotonic(t *testing.T) {
	a, m := System.Now(), time.Now()
	time.Sleep(20 * time.Millisecond)
	b, el := System.Now(), time.Since(m)
	if d := b - a; d < el-time.Millisecond || d > el+50*time.Millisecond {
		t.Fatalf("System advanced %v while the monotonic clock advanced %v", d, el)
	}
}

type fake struct{ at time.Duration }

func (f *fake) Now() time.Duration { return f.at }

func TestOffsetMapsTimesOntoTheClock(t *testing.T) {
	f := &fake{at: time.Hour}
	now := time.Now()
	conv := Offset(f)
	if got := conv(now.Add(-2 * time.Second)); got > time.Hour-2*time.Second || got < time.Hour-3*time.Second {
		t.Fatalf("2s before now mapped to %v, want about 1h-2s", got)
	}
	// A suspend after the conversion function was made does not move earlier
	// times: they stay where they were read.
	f.at += 10 * time.Minute
	if got := conv(now); got > time.Hour+time.Second {
		t.Fatalf("a time read before the suspend mapped to %v, after it", got)
	}
}
