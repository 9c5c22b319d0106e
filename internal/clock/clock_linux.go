package clock

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// system reads CLOCK_BOOTTIME without a system call per reading. Go offers no
// vDSO path for it (unix.ClockGettime is a real system call, about a
// microsecond on a VM, several per acquire and release), so it reads
// CLOCK_BOOTTIME as the monotonic clock plus the time spent suspended, which
// it learns with the system call only when that may have changed: the kernel
// adds a suspend to CLOCK_REALTIME as it adds it to CLOCK_BOOTTIME, so while
// the wall clock keeps pace with the monotonic one (both read by time.Now
// through the vDSO) there was no suspend. A difference of more than
// recalibrateAfter (a suspend, a step of the wall clock, or NTP slewing it
// for a few seconds) brings a new reading of CLOCK_BOOTTIME.
type system struct{}

// recalibrateAfter is how far the wall clock may move against the monotonic
// clock before system reads CLOCK_BOOTTIME again: a suspend shorter than this
// may go uncounted (it is far below any lease's drift allowance).
const recalibrateAfter = time.Millisecond

// origin is the monotonic clock's origin for System.
var origin = time.Now()

var sys = newCalibrated(func() (time.Duration, bool) {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}, func() (wall, mono time.Duration) {
	t := time.Now() // both through the vDSO
	return time.Duration(t.UnixNano()), t.Sub(origin)
})

func (system) Now() time.Duration { return sys.now() }

// read is Read for System: its reading derived from the same time.Now.
func (system) read() (time.Time, time.Duration) {
	t := time.Now()
	return t, sys.nowFrom(time.Duration(t.UnixNano()), t.Sub(origin))
}

// SuspendAware reports whether System counts a suspend.
func SuspendAware() bool { return sys.boottime }

// calibrated is system's clock, with its sources injectable for tests.
type calibrated struct {
	boot     func() (time.Duration, bool)      // CLOCK_BOOTTIME
	clocks   func() (wall, mono time.Duration) // one time.Now: the wall clock, and the monotonic clock since origin
	boottime bool                              // boot is readable
	cal      atomic.Pointer[calibration]
}

// calibration is what one reading of CLOCK_BOOTTIME established.
type calibration struct {
	wallLessMono time.Duration // the wall clock less the monotonic one, then
	suspended    time.Duration // CLOCK_BOOTTIME less the monotonic clock (since origin): never decreases
}

func newCalibrated(boot func() (time.Duration, bool), clocks func() (wall, mono time.Duration)) *calibrated {
	c := &calibrated{boot: boot, clocks: clocks}
	_, c.boottime = boot()
	if c.boottime {
		wall, mono := clocks()
		c.recalibrate(wall-mono, 0)
	}
	return c
}

// now returns the monotonic clock since origin plus the time suspended.
func (c *calibrated) now() time.Duration {
	wall, mono := c.clocks()
	return c.nowFrom(wall, mono)
}

// nowFrom is now, from a reading of the wall and monotonic clocks (as
// c.clocks returns them).
func (c *calibrated) nowFrom(wall, mono time.Duration) time.Duration {
	if !c.boottime {
		return mono
	}
	cal := c.cal.Load()
	if d := wall - mono - cal.wallLessMono; d > recalibrateAfter || d < -recalibrateAfter {
		cal = c.recalibrate(wall-mono, cal.suspended)
	}
	return mono + cal.suspended
}

// recalibrate reads CLOCK_BOOTTIME; wallLessMono is the difference of the
// two clocks read just before, floor the time suspended known so far.
func (c *calibrated) recalibrate(wallLessMono, floor time.Duration) *calibration {
	boot, ok := c.boot()
	_, after := c.clocks()
	cal := &calibration{wallLessMono: wallLessMono, suspended: floor}
	// boot was read at a monotonic instant at or before after: boot - after
	// is at most the time suspended, so a reading is never ahead of
	// CLOCK_BOOTTIME; and it never goes back below floor.
	if ok {
		cal.suspended = max(floor, boot-after)
	}
	for { // a concurrent recalibration may have stored a later reading
		old := c.cal.Load()
		if old != nil && old.suspended > cal.suspended {
			cal.suspended = old.suspended
		}
		if c.cal.CompareAndSwap(old, cal) {
			return cal
		}
	}
}
