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

// TestRead checks that Read's two readings are of one moment: the clock's
// reading lies between System readings taken just before and just after,
// and the time.Time between time.Now readings.
func TestRead(t *testing.T) {
	const n, preemptions = 1000, 10 // a reading preempted between its calls may be off
	off1ms := 0
	for range n {
		b, bt := System.Now(), time.Now()
		wall, now := Read(System)
		a, at := System.Now(), time.Now()
		if now < b || now > a {
			t.Fatalf("Read: clock %v, not within [%v, %v]", now, b, a)
		}
		if wall.Before(bt) || wall.After(at) {
			t.Fatalf("Read: time %v, not within [%v, %v]", wall, bt, at)
		}
		// One moment: the two readings differ by the clock's offset to the
		// monotonic clock since origin, as a and at do (read apart by the
		// time between two calls, longer when preempted on a busy machine).
		off, ref := now-wall.Sub(origin), a-at.Sub(origin)
		if d := off - ref; d < -time.Millisecond || d > time.Millisecond {
			if off1ms++; off1ms > preemptions {
				t.Fatalf("Read: offset %v, want %v (±1ms), the %dth reading of %d so far off", off, ref, off1ms, n)
			}
		}
	}
}
