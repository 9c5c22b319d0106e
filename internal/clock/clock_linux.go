package clock

import (
	"time"

	"golang.org/x/sys/unix"
)

type system struct{}

// boottime is decided once, at start-up, so that readings never switch
// between two clocks: CLOCK_BOOTTIME exists since Linux 2.6.39, but a seccomp
// filter may forbid it, and then the monotonic clock is used for the life of
// the process.
var boottime, shift = func() (bool, time.Duration) {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return false, 0
	}
	return true, time.Duration(ts.Nano()) - monotonic()
}()

// Now reads CLOCK_BOOTTIME (or, where it cannot be read, the monotonic clock).
func (system) Now() time.Duration {
	if !boottime {
		return monotonic()
	}
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		// Readable at start-up but not now (cannot happen on a sane kernel):
		// stay on the same scale, without counting suspends from here on.
		return monotonic() + shift
	}
	return time.Duration(ts.Nano())
}

// SuspendAware reports whether System counts time the host spends suspended.
func SuspendAware() bool { return boottime }
